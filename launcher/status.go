package launcher

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// statusLine is the live one-line queue status on a terminal: each update
// rewrites the line in place (carriage return, erase to end of line), and
// clear leaves the terminal as it was. When off (not a terminal, --quiet)
// it writes nothing at all.
type statusLine struct {
	w     io.Writer
	on    bool
	shown bool
}

// update shows the queue position, group, what the lease waits for (when
// mpsd says) and time waited.
func (s *statusLine) update(position int, group, reason string, waited time.Duration) {
	if !s.on {
		return
	}
	in := ""
	if group != "" {
		in = " in group " + group
	}
	if reason != "" {
		in += " (" + reason + ")"
	}
	fmt.Fprintf(s.w, "\rmps-launch: queued, position %d%s, waited %s\x1b[K", position, in, waited.Truncate(time.Second))
	s.shown = true
}

// clear erases the status line if one is shown.
func (s *statusLine) clear() {
	if s.shown {
		fmt.Fprint(s.w, "\r\x1b[K")
		s.shown = false
	}
}
