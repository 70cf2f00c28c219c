package mpsd

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// illegal collects the illegal transitions (and protocol breaks) the
// daemon reported during the tests: each is a bug. The harness fails the
// test that was running (tests of this package do not run in parallel),
// and TestMain fails the run if any slipped past.
var illegal struct {
	sync.Mutex
	errs []error
}

func illegalCount() int {
	illegal.Lock()
	defer illegal.Unlock()
	return len(illegal.errs)
}

func illegalSince(n int) []error {
	illegal.Lock()
	defer illegal.Unlock()
	return append([]error(nil), illegal.errs[n:]...)
}

// checkedM runs the tests, then fails the run on any illegal transition.
type checkedM struct{ m *testing.M }

func (c checkedM) Run() int {
	code := c.m.Run()
	if n := illegalCount(); n > 0 {
		fmt.Fprintf(os.Stderr, "mpsd reported %d illegal transitions:\n", n)
		for _, err := range illegalSince(0) {
			fmt.Fprintln(os.Stderr, "  ", err)
		}
		code = 1
	}
	return code
}

func TestMain(m *testing.M) {
	if os.Getenv(envAPICall) != "" {
		os.Exit(apiCallMain(os.Args[1:]))
	}
	illegalTransition = func(err error) {
		illegal.Lock()
		illegal.errs = append(illegal.errs, err)
		illegal.Unlock()
	}
	goleak.VerifyTestMain(checkedM{m})
}
