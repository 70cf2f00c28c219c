package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
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
// trampolineEnv, whose value names the trampoline's two pipe descriptors
// ("R,E": the release pipe's read end, the exec pipe's write end), so that
// it can be started before the lease is granted: its own start then
// overlaps the request to mpsd instead of adding to it. Every other
// descriptor the trampoline has is the caller's, at its own number: the
// caller's 0, 1 and 2 (Config's Stdin, Stdout, Stderr) and whatever it
// passed down without close-on-exec (a "3<file" redirection, the listening
// sockets of a socket-activated server). The pipes sit at numbers no
// caller's descriptor has (they were opened while those were open), and
// the trampoline closes both before the exec, so the program sees exactly
// the caller's descriptors. The release message is releaseByte followed
// by the command's environment, each entry NUL-terminated, then the end
// of the pipe. When the trampoline cannot run the program it exits without
// running it: ExitFailure when mps-launch gave up (mps-launch reports
// why) or its pipes are not named, ExitNotFound or ExitNotExecutable with
// one line on stderr when exec failed. Until the release message it
// ignores the forwarded signals: a terminal's signal to the process group
// while the request is queued is mps-launch's to act on (it abandons the
// request or ignores the signal), and must not kill the trampoline. Once it has restored the dispositions
// the process started with, it says so on the exec pipe and execs; the
// release returns only when mps-launch has read that, so a signal
// forwarded after the release can never fall into the time the
// trampoline still ignores it. Main serves trampoline mode
// (trampoline_exec.go) before anything else: every binary that calls
// Main with its own environment is a trampoline when trampolineEnv is
// set.
const (
	trampolineEnv = "MPSD_LAUNCH_TRAMPOLINE"
	// releaseByte starts the release message, and is what the trampoline
	// writes to the exec pipe just before the exec (then closes it); the
	// exec pipe's end without the byte means the trampoline died first.
	releaseByte = 'x'
)

// errTrampolineGone is wrapped by a release that the trampoline did not
// take because it had died (a signal to the process group, say): it never
// ran the program, and a new one may.
var errTrampolineGone = errors.New("launcher: trampoline ended before its release")

// forwarded are the signals mps-launch passes on to the command.
var forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2,
}

// notifyForwarded relays the forwarded signals to c, except those this
// process was started ignoring (nohup's SIGHUP): they stay ignored here,
// and so in the command, which inherits the disposition through the
// trampoline, as it would from a shell.
func notifyForwarded(c chan<- os.Signal) {
	var sigs []os.Signal
	for _, s := range forwarded {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	if len(sigs) > 0 { // Notify without signals would relay them all
		signal.Notify(c, sigs...)
	}
}

// childFiles is syscall.ProcAttr.Files for a trampoline with its pipes at
// release and execDone (0, 1 and 2 are the caller's to fill in): up to
// the higher pipe, every descriptor this process holds without
// close-on-exec stays at its number, the pipes stay at theirs, and the
// rest (this process's own, close-on-exec) are closed, as the exec would
// close them anyway. Descriptors above both pipes need no entry: without
// close-on-exec they are inherited where they are.
func childFiles(release, execDone int) []uintptr {
	files := make([]uintptr, max(release, execDone)+1)
	for fd := 3; fd < len(files); fd++ {
		files[fd] = ^uintptr(0) // ForkExec closes a -1 entry
		if fd == release || fd == execDone {
			files[fd] = uintptr(fd)
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			files[fd] = uintptr(fd)
		}
	}
	return files
}

// pipeFDs is trampolineEnv's value: the two pipe descriptors.
func pipeFDs(release, execDone int) string {
	return strconv.Itoa(release) + "," + strconv.Itoa(execDone)
}

// parsePipeFDs reads trampolineEnv's value; ok is false unless it names
// two distinct descriptors above 2.
func parsePipeFDs(v string) (release, execDone int, ok bool) {
	a, b, found := strings.Cut(v, ",")
	release, err1 := strconv.Atoi(a)
	execDone, err2 := strconv.Atoi(b)
	ok = found && err1 == nil && err2 == nil && release > 2 && execDone > 2 && release != execDone
	return release, execDone, ok
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
	// execPipe is the read end of the exec pipe: a byte on it says the
	// trampoline has restored its signal dispositions and execs; its end
	// without one, that it died. nil once read.
	execPipe *os.File
	// exited is closed when the process has ended; it is not reaped until
	// reap, so until then its pid cannot be reused and signal cannot hit
	// another process.
	exited chan struct{}
	reaped bool
	status syscall.WaitStatus
}

// startChild starts the trampoline for path and argv with the given
// standard files (passed as they are: the command inherits the fds; nil
// means /dev/null) and every descriptor this process holds without
// close-on-exec at its own number (see trampolineEnv).
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
	er, ew, err := os.Pipe()
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("launcher: exec pipe for %s: %w", path, err)
	}
	defer ew.Close() // only the trampoline's copy may keep it open
	fail := func(err error) (*child, error) {
		_ = w.Close()
		_ = er.Close()
		return nil, err
	}
	files := childFiles(int(r.Fd()), int(ew.Fd()))
	for i, f := range []*os.File{stdin, stdout, stderr} {
		if f == nil {
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return fail(fmt.Errorf("launcher: open %s: %w", os.DevNull, err))
			}
			defer null.Close()
			f = null
		}
		files[i] = f.Fd()
	}
	pid, err := syscall.ForkExec(self, append([]string{"mps-launch", path}, argv...), &syscall.ProcAttr{
		Env:   []string{trampolineEnv + "=" + pipeFDs(int(r.Fd()), int(ew.Fd()))},
		Files: files,
	})
	if err != nil {
		return fail(fmt.Errorf("launcher: start %s through %s: %w", path, self, err))
	}
	c := &child{pid: pid, release: w, execPipe: er, exited: make(chan struct{})}
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

// start lets the trampoline exec the program with env, and returns once
// the trampoline has restored its signal dispositions (or died), so that
// signals sent from then on reach the program. Entries holding a NUL
// cannot be passed to a program and are left out.
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
	if _, err := c.release.Write(msg); errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w: pid %d", errTrampolineGone, c.pid)
	} else if err != nil {
		return fmt.Errorf("launcher: release pid %d: %w", c.pid, err)
	}
	// The trampoline reads the message to its end.
	_ = c.release.Close()
	c.release = nil
	// The write into the pipe can succeed while a killed trampoline is
	// still on its way out; only the byte on the exec pipe says that it
	// took the release.
	ack, err := io.ReadAll(io.LimitReader(c.execPipe, 1))
	if err != nil {
		return fmt.Errorf("launcher: wait for pid %d to exec: %w", c.pid, err)
	}
	if len(ack) == 0 {
		return fmt.Errorf("%w: pid %d", errTrampolineGone, c.pid)
	}
	return nil
}

// abandon closes the pipes to the trampoline, so one still waiting exits
// without running the program.
func (c *child) abandon() {
	if c.release != nil {
		_ = c.release.Close()
		c.release = nil
	}
	if c.execPipe != nil {
		_ = c.execPipe.Close()
		c.execPipe = nil
	}
}

// signal sends sig to the process unless it is reaped; a process that has
// ended but is not reaped takes it harmlessly.
func (c *child) signal(sig os.Signal) {
	if n, ok := sig.(syscall.Signal); ok && !c.reaped {
		_ = syscall.Kill(c.pid, n)
	}
}
