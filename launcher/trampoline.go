package launcher

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The trampoline is how the user's program starts inside the lease's
// cgroup although mps-launch cannot write to cgroupfs: mps-launch starts
// its own binary again in trampoline mode (selected by trampolineEnv),
// which blocks on a pipe; mps-launch has mpsd attach that pid to the
// lease's cgroup, then writes one byte; only then does the trampoline
// exec the program, which so runs in the cgroup from its first
// instruction. If mps-launch closes the pipe without the byte (mpsd
// refused the attach, mps-launch died) the program never runs.
//
// The trampoline process gets argv ["mps-launch", path, argv0, argv1, ...]
// (the resolved program, then its argv) and an environment of just
// trampolineEnv, so that it can be started before the lease is granted:
// its own start then overlaps the request to mpsd instead of adding to
// it. The release message is releaseByte followed by the command's
// environment, each entry NUL-terminated, then the end of the pipe. When
// the trampoline cannot run the program it exits without running it:
// ExitFailure when mps-launch gave up (mps-launch reports why),
// ExitNotFound or ExitNotExecutable with one line on stderr when exec
// failed. Until the release message it ignores the forwarded signals: a
// terminal's signal to the process group while the request is queued is
// mps-launch's to act on (it abandons the request or ignores the signal),
// and must not kill the trampoline. mps-launch forwards signals only
// after the release, so the only ones lost are those in the microseconds
// between the release and the trampoline restoring the dispositions the
// process started with. With cgo (the project's build) a C
// constructor does all this before the Go runtime starts, so the
// trampoline costs little more than an exec; without cgo, Main does it in
// Go (trampoline_nocgo.go).
const (
	trampolineEnv = "MPSD_LAUNCH_TRAMPOLINE"
	// trampolineFD is the pipe's read end in the trampoline:
	// exec.Cmd.ExtraFiles[0].
	trampolineFD = 3
	releaseByte  = 'x'
)

// forwarded are the signals mps-launch passes on to the command.
var forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2,
}

// isTrampoline reports whether environ selects trampoline mode.
func isTrampoline(environ []string) bool {
	return getenv(environ, trampolineEnv) != ""
}

// child is the command's process: first the blocked trampoline, then,
// after release, the user's program in the same pid. Its methods belong to
// one goroutine (the session's); exited is closed from the child's own
// waiter goroutine.
type child struct {
	pid     int
	release *os.File // write end of the trampoline's pipe; nil once used
	// exited is closed when the process has ended; it is not reaped until
	// reap, so until then its pid cannot be reused and signal cannot hit
	// another process.
	exited chan struct{}
	reaped bool
	status syscall.WaitStatus
}

// startChild starts the trampoline for path and argv with the given
// standard files (passed as they are: the command inherits the fds; nil
// means /dev/null).
//
// It forks with syscall.ForkExec rather than os/exec: os/exec's first
// start forks a throwaway process to probe pidfd support, a cost on every
// launch's critical path, and its pidfd guards against pid reuse that the
// exited/reap split already rules out.
func startChild(self, path string, argv []string, stdin, stdout, stderr *os.File) (*child, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("launcher: release pipe for %s: %w", path, err)
	}
	defer r.Close() // the trampoline holds its own copy
	files := []uintptr{0, 0, 0, r.Fd()}
	for i, f := range []*os.File{stdin, stdout, stderr} {
		if f == nil {
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				_ = w.Close()
				return nil, fmt.Errorf("launcher: open %s: %w", os.DevNull, err)
			}
			defer null.Close()
			f = null
		}
		files[i] = f.Fd()
	}
	pid, err := syscall.ForkExec(self, append([]string{"mps-launch", path}, argv...), &syscall.ProcAttr{
		Env:   []string{trampolineEnv + "=1"},
		Files: files,
	})
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("launcher: start %s through %s: %w", path, self, err)
	}
	c := &child{pid: pid, release: w, exited: make(chan struct{})}
	go func() {
		defer close(c.exited)
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, syscall.EINTR) {
				return
			}
		}
	}()
	return c, nil
}

// reap collects the ended process's status; call it after exited is
// closed.
func (c *child) reap() syscall.WaitStatus {
	if !c.reaped {
		for {
			_, err := syscall.Wait4(c.pid, &c.status, 0, nil)
			if !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		c.reaped = true
	}
	return c.status
}

// kill ends the process with SIGKILL, waits for it and reaps it.
func (c *child) kill() syscall.WaitStatus {
	c.abandon()
	c.signal(syscall.SIGKILL)
	<-c.exited
	return c.reap()
}

// start lets the trampoline exec the program with env. Entries holding a
// NUL cannot be passed to a program and are left out.
func (c *child) start(env []string) error {
	defer c.abandon()
	n := 1
	for _, kv := range env {
		n += len(kv) + 1
	}
	msg := make([]byte, 1, n)
	msg[0] = releaseByte
	for _, kv := range env {
		if kv != "" && strings.IndexByte(kv, 0) < 0 {
			msg = append(append(msg, kv...), 0)
		}
	}
	if _, err := c.release.Write(msg); err != nil {
		return fmt.Errorf("launcher: release pid %d: %w", c.pid, err)
	}
	return nil
}

// abandon closes the release pipe unused, so a trampoline still waiting
// exits without running the program.
func (c *child) abandon() {
	if c.release != nil {
		_ = c.release.Close()
		c.release = nil
	}
}

// signal sends sig to the process unless it is reaped; a process that has
// ended but is not reaped takes it harmlessly.
func (c *child) signal(sig os.Signal) {
	if n, ok := sig.(syscall.Signal); ok && !c.reaped {
		_ = syscall.Kill(c.pid, n)
	}
}
