package launcher

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api/apitest"
)

// TestTrampolineSignalRightAfterRelease: mps-launch forwards a signal as
// soon as the release is written (one that came during the attach waits
// for it). The trampoline ignores the forwarded signals until it has read
// the release, so that signal must not arrive while it still does: it must
// reach the program, or end the trampoline, never vanish.
// The trampoline sets its dispositions in the kernel directly: a Go
// handler still in place after the exec pipe's byte could take the signal
// while another of its threads runs execve, and lose it.
func TestTrampolineSignalRightAfterRelease(t *testing.T) {
	stdinR, stdinW, err := os.Pipe() // open and empty: read waits for ever
	if err != nil {
		t.Fatal(err)
	}
	defer stdinR.Close()
	defer stdinW.Close()
	for i := range 20 {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		c, err := startChild(self, "/bin/sh", []string{"sh", "-c", "read line"}, stdinR, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		waitIgnoring(t, c.pid, syscall.SIGTERM)
		if err := c.start(testEnv); err != nil {
			c.kill()
			t.Fatal(err)
		}
		c.signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(apitest.Wait):
			c.kill()
			t.Fatalf("run %d: SIGTERM sent right after the release was lost", i)
		}
		if code := exitStatus(c.reap()); code != 128+int(syscall.SIGTERM) {
			t.Fatalf("run %d: exit %d, want %d", i, code, 128+int(syscall.SIGTERM))
		}
	}
}
