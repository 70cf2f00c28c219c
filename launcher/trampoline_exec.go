package launcher

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"unsafe"
)

// The trampoline process's side of the contract at trampolineEnv: a Go
// program like the rest of mps-launch (which is built without cgo: a
// static binary starts about 1 ms sooner than one linked with libc, on
// every launch's critical path, and runs in any container). Its signal
// dispositions are set with rt_sigaction(2) directly rather than through
// os/signal: the Go runtime's handlers are never needed again here, the
// dispositions are in place the moment the call returns (os/signal's
// Reset waits for its signal loop, a few hundred microseconds after the
// grant), and no signal sent after the exec pipe's byte can fall into a
// Go handler while another thread runs execve.

// kernelSigaction is the kernel's struct sigaction for rt_sigaction(2)
// (the same layout on amd64 and arm64).
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

const (
	sigDFL = 0
	sigIGN = 1
)

// setSigaction sets sig's disposition to handler in the kernel directly,
// past the Go runtime (whose handlers this process never needs again),
// and returns the one it replaces.
func setSigaction(sig syscall.Signal, handler uintptr) (old uintptr, err error) {
	act := kernelSigaction{handler: handler}
	var prev kernelSigaction
	_, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig),
		uintptr(unsafe.Pointer(&act)), uintptr(unsafe.Pointer(&prev)), 8, 0, 0)
	if e != 0 {
		return 0, e
	}
	return prev.handler, nil
}

// trampoline is the whole life of the trampoline process, reached from
// Main; args are os.Args[1:]: [path, argv0, ...]. It returns only if the
// program could not be started (see the contract at trampolineEnv).
func trampoline(args, environ []string, stderr io.Writer) int {
	// While it waits, possibly for as long as the request is queued, the
	// signals a terminal sends the process group are mps-launch's to act
	// on; the program gets the dispositions this process was started
	// with: ignored stays ignored (the runtime keeps an inherited SIG_IGN
	// of SIGHUP and SIGINT, the only ones mps-launch passes down), the
	// rest (the runtime's handlers now) the default. A signal in the
	// moment before this (the runtime's start) ends the trampoline, which
	// never ran the program: mps-launch starts another at the grant.
	restore := make([]uintptr, len(forwarded))
	for i, s := range forwarded {
		old, err := setSigaction(s.(syscall.Signal), sigIGN)
		if err != nil {
			fmt.Fprintf(stderr, "mps-launch: trampoline cannot ignore %v: %v\n", s, err)
			return ExitFailure
		}
		restore[i] = sigDFL
		if old == sigIGN {
			restore[i] = sigIGN
		}
	}
	if len(args) < 2 {
		fmt.Fprintln(stderr, "mps-launch: trampoline started without a command")
		return ExitFailure
	}
	releaseFD, execFD, ok := parsePipeFDs(getenv(environ, trampolineEnv))
	if ok {
		ok = isPipe(releaseFD) && isPipe(execFD)
	}
	if !ok {
		fmt.Fprintln(stderr, "mps-launch: trampoline started without its pipes")
		return ExitFailure
	}
	msg, err := readAll(releaseFD)
	_ = syscall.Close(releaseFD) // the program must not inherit it
	if err != nil || len(msg) == 0 || msg[0] != releaseByte {
		return ExitFailure
	}
	for i, s := range forwarded {
		if _, err := setSigaction(s.(syscall.Signal), restore[i]); err != nil {
			return ExitFailure
		}
	}
	// From here on a forwarded signal finds the program's dispositions:
	// mps-launch may send them.
	for {
		_, err := syscall.Write(execFD, []byte{releaseByte})
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	_ = syscall.Close(execFD) // neither pipe reaches the program
	path, argv := args[0], args[1:]
	env := strings.Split(string(msg[1:]), "\x00")
	env = env[:len(env)-1] // the part after the last NUL is not an entry
	err = syscall.Exec(path, argv, env)
	fmt.Fprintf(stderr, "mps-launch: cannot execute %s: %v\n", path, err)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return ExitNotFound
	}
	return ExitNotExecutable
}

// readAll reads fd, a blocking pipe, to its end.
func readAll(fd int) ([]byte, error) {
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return nil, err
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// isPipe reports whether fd is an open pipe.
func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFIFO
}
