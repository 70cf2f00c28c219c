package mps

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// kernelAtLeast reports whether the running kernel is major.minor or newer.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", u.Release, err)
	}
	return ma > major || (ma == major && mi >= minor)
}

// A process its parent has already reaped still tells its wait status
// through a pidfd held on it (Linux 6.15+): a SIGKILL is a SIGKILL, not
// "unknown", however quickly the parent reaps it. Older kernels say
// nothing (ok false).
func TestPidfdExitAfterReap(t *testing.T) {
	supported := kernelAtLeast(t, 6, 15)
	for _, tc := range []struct {
		name   string
		args   []string
		kill   bool
		status int
		sig    syscall.Signal
	}{
		{"SIGKILL", []string{"sleep", "60"}, true, -1, syscall.SIGKILL},
		{"exit 3", []string{"sh", "-c", "exit 3"}, false, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.args[0], tc.args[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
			if err != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if _, ok := pidfdExit(fd); ok {
				t.Errorf("exit status of a running process")
			}
			if tc.kill {
				if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
					t.Fatal(err)
				}
			}
			_ = cmd.Wait() // the parent reaps it
			ws, ok := pidfdExit(fd)
			if !supported {
				if ok {
					t.Errorf("kernel before 6.15 gave an exit status %#x", ws)
				}
				return
			}
			if !ok {
				t.Fatal("no exit status through the pidfd after the reap")
			}
			if status, sig := exitFromWaitStatus(ws); status != tc.status || sig != tc.sig {
				t.Errorf("exit status %d, signal %v; want %d, %v", status, sig, tc.status, tc.sig)
			}
		})
	}
}
