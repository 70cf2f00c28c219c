package mps

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DaemonIdentity names one control daemon process for good: its pid and
// its start time (field 22 of /proc/<pid>/stat, clock ticks since boot),
// which together are never reused while the host runs.
type DaemonIdentity struct {
	PID       int
	StartTime uint64
}

func (id DaemonIdentity) String() string {
	return fmt.Sprintf("pid %d started at tick %d", id.PID, id.StartTime)
}

// serverProgram is the base name of the executable every MPS server runs
// (NVIDIA's and the emulator's).
const serverProgram = "nvidia-cuda-mps-server"

// errProcGone: the process exited (or never existed) before it could be
// verified.
var errProcGone = errors.New("process gone")

// localResources wraps err with ErrLocalResources when it says this
// process ran out of something of its own (file descriptors, memory,
// processes): such a failure says nothing about MPS.
func localResources(err error) error {
	if err == nil || errors.Is(err, ErrLocalResources) {
		return err
	}
	for _, e := range []syscall.Errno{unix.EMFILE, unix.ENFILE, unix.EAGAIN, unix.ENOMEM} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: %w", ErrLocalResources, err)
		}
	}
	return err
}

// procInfo is what was read of a process through /proc while its pidfd
// was held.
type procInfo struct {
	stat procStat
	exe  string      // /proc/<pid>/exe's target, " (deleted)" cut; "" unreadable
	file os.FileInfo // the executable itself; nil unreadable
	uid  int         // real uid; -1 unknown
}

// pidfdExited reports whether the process behind fd has exited.
func pidfdExited(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || (n > 0 && fds[0].Revents != 0)
	}
}

// openPidfd opens a pidfd for pid: errProcGone when there is no such
// process, ErrLocalResources when this process is out of descriptors.
func openPidfd(pid int) (int, error) {
	if pid <= 0 {
		return -1, fmt.Errorf("pid %d: %w", pid, errProcGone)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return -1, fmt.Errorf("pid %d: %w", pid, errProcGone)
	}
	if err != nil {
		return -1, localResources(fmt.Errorf("pidfd_open %d: %w", pid, err))
	}
	return fd, nil
}

// readVerified reads pid's /proc entries and then checks that the pidfd
// (opened before) has not signalled exit, so that what was read belongs
// to the process the pidfd holds and not to a successor on a recycled pid.
func readVerified(procRoot string, pid, fd int) (procInfo, error) {
	info := procInfo{uid: -1}
	st, err := readProcStat(procRoot, pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return info, fmt.Errorf("pid %d: %w", pid, errProcGone)
		}
		return info, localResources(fmt.Errorf("pid %d: %w", pid, err))
	}
	info.stat = st
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if t, err := os.Readlink(filepath.Join(dir, "exe")); err == nil {
		info.exe = strings.TrimSuffix(t, " (deleted)")
	}
	if fi, err := os.Stat(filepath.Join(dir, "exe")); err == nil {
		info.file = fi
	}
	uid, err := procUID(procRoot, pid)
	if errors.Is(err, ErrLocalResources) {
		// Not read for want of a descriptor, say: the process is not
		// unverified for that, and must not be taken for a stranger.
		return info, fmt.Errorf("pid %d: %w", pid, err)
	}
	info.uid = uid
	if pidfdExited(fd) || st.state == 'Z' || st.state == 'X' {
		return info, fmt.Errorf("pid %d: %w", pid, errProcGone)
	}
	return info, nil
}

// daemonUID is the real uid a control daemon of this process runs as: mpsd
// starts them as root; a non-root caller, as itself.
func daemonUID() int {
	if os.Geteuid() == 0 {
		return 0
	}
	return os.Geteuid()
}

// verifyDaemon checks through a pidfd that pid is a control daemon this
// package may own: it runs cfg.ControlPath (the same file), as daemonUID,
// and is alive. It returns the open pidfd (the caller owns it) and the
// daemon's identity. A failed check wraps ErrUnverifiedDaemon and says
// what differed.
func verifyDaemon(cfg Config, pid int) (int, DaemonIdentity, error) {
	fd, err := openPidfd(pid)
	if err != nil {
		return -1, DaemonIdentity{}, err
	}
	info, err := readVerified(cfg.ProcRoot, pid, fd)
	if err == nil {
		err = checkDaemon(cfg, pid, info)
	}
	if err != nil {
		unix.Close(fd)
		return -1, DaemonIdentity{}, err
	}
	return fd, DaemonIdentity{PID: pid, StartTime: info.stat.startTime}, nil
}

// checkDaemon: the uid decides whether the holder is a daemon at all (a
// tenant can take the lock of a dead daemon's file, never run a process
// as root). A process of daemonUID is a control daemon if it runs the
// control program: the configured file, or one of its name, which covers
// a wrapper that execs the binary and a daemon still running a binary
// replaced by an upgrade ("(deleted)"). A process of daemonUID running
// anything else holds the lock for a reason mpsd cannot know: that is
// ErrForeignLockHolder (Start refuses, rather than take its files as stale).
func checkDaemon(cfg Config, pid int, info procInfo) error {
	if u := daemonUID(); info.uid != u {
		return fmt.Errorf("%w: pid %d runs as uid %d, not %d", ErrUnverifiedDaemon, pid, info.uid, u)
	}
	if !info.stat.hasStart {
		return fmt.Errorf("%w: pid %d: no start time in /proc", ErrUnverifiedDaemon, pid)
	}
	if want, err := os.Stat(cfg.ControlPath); err == nil && info.file != nil && os.SameFile(info.file, want) {
		return nil
	}
	if info.exe != "" && filepath.Base(info.exe) == filepath.Base(DefaultControl) {
		return nil
	}
	return fmt.Errorf("%w: pid %d, uid %d, holds %s but runs %q, not the control program %s; stop it, or remove the pipe directory's files by hand",
		ErrForeignLockHolder, pid, info.uid, lockFileName, info.exe, cfg.ControlPath)
}

