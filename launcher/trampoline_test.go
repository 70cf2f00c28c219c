package launcher

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api/apitest"
)

// startMarked starts the test binary as a trampoline for path and argv;
// without argv, a shell command that leaves the returned marker file.
func startMarked(t *testing.T, path string, argv ...string) (*child, string, *os.File) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stderr.Close() })
	marker := filepath.Join(dir, "marker")
	if argv == nil {
		argv = []string{"sh", "-c", `echo "ran $A|$B|$C" > ` + marker}
	}
	c, err := startChild(self, path, argv, nil, nil, stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.kill() })
	return c, marker, stderr
}

var testEnv = []string{"PATH=/usr/bin:/bin", "A=a b", "", "B=é=x", "C=c\x00d"}

func waitChild(t *testing.T, c *child) int {
	t.Helper()
	select {
	case <-c.exited:
		return exitStatus(c.reap())
	case <-time.After(apitest.Wait):
		t.Fatal("trampoline did not end")
		return -1
	}
}

func ran(marker string) bool {
	_, err := os.Stat(marker)
	return !errors.Is(err, os.ErrNotExist)
}

func TestTrampolineRunsProgramOnlyAfterRelease(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, marker, _ := startMarked(t, "/bin/sh")
	exe, err := os.Readlink("/proc/" + itoa(c.pid) + "/exe")
	if err != nil || exe != self {
		t.Fatalf("/proc/pid/exe = %q, %v; want the launcher binary %q", exe, err, self)
	}
	if ran(marker) {
		t.Fatal("the program ran before release")
	}
	if err := c.start(testEnv); err != nil {
		t.Fatal(err)
	}
	if code := waitChild(t, c); code != 0 {
		t.Fatalf("exit %d", code)
	}
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatalf("the program did not run after release: %v", err)
	}
	// The environment comes whole through the release message; an entry
	// with a NUL cannot and does not.
	if string(b) != "ran a b|é=x|\n" {
		t.Errorf("the program saw %q", b)
	}
}

func TestTrampolineAbandoned(t *testing.T) {
	c, marker, _ := startMarked(t, "/bin/sh")
	c.abandon() // the release pipe closes without the byte
	if code := waitChild(t, c); code != ExitFailure {
		t.Errorf("exit %d, want %d", code, ExitFailure)
	}
	if ran(marker) {
		t.Error("an abandoned trampoline ran the program")
	}
}

func TestTrampolineRestoresSignalDispositions(t *testing.T) {
	// The trampoline ignores the forwarded signals while it waits; the
	// program must start with the dispositions mps-launch has.
	marker := filepath.Join(t.TempDir(), "sigign")
	c, _, _ := startMarked(t, "/bin/sh", "sh", "-c", "exec grep SigIgn /proc/self/status > "+marker)
	if err := c.start(testEnv); err != nil {
		t.Fatal(err)
	}
	if code := waitChild(t, c); code != 0 {
		t.Fatalf("exit %d", code)
	}
	got, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "SigIgn:") {
			want = line + "\n"
		}
	}
	if string(got) != want {
		t.Errorf("program started with %q, want the launcher's %q", got, want)
	}
}

func TestTrampolineExecFails(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	writeFile(t, plain, 0o644)
	for _, tc := range []struct {
		name, path string
		code       int
		line       string
	}{
		// lookPath normally catches these; the file can change in between.
		{"vanished", filepath.Join(dir, "gone"), ExitNotFound, "mps-launch: cannot execute " + filepath.Join(dir, "gone") + ": no such file or directory\n"},
		{"not executable", plain, ExitNotExecutable, "mps-launch: cannot execute " + plain + ": permission denied\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, stderr := startMarked(t, tc.path, "x")
			if err := c.start(testEnv); err != nil {
				t.Fatal(err)
			}
			if code := waitChild(t, c); code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			b, err := os.ReadFile(stderr.Name())
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.line {
				t.Errorf("stderr %q, want %q", b, tc.line)
			}
		})
	}
}

func TestTrampolineWithoutCommand(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{trampolineEnv + "=1"}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitFailure {
		t.Errorf("trampoline without a command: %v, want exit %d", err, ExitFailure)
	}
	if string(out) != "mps-launch: trampoline started without a command\n" {
		t.Errorf("output %q", out)
	}
}

// waitIgnoring waits until the trampoline pid ignores sig and every other
// forwarded signal, the state it keeps while it waits for its release
// (its Go runtime catches them before that). The kernel has no event for a change of disposition, so this
// polls /proc/pid/status, bounded by apitest.Wait; no assertion
// depends on how long it takes.
func waitIgnoring(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	want := uint64(1) << (sig - 1)
	for _, s := range forwarded {
		want |= 1 << (s.(syscall.Signal) - 1)
	}
	deadline := time.Now().Add(apitest.Wait)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		b, err := os.ReadFile("/proc/" + itoa(pid) + "/status")
		if err != nil {
			t.Fatalf("trampoline %d: %v", pid, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
				bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
				if err != nil {
					t.Fatalf("trampoline %d: SigIgn %q: %v", pid, mask, err)
				}
				if bits&want == want {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("trampoline %d never started ignoring %v", pid, sig)
		}
		<-tick.C
	}
}
