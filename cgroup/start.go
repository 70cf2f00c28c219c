package cgroup

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"

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
// it go. On error the child is killed and reaped.
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

func startStopped(cmd *exec.Cmd, attach func(pid int) error) error {
	cmd.SysProcAttr.Ptrace = true
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	abort := func(err error) error {
		_ = unix.Kill(pid, unix.SIGKILL)
		_ = unix.PtraceDetach(pid)
		_ = cmd.Wait()
		return err
	}
	if err := waitExecStop(pid); err != nil {
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

// waitExecStop waits for the SIGTRAP stop the kernel gives a PTRACE_TRACEME
// child after a successful execve. Other signal stops before it are passed
// on to the child.
func waitExecStop(pid int) error {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for exec stop of %d: %w", pid, err)
		}
		switch {
		case ws.Exited(), ws.Signaled():
			return fmt.Errorf("%w: %d ended before it could be attached (%v)", ErrNoProcess, pid, waitStatusString(ws))
		case ws.Stopped() && ws.StopSignal() == unix.SIGTRAP:
			return nil
		case ws.Stopped():
			if err := unix.PtraceCont(pid, int(ws.StopSignal())); err != nil {
				return fmt.Errorf("ptrace cont %d: %w", pid, err)
			}
		}
	}
}

func waitStatusString(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}
