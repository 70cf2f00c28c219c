package launcher

import (
	"context"
	"os"
	"os/signal"
	"testing"

	"go.uber.org/goleak"
)

// TestMain serves trampoline mode too: tests run the command through
// /proc/self/exe, which is this test binary.
//
// The tests' commands inherit this process's signal dispositions (through
// the trampoline, as they would from mps-launch), and the tests expect the
// default ones: a forwarded signal this process was started ignoring
// (nohup ignores SIGHUP, a shell's background job SIGINT) would be
// ignored by the command too, its trap never run. Catching them here
// gives the commands the default disposition, whatever the runner
// ignores.
func TestMain(m *testing.M) {
	if isTrampoline(os.Environ()) {
		os.Exit(Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Environ()))
	}
	for _, s := range forwarded {
		if signal.Ignored(s) {
			signal.Notify(make(chan os.Signal, 1), s)
		}
	}
	goleak.VerifyTestMain(m)
}
