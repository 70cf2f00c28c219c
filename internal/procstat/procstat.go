// Package procstat reads /proc/<pid>/stat, the one parser of it for mpsd's
// packages: the command name (field 2) may hold spaces and parentheses, so
// fields are counted after its last ')'.
package procstat

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stat is the part of /proc/<pid>/stat mpsd reads.
type Stat struct {
	Comm  string
	State byte // field 3: 'R', 'S', 'Z' (a zombie), 'X' (dead), ...
	PPID  int
	// StartTime is field 22: when the process started, in clock ticks
	// since boot; HasStart is false for a line too short to carry it.
	StartTime uint64
	HasStart  bool
	// ExitCode is field 52, the raw wait status (meaningful only for a
	// zombie); -1 when the line does not carry it.
	ExitCode int
}

// Exited reports whether the process has exited: a zombie, or dead.
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// Read reads /proc/<pid>/stat under procRoot.
func Read(procRoot string, pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	return Parse(string(b))
}

// Parse parses a /proc/<pid>/stat line.
func Parse(s string) (Stat, error) {
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return Stat{}, fmt.Errorf("proc stat %q: no comm", s)
	}
	f := strings.Fields(s[closing+1:])
	// f[0] is field 3 (state).
	if len(f) < 2 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("proc stat %q: too short", s)
	}
	st := Stat{Comm: s[open+1 : closing], State: f[0][0], ExitCode: -1}
	var err error
	if st.PPID, err = strconv.Atoi(f[1]); err != nil {
		return Stat{}, fmt.Errorf("proc stat ppid %q: %w", f[1], err)
	}
	// starttime is field 22, f[19].
	if len(f) >= 20 {
		if st.StartTime, err = strconv.ParseUint(f[19], 10, 64); err != nil {
			return Stat{}, fmt.Errorf("proc stat starttime %q: %w", f[19], err)
		}
		st.HasStart = true
	}
	// exit_code is field 52 (Linux 3.5+), f[49].
	if len(f) >= 50 {
		if n, err := strconv.Atoi(f[49]); err == nil {
			st.ExitCode = n
		}
	}
	return st, nil
}
