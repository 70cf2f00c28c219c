//go:build !cgo

package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// trampoline is the whole life of the trampoline process in a build
// without cgo, reached from Main; args are os.Args[1:]: [path, argv0,
// ...]. It returns only if the program could not be started (see the
// contract at trampolineEnv). While it waits it drops the forwarded
// signals, which are mps-launch's to act on, and restores the
// dispositions the process started with before the exec.
func trampoline(args, environ []string, stderr io.Writer) int {
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
	// Caught and dropped rather than signal.Ignore'd: Go keeps an ignored
	// signal ignored past Reset, and the program would inherit SIG_IGN.
	signal.Notify(make(chan os.Signal, 1), forwarded...)
	release := os.NewFile(uintptr(releaseFD), "mps-launch release pipe")
	msg, _ := io.ReadAll(release)
	_ = release.Close() // the program must not inherit it
	if len(msg) == 0 || msg[0] != releaseByte {
		return ExitFailure
	}
	signal.Reset(forwarded...)
	// From here on a forwarded signal finds the program's dispositions:
	// mps-launch may send them.
	execPipe := os.NewFile(uintptr(execFD), "mps-launch exec pipe")
	_, _ = execPipe.Write([]byte{releaseByte})
	_ = execPipe.Close() // neither pipe reaches the program
	path, argv := args[0], args[1:]
	env := strings.Split(string(msg[1:]), "\x00")
	env = env[:len(env)-1] // the part after the last NUL is not an entry
	err := syscall.Exec(path, argv, env)
	fmt.Fprintf(stderr, "mps-launch: cannot execute %s: %v\n", path, err)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return ExitNotFound
	}
	return ExitNotExecutable
}

// isPipe reports whether fd is an open pipe.
func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFIFO
}
