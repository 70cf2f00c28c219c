package launcher

import (
	"context"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain serves trampoline mode too: tests run the command through
// /proc/self/exe, which is this test binary.
func TestMain(m *testing.M) {
	if isTrampoline(os.Environ()) {
		os.Exit(Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Environ()))
	}
	goleak.VerifyTestMain(m)
}
