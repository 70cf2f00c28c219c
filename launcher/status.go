package launcher

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
)

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// statusLine is what mps-launch says while its request waits in the
// queue. On a terminal (live) it is one line that each update rewrites in
// place (carriage return, erase to end of line), and clear leaves the
// terminal as it was. Elsewhere (logged: a batch job's log, a pipe) it is
// a line when the wait begins, one more each time mpsd's reason for it
// changes (not for a new position: a log must stay short), and one when
// a grant ends a wait it logged, saying how long it was. With neither
// (--quiet) it writes nothing at all.
type statusLine struct {
	w      io.Writer
	live   bool
	logged bool
	// prefix starts each logged line (the session's: "mps-launch: ",
	// with the job).
	prefix string
	shown  bool
	// waiting: a logged wait's first line is out; said is the reason it
	// last gave.
	waiting bool
	said    string
}

// update shows the queue position, group, what the lease waits for (when
// mpsd says) and time waited.
func (s *statusLine) update(position int, group, reason string, waited time.Duration) {
	switch {
	case s.live:
		fmt.Fprintf(s.w, "\rmps-launch: queued, position %d%s, waited %s\x1b[K", position, queuedWhere(group, reason), waited.Truncate(time.Second))
		s.shown = true
	case s.logged && !s.waiting:
		fmt.Fprintf(s.w, "%squeued, position %d%s\n", s.prefix, position, queuedWhere(group, reason))
		s.waiting, s.said = true, reason
	case s.logged && reason != s.said:
		fmt.Fprintf(s.w, "%sstill queued, position %d%s, waited %s\n", s.prefix, position, queuedWhere(group, reason), waited.Truncate(time.Second))
		s.said = reason
	}
}

// granted ends a logged wait: lease was granted after waited. Nothing is
// said of a grant that came without a wait (or on a terminal, whose line
// clear erases).
func (s *statusLine) granted(lease *api.Lease, waited time.Duration) {
	if !s.waiting {
		return
	}
	s.waiting, s.said = false, ""
	fmt.Fprintf(s.w, "%sgranted lease %s in group %s after waiting %s\n", s.prefix, lease.ID, lease.Group, waited.Truncate(time.Second))
}

// queuedWhere is " in group G (reason)", each part only when known.
func queuedWhere(group, reason string) string {
	in := ""
	if group != "" {
		in = " in group " + group
	}
	if reason != "" {
		in += " (" + reason + ")"
	}
	return in
}

// clear erases the live status line if one is shown.
func (s *statusLine) clear() {
	if s.shown {
		fmt.Fprint(s.w, "\r\x1b[K")
		s.shown = false
	}
}
