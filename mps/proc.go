package mps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/procstat"
)

// Files the control daemon keeps in its pipe directory.
const (
	pidFileName  = "nvidia-cuda-mps-control.pid" // 550+ only
	lockFileName = "control_lock"
	controlLog   = "control.log"
	serverLog    = "server.log"
)

// staleFiles are removed by Start when no verified daemon owns the pipe
// directory. control_lock goes too: a process that took its lock on a dead
// daemon's file (any local user can open it) then holds a lock on a file
// the new daemon no longer uses.
var staleFiles = []string{pidFileName, "control", "control_privileged", "log", lockFileName}

// procStat is the part of /proc/<pid>/stat this package reads.
type procStat struct {
	comm     string
	state    byte
	ppid     int
	exitCode int // raw wait status; meaningful only for a zombie
	// startTime is field 22: when the process started, in clock ticks
	// since boot; hasStart is false for a line too short to carry it.
	startTime uint64
	hasStart  bool
}

// readProcStat reads /proc/<pid>/stat under procRoot.
func readProcStat(procRoot string, pid int) (procStat, error) {
	st, err := procstat.Read(procRoot, pid)
	return fromStat(st), err
}

// parseProcStat parses a /proc/<pid>/stat line (procstat.Parse).
func parseProcStat(s string) (procStat, error) {
	st, err := procstat.Parse(s)
	return fromStat(st), err
}

func fromStat(st procstat.Stat) procStat {
	if st == (procstat.Stat{}) {
		return procStat{}
	}
	return procStat{comm: st.Comm, state: st.State, ppid: st.PPID, exitCode: st.ExitCode, startTime: st.StartTime, hasStart: st.HasStart}
}

// lockHolder returns the pid holding a POSIX write-conflicting lock on
// control_lock, 0 when nobody holds one (or the file is missing). Every
// generation and the emulator take a whole-file write lock on it for the
// daemon's life; who holds it is only a candidate, checked by the caller.
func lockHolder(pipeDir string) (int, error) {
	f, err := os.OpenFile(filepath.Join(pipeDir, lockFileName), os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, localResources(fmt.Errorf("open lock file: %w", err))
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

// PIDFD_GET_INFO (Linux 6.15) with PIDFD_INFO_EXIT: the wait status of
// a process already reaped, read through a pidfd held on it.
const (
	pidfdInfoExit = 1 << 3
	// _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info of 64 bytes)
	pidfdGetInfo = 0xC040FF0B
)

// pidfdInfo is struct pidfd_info, PIDFD_INFO_SIZE_VER0.
type pidfdInfo struct {
	mask     uint64
	cgroupID uint64
	ids      [11]uint32 // pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid
	exitCode int32
}

// pidfdExit returns the raw wait status of the process behind pidfd fd
// once its parent has reaped it; ok is false before that, and on kernels
// without PIDFD_INFO_EXIT.
func pidfdExit(fd int) (ws int, ok bool) {
	info := pidfdInfo{mask: pidfdInfoExit}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), pidfdGetInfo, uintptr(unsafe.Pointer(&info))); errno != 0 {
		return 0, false
	}
	if info.mask&pidfdInfoExit == 0 {
		return 0, false
	}
	return int(info.exitCode), true
}
