// Command testrun is make test's runner: it runs go test on a fresh run
// (package testrun) and shows go test's usual output; then it checks that
// the tests left nothing behind, looking only at what it can tie to this
// run, and removes what they left; last it lists every skipped test with
// its reason. Its exit status is go test's, or 1 when something was left
// or a skip is not allowed.
//
//	testrun [go test flags] [packages]
//	testrun -check
//
// -check checks the run named by MPSD_TEST_RUN (a script that started the
// run itself). With MPSD_SKIPS_ALLOWED naming a file of regular
// expressions (one a line, matched against "package Test: reason"), a
// skip no line matches fails the run: CI allows only the skips that its
// machines cannot avoid. GO names the go command (default go).
//
// SIGINT, SIGTERM and SIGHUP do not stop testrun: go test gets them (a
// terminal's reach it anyway, through the process group), and the check
// still runs, so an interrupted run leaves nothing running either. Those
// testrun was started ignoring stay ignored.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/mpsd/mpsd/internal/testrun"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "-check" {
		dir := testrun.Dir()
		if dir == "" {
			fmt.Fprintf(stderr, "check-leftovers: %s is not set: the check looks only at what one test run started (make test sets it)\n", testrun.EnvRun)
			return 2
		}
		return check(dir, stdout, stderr)
	}
	allowed, err := allowedSkips()
	if err != nil {
		fmt.Fprintln(stderr, "testrun:", err)
		return 2
	}
	dir, err := testrun.Begin("")
	if err != nil {
		fmt.Fprintln(stderr, "testrun:", err)
		return 2
	}
	code, skips := goTest(dir, args, stdout, stderr)
	if c := check(dir, stdout, stderr); c != 0 && code == 0 {
		code = c
	}
	_ = os.RemoveAll(dir)
	if c := reportSkips(skips, allowed, stdout); c != 0 && code == 0 {
		code = c
	}
	return code
}

// reportSkips lists the skipped tests last, where a reader of make test's
// output looks; 1 if the allow-list (if any) does not cover one.
func reportSkips(skips []testrun.Skip, allowed testrun.Allowed, stdout io.Writer) int {
	fmt.Fprintf(stdout, "skipped tests: %d\n", len(skips))
	for _, s := range skips {
		fmt.Fprintf(stdout, "skipped: %s\n", s)
	}
	if allowed == nil {
		return 0
	}
	bad := allowed.Disallowed(skips)
	if len(bad) == 0 {
		return 0
	}
	fmt.Fprintf(stdout, "testrun: %d skips not allowed by %s (each one a missing requirement):\n", len(bad), os.Getenv(envAllowed))
	for _, s := range bad {
		fmt.Fprintf(stdout, "  %s\n", s)
	}
	return 1
}

// goTest runs go test -json with args in run dir, shows its output, and
// returns its status and the skipped tests.
func goTest(dir string, args []string, stdout, stderr io.Writer) (int, []testrun.Skip) {
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	cmd := exec.Command(goCmd, append([]string{"test", "-json"}, args...)...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, testrun.EnvRun+"=") || strings.HasPrefix(kv, testrun.EnvEmuRun+"=")
	}), testrun.EnvRun+"="+dir, testrun.EnvEmuRun+"="+dir)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(stderr, "testrun:", err)
		return 2, nil
	}
	// Signals this process was started ignoring (nohup's SIGHUP) stay
	// ignored, by go test too.
	sigs := make(chan os.Signal, 4)
	for _, s := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "testrun:", err)
		return 2, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forwarded := make(chan struct{})
	go func() { // passes signals on until go test has ended
		defer close(forwarded)
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-ctx.Done():
				return
			}
		}
	}()
	skips, rerr := testrun.Report(out, stdout, slices.Contains(args, "-v"))
	werr := cmd.Wait()
	cancel()
	<-forwarded
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(werr, &ee):
		code = ee.ExitCode()
		if code < 0 { // killed by a signal
			code = 1
		}
	case werr != nil:
		fmt.Fprintln(stderr, "testrun:", werr)
		code = 2
	}
	if rerr != nil {
		fmt.Fprintln(stderr, "testrun: reading go test's output:", rerr)
		code = max(code, 1)
	}
	return code, skips
}

// envAllowed names the allow-list of skips.
const envAllowed = "MPSD_SKIPS_ALLOWED"

func allowedSkips() (testrun.Allowed, error) {
	name := os.Getenv(envAllowed)
	if name == "" {
		return nil, nil
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	a, err := testrun.ParseAllowed(string(b))
	if a == nil && err == nil {
		a = testrun.Allowed{} // an empty list allows no skip
	}
	return a, err
}

// check reports what the run left and removes it; 1 if anything was left.
func check(dir string, stdout, stderr io.Writer) int {
	left, err := testrun.Check(dir)
	if err != nil {
		fmt.Fprintln(stderr, "check-leftovers:", err)
		return 2
	}
	if left.Empty() {
		fmt.Fprintln(stdout, "check-leftovers: no processes, cgroups, temporary or default MPS directories, or test users of this run left behind")
		return 0
	}
	fmt.Fprint(stderr, left.String())
	for _, err := range left.Clean() {
		fmt.Fprintln(stderr, "check-leftovers: cleaning up:", err)
	}
	fmt.Fprintln(stderr, "check-leftovers: removed what the run left (tests must clean up after themselves)")
	return 1
}
