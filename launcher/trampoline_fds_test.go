package launcher

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api/apitest"
)

// inheritable opens name and gives it a descriptor without close-on-exec,
// as a caller's redirection would have passed it down; closed when the
// test ends.
func inheritable(t *testing.T, name string) int {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := unix.Dup(int(f.Fd())) // dup does not copy close-on-exec
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

// TestTrampolinePassesCallerFDs: a descriptor the caller holds without
// close-on-exec reaches the program at its own number, naming the same
// file, and neither of the trampoline's pipes reaches it. The descriptor
// is opened before the pipes, so it has a lower number than both (the
// numbers the trampoline once took for its pipes, 3 and 4, clobbering the
// caller's); TestCallerFDs in cmd/mps-launch passes exactly 3 to 9.
func TestTrampolinePassesCallerFDs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "passed")
	if err := os.WriteFile(file, []byte("passed down\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd := inheritable(t, file)
	n := strconv.Itoa(fd)
	// The program writes what its descriptor holds, then waits on stdin,
	// so that its descriptors can be listed.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinR.Close()
	defer stdinW.Close()
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdoutR.Close()
	defer stdoutW.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err := startChild(self, "/bin/sh", []string{"sh", "-c", "cat /proc/self/fd/" + n + "; echo done; read line; true"}, stdinR, stdoutW, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.kill() })
	waitIgnoring(t, c.pid, syscall.SIGTERM) // the trampoline runs: its environment is there
	release, execDone := pipeNumbers(t, c.pid)
	if fd >= release || fd >= execDone {
		t.Fatalf("the caller's descriptor %d is not below the pipes %d and %d: the test proves nothing", fd, release, execDone)
	}
	if err := c.start(testEnv); err != nil {
		t.Fatal(err)
	}
	_ = stdoutW.Close()
	if err := stdoutR.SetReadDeadline(time.Now().Add(apitest.Wait)); err != nil {
		t.Fatal(err)
	}
	// "done" comes once cat has ended; then only read runs, which opens
	// no descriptor.
	out := bufio.NewReader(stdoutR)
	for _, want := range []string{"passed down\n", "done\n"} {
		if line, err := out.ReadString('\n'); line != want {
			t.Fatalf("the program wrote %q, %v; want %q (read from its descriptor %d)", line, err, want, fd)
		}
	}
	got, want := apitest.ProgramFDs(t, c.pid)
	if !slices.Contains(want, fd) {
		t.Fatalf("this process's descriptor %d is not inheritable: %v", fd, want)
	}
	if !slices.Equal(got, want) {
		t.Errorf("the program has descriptors %v, want %v (the caller's)", got, want)
	}
	_ = stdinW.Close()
	if code := waitChild(t, c); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// pipeNumbers reads the trampoline's pipe descriptors from its
// environment.
func pipeNumbers(t *testing.T, pid int) (release, execDone int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	var v string
	ok := false
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok = strings.CutPrefix(kv, trampolineEnv+"="); ok {
			break
		}
	}
	if !ok {
		t.Fatalf("trampoline %d has no %s: %q", pid, trampolineEnv, b)
	}
	release, execDone, ok = parsePipeFDs(v)
	if !ok {
		t.Fatalf("trampoline %d: %s=%q", pid, trampolineEnv, v)
	}
	return release, execDone
}

func TestChildFiles(t *testing.T) {
	passed := inheritable(t, "/dev/null")
	own, err := os.Open("/dev/null") // close-on-exec, as Go opens everything
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	release, execDone := int(r.Fd()), int(w.Fd())
	files := childFiles(release, execDone)
	if len(files) != max(release, execDone)+1 {
		t.Fatalf("%d entries, want up to the higher pipe %d", len(files), max(release, execDone))
	}
	closed := ^uintptr(0)
	for fd, want := range map[int]uintptr{passed: uintptr(passed), int(own.Fd()): closed, release: uintptr(release), execDone: uintptr(execDone)} {
		if fd < len(files) && files[fd] != want {
			t.Errorf("files[%d] = %d, want %d", fd, int(files[fd]), int(want))
		}
	}
	if passed >= len(files) {
		t.Fatalf("the inheritable descriptor %d is above the pipes: the test proves nothing", passed)
	}
}

// TestTrampolineWithoutPipes: a trampoline whose variable does not name
// two pipes runs nothing: not "1" (the variable set by hand), not
// descriptors that are open but no pipes.
func TestTrampolineWithoutPipes(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for _, v := range []string{"1", "3,4", "3,3", "4,3x", "", "-1,4"} {
		t.Run(v, func(t *testing.T) {
			f, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd := exec.Command(self, "/bin/sh", "sh", "-c", "touch "+marker)
			cmd.Env = []string{trampolineEnv + "=" + v}
			if v == "" {
				cmd.Env = []string{trampolineEnv + "=,"}
			}
			cmd.ExtraFiles = []*os.File{f, f} // 3 and 4 open, but no pipes
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != ExitFailure {
				t.Errorf("%s=%q: %v, want exit %d", trampolineEnv, v, err, ExitFailure)
			}
			if string(out) != "mps-launch: trampoline started without its pipes\n" {
				t.Errorf("output %q", out)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("the program ran")
			}
		})
	}
}

func FuzzParsePipeFDs(f *testing.F) {
	for _, s := range []string{"3,4", "7,12", "1", "", ",", "3,3", "2,5", "-3,4", "99999999999999999999,4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, e, ok := parsePipeFDs(v)
		if !ok {
			return
		}
		if r <= 2 || e <= 2 || r == e {
			t.Fatalf("parsePipeFDs(%q) = %d, %d, ok", v, r, e)
		}
		if r2, e2, ok2 := parsePipeFDs(pipeFDs(r, e)); !ok2 || r2 != r || e2 != e {
			t.Fatalf("round trip of %d,%d: %d,%d,%v", r, e, r2, e2, ok2)
		}
	})
}
