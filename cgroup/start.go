package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Starting a process inside a lease.
//
// Attaching a pid after cmd.Start is racy: the new program may fork before
// the write to cgroup.procs, and its child stays outside. Start closes that
// race with two kernel mechanisms:
//
//   - On the unified tree (v2 and hybrid) the child is cloned directly into
//     the lease with clone3(CLONE_INTO_CGROUP), through
//     SysProcAttr.UseCgroupFD and a descriptor of the lease directory.
//     Needs Linux 5.7; on older kernels the unified tree is attached to like
//     the v1 hierarchies below.
//   - v1 hierarchies have no such clone flag, so on v1 and hybrid the child is
//     started with SysProcAttr.Ptrace: it stops with SIGTRAP right after its
//     execve, before the program's first instruction, is attached to every
//     v1 controller while stopped, then detached and let run. Nothing of the
//     program has run before it is inside all its cgroups. The cost: ptrace
//     must be allowed (not blocked by seccomp or Yama ptrace_scope 3), the
//     ptrace calls must come from the thread that forked the child, so the
//     start runs on a locked OS thread, and cmd must not be traced by anyone
//     else.
//
// The window in which a signal reaches the child before its execve is passed
// on to it unchanged.

// Start implements Lease.
func (l *lease) Start(cmd *exec.Cmd) error {
	if cmd == nil || cmd.Process != nil {
		return fmt.Errorf("%w: nil or already started", ErrInvalidCmd)
	}
	attr := cmd.SysProcAttr
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	if attr.Ptrace || attr.UseCgroupFD {
		return fmt.Errorf("%w: SysProcAttr.Ptrace and UseCgroupFD are set by Start", ErrInvalidCmd)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m.v2 != nil && l.m.cloneInto {
		dir := l.m.v2.dir(l.rel)
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("cgroup: unified: start %s in %s: %w: %w", cmd.Path, dir, ErrNotExist, err)
			}
			return fmt.Errorf("cgroup: unified: start %s in %s: open: %w", cmd.Path, dir, err)
		}
		defer unix.Close(fd)
		attr.UseCgroupFD, attr.CgroupFD = true, fd
	}
	cmd.SysProcAttr = attr
	if l.m.v1 == nil && l.m.cloneInto {
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("cgroup: unified: start %s in %s: %w", cmd.Path, l.m.v2.dir(l.rel), err)
		}
		return nil
	}
	attach := func(pid int) error {
		if l.m.v1 != nil {
			if err := l.m.v1.attach(l.rel, pid); err != nil {
				return err
			}
		}
		if l.m.v2 != nil && !l.m.cloneInto {
			return writeProcs("unified", l.m.v2.dir(l.rel), pid)
		}
		return nil
	}
	if err := startTraced(cmd, attach); err != nil {
		return fmt.Errorf("cgroup: start %s in %s: %w", cmd.Path, l.rel, err)
	}
	return nil
}

// kernelHasCloneIntoCgroup reports whether the running kernel is 5.7 or
// newer, the first with CLONE_INTO_CGROUP. Go's exec does not fall back when
// clone3 rejects the flag, and a failed exec.Cmd.Start cannot be retried,
// so the choice is made up front. An unreadable release takes the safe path.
func kernelHasCloneIntoCgroup() bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	major, minor, ok := parseKernelRelease(unix.ByteSliceToString(u.Release[:]))
	return ok && (major > 5 || (major == 5 && minor >= 7))
}

// startTraced starts cmd stopped at its execve, runs attach on it and lets
// it go. On error the child is killed (unless it has ended already) and
// reaped.
func startTraced(cmd *exec.Cmd, attach func(pid int) error) error {
	errc := make(chan error, 1)
	go func() {
		// The tracer is the thread that forked the child; every ptrace
		// request must come from it.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		errc <- startStopped(cmd, attach)
	}()
	return <-errc
}

// testHookTracedStarted, set by tests only, runs between the start of a
// traced child and the wait for its exec stop.
var testHookTracedStarted func(p *os.Process)