// lockedDaemon finds the daemon owning cfg.PipeDir: the holder of the
// POSIX lock on control_lock, verified by verifyDaemon and, when expect is
// set, that exact process. The pid file is compared only (a mismatch is
// logged): any local user can write it. It returns the open pidfd (the
// caller owns it), the identity, and the lock holder's pid (0: none).
// Errors wrap ErrNoDaemon (nobody holds the lock) or ErrNoDaemon and
// ErrUnverifiedDaemon (the holder is no verified daemon, or not expect),
// or ErrLocalResources.
func lockedDaemon(cfg Config, expect *DaemonIdentity) (int, DaemonIdentity, int, error) {
	holder, err := lockHolder(cfg.PipeDir)
	if err != nil {
		return -1, DaemonIdentity{}, 0, fmt.Errorf("mps: %s: %w", cfg.PipeDir, err)
	}
	if holder == 0 {
		return -1, DaemonIdentity{}, 0, fmt.Errorf("mps: %s: nobody holds %s: %w", cfg.PipeDir, lockFileName, ErrNoDaemon)
	}
	fd, id, err := verifyDaemon(cfg, holder)
	if errors.Is(err, errProcGone) {
		return -1, DaemonIdentity{}, 0, fmt.Errorf("mps: %s: lock holder %w: %w", cfg.PipeDir, err, ErrNoDaemon)
	}
	if err != nil {
		if !errors.Is(err, ErrUnverifiedDaemon) {
			return -1, DaemonIdentity{}, holder, fmt.Errorf("mps: %s: verify lock holder: %w", cfg.PipeDir, err)
		}
		return -1, DaemonIdentity{}, holder, fmt.Errorf("mps: %s: %w: %w", cfg.PipeDir, ErrNoDaemon, err)
	}
	if expect != nil && id != *expect {
		unix.Close(fd)
		var why []string
		if id.PID != expect.PID {
			why = append(why, fmt.Sprintf("pid %d, expected %d", id.PID, expect.PID))
		}
		if id.StartTime != expect.StartTime {
			why = append(why, fmt.Sprintf("start time %d, expected %d", id.StartTime, expect.StartTime))
		}
		return -1, DaemonIdentity{}, holder, fmt.Errorf("mps: %s: %w: %w: the daemon holding %s is not the expected one (%s)",
			cfg.PipeDir, ErrNoDaemon, ErrUnverifiedDaemon, lockFileName, strings.Join(why, ", "))
	}
	if b, err := readSmall(filepath.Join(cfg.PipeDir, pidFileName), 32); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || p != id.PID {
			cfg.Logger.Warn("mps: pid file does not name the daemon holding control_lock; ignored (any local user can write it)",
				"pipe_dir", cfg.PipeDir, "pid_file", strings.TrimSpace(string(b[:min(len(b), 32)])), "daemon_pid", id.PID)
		}
	}
	return fd, id, holder, nil
}

// verifyServer checks through a pidfd that pid is a server of daemon d:
// child of the daemon, running nvidia-cuda-mps-server, started no earlier
// than the daemon, alive. A child the daemon has forked but not yet exec'd
// (it still runs the control program) is looked at again, briefly. It
// returns the open pidfd (the caller owns it) and the server's real uid.
func (d *Daemon) verifyServer(pid int) (int, int, error) {
	fd, err := openPidfd(pid)
	if err != nil {
		return -1, -1, err
	}
	deadline := time.Now().Add(serverExecWait)
	for {
		info, err := readVerified(d.cfg.ProcRoot, pid, fd)
		if err == nil {
			err = d.checkServer(pid, info)
		}
		if err == nil {
			return fd, info.uid, nil
		}
		if !errors.Is(err, errNotYetExec) || time.Now().After(deadline) {
			unix.Close(fd)
			return -1, -1, err
		}
		// Wait a moment, or for the exit.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		_, _ = unix.Poll(fds, 5)
	}
}

// serverExecWait bounds how long a forked child of the daemon may take
// to exec the server program.
const serverExecWait = 2 * time.Second

var errNotYetExec = errors.New("the daemon's child has not exec'd the server yet")

func (d *Daemon) checkServer(pid int, info procInfo) error {
	if info.stat.ppid != d.pid {
		return fmt.Errorf("pid %d is not a child of the daemon %d (parent %d)", pid, d.pid, info.stat.ppid)
	}
	if !info.stat.hasStart || info.stat.startTime < d.id.StartTime {
		return fmt.Errorf("pid %d started before the daemon", pid)
	}
	if base := filepath.Base(info.exe); base != serverProgram {
		if base == filepath.Base(d.cfg.ControlPath) {
			return fmt.Errorf("pid %d: %w", pid, errNotYetExec)
		}
		return fmt.Errorf("pid %d runs %q, not %s", pid, info.exe, serverProgram)
	}
	return nil
}

// readSmall reads at most max bytes of a file anyone may have written
// (the pid file is 0666): no link followed, no FIFO waited on, no
// gigabyte read.
func readSmall(path string, max int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	b := make([]byte, max)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}
