package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/testrun"
)

// runner runs testrun with args outside any test run of its own, and
// returns its status and output.
func runner(t *testing.T, args ...string) (int, string) {
	t.Helper()
	t.Setenv(testrun.EnvRun, "")
	t.Setenv(testrun.EnvEmuRun, "")
	var out strings.Builder
	code := run(args, &out, &out)
	return code, out.String()
}

// TestStatusAndSkips: testrun's status is go test's, the check runs after
// it, and the skips come last, each with its reason; with an allow-list, a
// skip it does not allow fails the run.
func TestStatusAndSkips(t *testing.T) {
	// CI runs the suite with an allow-list of its own: these runs start
	// without one, and set theirs below.
	t.Setenv(envAllowed, "")
	code, out := runner(t, "-count=1", "./testdata/pass")
	if code != 0 {
		t.Errorf("passing package: exit %d\n%s", code, out)
	}
	check := strings.Index(out, "check-leftovers: no processes")
	skips := strings.Index(out, "skipped tests: 1\nskipped: github.com/mpsd/mpsd/internal/testrun/cmd/testrun/testdata/pass TestSkips: needs a thing this host lacks\n")
	if check < 0 || skips < check || !strings.HasSuffix(out, "lacks\n") {
		t.Errorf("want the check, then the skips, last:\n%s", out)
	}

	code, out = runner(t, "-count=1", "./testdata/fail")
	if code != 1 || !strings.Contains(out, "--- FAIL: TestFails") || !strings.Contains(out, "broken on purpose") {
		t.Errorf("failing package: exit %d, want go test's 1 and the failure\n%s", code, out)
	}

	allow := filepath.Join(t.TempDir(), "allowed")
	if err := os.WriteFile(allow, []byte("# only this one\nTestOther: \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envAllowed, allow)
	code, out = runner(t, "-count=1", "./testdata/pass")
	if code != 1 || !strings.Contains(out, "1 skips not allowed by "+allow) {
		t.Errorf("a skip the allow-list lacks: exit %d, want 1\n%s", code, out)
	}
	if err := os.WriteFile(allow, []byte("pass TestSkips: needs a thing\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out = runner(t, "-count=1", "./testdata/pass"); code != 0 {
		t.Errorf("an allowed skip: exit %d\n%s", code, out)
	}
}

func TestCheckNeedsARun(t *testing.T) {
	code, out := runner(t, "-check")
	if code != 2 || !strings.Contains(out, testrun.EnvRun+" is not set") {
		t.Errorf("-check outside a run: exit %d\n%s", code, out)
	}
}