// killTracee kills a traced child that startStopped gives up on, through
// os.Process (a pidfd where the kernel has them); a variable so that a
// test can count the kills.
var killTracee = (*os.Process).Kill

// startStopped is startTraced on the locked thread. Only cmd.Wait reaps
// the child (waitExecStop never does), so until then its pid cannot be
// free for reuse: every ptrace request made with it reaches the child, and
// cmd.Wait, which on kernels without pidfds waits for the pid number,
// cannot wait for another process.
func startStopped(cmd *exec.Cmd, attach func(pid int) error) error {
	cmd.SysProcAttr.Ptrace = true
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	abort := func(err error) error {
		_ = killTracee(cmd.Process)
		_ = unix.PtraceDetach(pid)
		_ = cmd.Wait()
		return err
	}
	if testHookTracedStarted != nil {
		testHookTracedStarted(cmd.Process)
	}
	ended, err := waitExecStop(pid)
	if ended {
		// Killed before its exec stop (SIGKILL ends a ptrace stop too):
		// nothing is left to signal, and cmd.Wait reaps it, releases its
		// pipes and says how it ended.
		_ = cmd.Wait()
		return fmt.Errorf("%w: %d ended before it could be attached (%v)", ErrNoProcess, pid, cmd.ProcessState)
	}
	if err != nil {
		return abort(err)
	}
	if err := attach(pid); err != nil {
		return abort(err)
	}
	if err := unix.PtraceDetach(pid); err != nil {
		return abort(fmt.Errorf("ptrace detach %d: %w", pid, err))
	}
	return nil
}

// si_code values of a SIGCHLD siginfo (asm-generic/siginfo.h), which
// golang.org/x/sys/unix does not define.
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// waitExecStop waits for the SIGTRAP stop the kernel gives a PTRACE_TRACEME
// child after a successful execve. Other signal stops before it are passed
// on to the child. It never reaps the child: an exit is only looked at
// (WNOWAIT) and reported as ended, for cmd.Wait to collect, and a stop is
// taken by a waitid that asks for stops alone. wait4, which always takes
// exits too, could reap a child killed between the two.
func waitExecStop(pid int) (ended bool, err error) {
	for {
		var info unix.Siginfo
		if err := waitid(pid, &info, unix.WEXITED|unix.WSTOPPED|unix.WNOWAIT); err != nil {
			return false, fmt.Errorf("wait for exec stop of %d: %w", pid, err)
		}
		switch info.Code {
		case cldExited, cldKilled, cldDumped:
			return true, nil
		}
		info = unix.Siginfo{}
		if err := waitid(pid, &info, unix.WSTOPPED|unix.WNOHANG); err != nil {
			return false, fmt.Errorf("wait for exec stop of %d: %w", pid, err)
		}
		if info.Signo == 0 {
			// The stop is gone: the child was killed since it was seen.
			continue
		}
		sig := unix.Signal(sigchldStatus(&info))
		if sig == unix.SIGTRAP {
			return false, nil
		}
		if err := unix.PtraceCont(pid, int(sig)); err != nil {
			return false, fmt.Errorf("ptrace cont %d: %w", pid, err)
		}
	}
}

// waitid is waitid(2) on one child, traced or not, retried on EINTR.
func waitid(pid int, info *unix.Siginfo, options int) error {
	for {
		err := unix.Waitid(unix.P_PID, pid, info, options|unix.WALL, nil)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// sigchldStatus is si_status of a siginfo that waitid filled in (for a
// stop, the stop signal), which unix.Siginfo does not name: after
// si_signo, si_errno and si_code comes a union aligned like a pointer,
// whose member for SIGCHLD is si_pid, si_uid, si_status.
func sigchldStatus(info *unix.Siginfo) int {
	type sigchld struct {
		_      [3]int32
		_      [0]uintptr
		_      [2]int32
		status int32
	}
	return int((*sigchld)(unsafe.Pointer(info)).status)
}
