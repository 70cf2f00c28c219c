package mps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Files the control daemon keeps in its pipe directory.
const (
	pidFileName  = "nvidia-cuda-mps-control.pid" // 550+ only
	lockFileName = "control_lock"
	controlLog   = "control.log"
	serverLog    = "server.log"
)

// staleFiles are removed by Start when no live daemon owns the pipe directory.
var staleFiles = []string{pidFileName, "control", "control_privileged", "log"}

// procStat is the part of /proc/<pid>/stat this package reads.
type procStat struct {
	comm     string
	state    byte
	ppid     int
	exitCode int // raw wait status; meaningful only for a zombie
}

// readProcStat reads /proc/<pid>/stat under procRoot.
func readProcStat(procRoot string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(b))
}

// parseProcStat parses a /proc/<pid>/stat line. comm may contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseProcStat(s string) (procStat, error) {
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return procStat{}, fmt.Errorf("proc stat %q: no comm", s)
	}
	f := strings.Fields(s[closing+1:])
	// f[0] is field 3 (state); exit_code is field 52 (Linux 3.5+).
	if len(f) < 2 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("proc stat %q: too short", s)
	}
	st := procStat{comm: s[open+1 : closing], state: f[0][0], exitCode: -1}
	var err error
	if st.ppid, err = strconv.Atoi(f[1]); err != nil {
		return procStat{}, fmt.Errorf("proc stat ppid %q: %w", f[1], err)
	}
	if len(f) >= 50 {
		if n, err := strconv.Atoi(f[49]); err == nil {
			st.exitCode = n
		}
	}
	return st, nil
}

// running reports whether pid is a live, not yet exited process. A zombie
// counts as gone: our container's init may never reap the daemon.
func running(procRoot string, pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := readProcStat(procRoot, pid)
	return err == nil && st.state != 'Z' && st.state != 'X'
}

// isControl reports whether pid runs the control program at controlPath:
// same executable file, or the same (15-byte truncated) command name, which
// also holds for an emulator installed under the real name.
func isControl(procRoot string, pid int, controlPath string) bool {
	st, err := readProcStat(procRoot, pid)
	if err != nil || st.state == 'Z' || st.state == 'X' {
		return false
	}
	if exe, err := os.Stat(filepath.Join(procRoot, strconv.Itoa(pid), "exe")); err == nil {
		if want, err := os.Stat(controlPath); err == nil && os.SameFile(exe, want) {
			return true
		}
	}
	base := filepath.Base(controlPath)
	if len(base) > 15 {
		base = base[:15]
	}
	return st.comm == base
}

// lockHolder returns the pid holding the daemon's POSIX lock on control_lock,
// 0 when nobody holds it. Every generation takes that lock, so it finds a 535
// daemon (no pid file) and proves a pid file is not stale.
func lockHolder(pipeDir string) (int, error) {
	f, err := os.OpenFile(filepath.Join(pipeDir, lockFileName), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open lock file: %w", err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil {
		return 0, fmt.Errorf("F_GETLK %s: %w", f.Name(), err)
	}
	if lk.Type == unix.F_UNLCK || lk.Pid <= 0 {
		return 0, nil
	}
	return int(lk.Pid), nil
}

// findDaemon returns the pid of the live daemon owning pipeDir and how it was
// found, or 0. Order: pid file (550+), lock holder (all), control.log's
// "Starting control daemon" line (last resort, e.g. lock files on a
// filesystem without POSIX locks).
func findDaemon(procRoot, pipeDir, logDir, controlPath string) (int, string) {
	if b, err := os.ReadFile(filepath.Join(pipeDir, pidFileName)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && isControl(procRoot, pid, controlPath) {
			return pid, "pid file"
		}
	}
	if pid, err := lockHolder(pipeDir); err == nil && pid > 0 && running(procRoot, pid) {
		return pid, "control_lock"
	}
	if b, err := os.ReadFile(filepath.Join(logDir, controlLog)); err == nil {
		if pid := daemonPIDFromLog(string(b)); pid > 0 && isControl(procRoot, pid, controlPath) {
			return pid, "control.log"
		}
	}
	return 0, ""
}

// exitFromWaitStatus decodes a raw wait status (from /proc/<pid>/stat).
func exitFromWaitStatus(ws int) (status int, sig syscall.Signal) {
	if ws < 0 {
		return -1, 0
	}
	w := syscall.WaitStatus(ws)
	switch {
	case w.Exited():
		return w.ExitStatus(), 0
	case w.Signaled():
		return -1, w.Signal()
	}
	return -1, 0
}
