package main

import (
	"bufio"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/launcher"
)

// bin is the real mps-launch, built once for all tests.
var bin string

func TestMain(m *testing.M) {
	if os.Getenv(listenerChildEnv) != "" {
		os.Exit(serveListener()) // a socket-activated program (fds_test.go)
	}
	dir, err := os.MkdirTemp("", "mps-launch-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "mps-launch")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as make build does
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build mps-launch: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// launch runs the built mps-launch with args against socket (via
// MPSD_SOCKET, "" for none) and stdin, and waits for it.
func launch(t testing.TB, socket string, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if socket != "" {
		cmd.Env = append(cmd.Env, api.EnvSocket+"="+socket)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %s: %v", bin, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

func TestExitStatus(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"true", []string{"--sm", "10", "--mem", "1G", "--", "/bin/true"}, 0, ""},
		{"false", []string{"/bin/false"}, 1, ""},
		{"own code", []string{"--", "sh", "-c", "exit 42"}, 42, ""},
		{"killed by SIGKILL", []string{"--", "sh", "-c", "kill -KILL $$"}, 137, ""},
		{"killed by SIGTERM", []string{"--", "sh", "-c", "kill -TERM $$"}, 143, ""},
		{"not found", []string{"--", "no-such-program-mpsd"}, 127, "mps-launch: command not found: no-such-program-mpsd\n"},
		{"not executable", []string{"--", plain}, 126, "mps-launch: command not executable: " + plain + ": permission denied\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := launch(t, fake.Socket, "", tc.args...)
			if r.code != tc.code || r.stderr != tc.stderr {
				t.Errorf("exit %d stderr %q, want %d and %q", r.code, r.stderr, tc.code, tc.stderr)
			}
		})
	}
}

// TestBadInput: exit 125 and exactly one line naming what is wrong.
func TestBadInput(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mpsd.sock")
	for _, tc := range []struct {
		name string
		args []string
		line string
	}{
		{"sm 0", []string{"--sm", "0", "--", "/bin/true"}, `--sm "0": want a whole percentage from 1 to 100`},
		{"sm 101", []string{"--sm", "101", "--", "/bin/true"}, `--sm "101": want a whole percentage from 1 to 100`},
		{"sm abc", []string{"--sm", "abc", "--", "/bin/true"}, `--sm "abc": want a whole percentage from 1 to 100`},
		{"mem 8X", []string{"--mem", "8X", "--", "/bin/true"}, `--mem "8X": unknown unit "X"; use K, M, G or T (binary), optionally with iB, or none for bytes`},
		{"mem -1G", []string{"--mem", "-1G", "--", "/bin/true"}, `--mem "-1G": a size has no sign`},
		{"gpus 0", []string{"--gpus", "0", "--", "/bin/true"}, `--gpus "0": want a whole number of GPUs, 1 or more`},
		{"unknown flag", []string{"--bogus", "--", "/bin/true"}, `unknown flag --bogus (mps-launch --help lists the flags)`},
		{"missing command", []string{"--sm", "10"}, `missing command: mps-launch [flags] -- COMMAND [ARG...]`},
		{"daemon not running", []string{"--socket", sock, "/bin/true"},
			"cannot reach mpsd at " + sock + ": no such file or directory (is mpsd running? --socket or $MPSD_SOCKET names another socket)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := launch(t, "", "", tc.args...)
			if r.code != launcher.ExitFailure {
				t.Errorf("exit %d, want %d", r.code, launcher.ExitFailure)
			}
			if r.stderr != "mps-launch: "+tc.line+"\n" {
				t.Errorf("stderr\n got %q\nwant %q", r.stderr, "mps-launch: "+tc.line+"\n")
			}
		})
	}
}

func TestHelp(t *testing.T) {
	r := launch(t, "", "", "--help")
	if r.code != 0 || r.stdout != launcher.Usage || r.stderr != "" {
		t.Errorf("--help: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestShippedBuildStatic: the mps-launch that make build ships (or, outside
// make test, the one the end-to-end tests build the same way) is built
// without cgo, a static binary: linked with libc it starts about 1 ms
// later, on every launch's critical path (make bench).
func TestShippedBuildStatic(t *testing.T) {
	path := filepath.Join(emutest.CmdDir(t), "mps-launch")
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cgo := ""
	for _, s := range bi.Settings {
		if s.Key == "CGO_ENABLED" {
			cgo = s.Value
		}
	}
	if cgo != "0" {
		t.Errorf("%s was built with CGO_ENABLED=%q, want 0 (Makefile's build target)", path, cgo)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked (it has a program interpreter), want static", path)
		}
	}
}

// TestVersion: the built binary names itself, its build and its Go.
func TestVersion(t *testing.T) {
	r := launch(t, "", "", "--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "mps-launch ") || !strings.Contains(r.stdout, " commit ") ||
		!strings.Contains(r.stdout, runtime.Version()) || strings.Count(r.stdout, "\n") != 1 || r.stderr != "" {
		t.Errorf("--version: exit %d stdout %q stderr %q, want 0 and one line naming the build", r.code, r.stdout, r.stderr)
	}
}

func TestStdinStdoutPassthrough(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	in := strings.Repeat("some input \x00\xff\n", 5000) // more than a pipe buffer
	r := launch(t, fake.Socket, in, "--", "sh", "-c", "cat; echo to-stderr >&2")
	if r.code != 0 || r.stdout != in || r.stderr != "to-stderr\n" {
		t.Errorf("exit %d, stdout %d bytes (want %d), stderr %q", r.code, len(r.stdout), len(in), r.stderr)
	}
}

func TestCommandStartsInsideLease(t *testing.T) {
	fake := apitest.New(t, nil)
	cmd := exec.Command(bin, "--sm", "30", "--mem", "8G", "--", "sh", "-c", `echo "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT $MPSD_ATTEMPT"`)
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lc := fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-7", 1))
	a := fake.NextAttach(t)
	if a.PeerPID != cmd.Process.Pid {
		t.Errorf("attach sent by pid %d, want mps-launch %d", a.PeerPID, cmd.Process.Pid)
	}
	if a.PID == cmd.Process.Pid {
		t.Error("mps-launch attached itself: it must stay outside the lease's cgroup")
	}
	if a.Exe != bin {
		t.Errorf("at attach the child was %q, want the blocked trampoline %q", a.Exe, bin)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("mps-launch: %v", err)
	}
	if out.String() != "30 0=8192M 1\n" {
		t.Errorf("command saw %q", out.String())
	}
}

func TestSignalForwarding(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	marker := filepath.Join(t.TempDir(), "marker")
	// read blocks on a pipe nobody writes to; the trap interrupts it.
	cmd := exec.Command(bin, "--", "sh", "-c", `trap 'echo term > `+marker+`; exit 7' TERM; echo ready; read line`)
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("command printed %q, %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 7 {
		t.Errorf("exit %d, want the trap's 7", code)
	}
	if b, _ := os.ReadFile(marker); string(b) != "term\n" {
		t.Errorf("marker %q: SIGTERM was not forwarded", b)
	}
}

// TestProgramFDs: the program gets the descriptors mps-launch was given,
// none of its own (the release and exec pipes, the socket to mpsd, the Go
// runtime's).
func TestProgramFDs(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	cmd := exec.Command(bin, "--", "sh", "-c", `echo $$; read line; exit 0`)
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = in.Close() // read ends, and so does the program
		if err := cmd.Wait(); err != nil {
			t.Errorf("mps-launch: %v", err)
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("command printed %q, %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("command printed %q: %v", line, err)
	}
	// cmd passed 0, 1 and 2, and what this process inherited.
	got, want := apitest.ProgramFDs(t, pid)
	if !slices.Equal(got, want) {
		t.Errorf("the program has descriptors %v, want %v", got, want)
	}
}

func TestSignalWhileQueued(t *testing.T) {
	fake := apitest.New(t, nil)
	cmd := exec.Command(bin, "--", "/bin/true")
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lc := fake.NextLease(t)
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 5, Group: "g"})
	// mps-launch registers its signals while its request goes out: a
	// SIGINT before that ends it by the signal's default action.
	waitCaught(t, cmd.Process.Pid, syscall.SIGINT)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d, want 130", code)
	}
	lc.WaitReleased(t)
}

func TestWaitLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		ok   func(api.LeaseRequest) bool
	}{
		{"no-wait", []string{"--no-wait"}, func(r api.LeaseRequest) bool { return r.NoWait }},
		{"wait 1s", []string{"--wait", "1s"}, func(r api.LeaseRequest) bool { return r.WaitMillis == 1000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := apitest.New(t, func(lc *apitest.LeaseConn) {
				if !tc.ok(lc.Request) {
					_ = lc.Send(api.Event{Type: api.EventError, Code: api.CodeBadRequest, Message: "test: unexpected request"})
					return
				}
				_ = lc.Send(api.Event{Type: api.EventQueued, Position: 1, Group: "g"})
				_ = lc.Send(api.Event{Type: api.EventError, Code: api.CodeWaitTimeout, Message: "no room in group g"})
			})
			r := launch(t, fake.Socket, "", append(tc.args, "--", "/bin/true")...)
			// stderr is no terminal: the wait is logged before its end.
			if r.code != launcher.ExitTempFail || r.stderr != "mps-launch: queued, position 1 in group g\nmps-launch: no room in group g\n" {
				t.Errorf("exit %d stderr %q, want 75 and the reason", r.code, r.stderr)
			}
		})
	}
}

// TestStatusLineOnTerminal runs mps-launch with stderr on a pseudo
// terminal: the queue status appears there, rewritten in place.
func TestStatusLineOnTerminal(t *testing.T) {
	master, slave := apitest.OpenPTY(t)
	fake := apitest.New(t, nil)
	cmd := exec.Command(bin, "--group", "g", "--", "/bin/true")
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	cmd.Stderr = slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lc := fake.NextLease(t)
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 2, Group: "g"})
	lc.MustSend(t, api.Event{Type: api.EventError, Code: api.CodeWaitTimeout, Message: "gave up"})
	_ = cmd.Wait()
	_ = slave.Close()
	if code := cmd.ProcessState.ExitCode(); code != launcher.ExitTempFail {
		t.Errorf("exit %d", code)
	}
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte("gave up")) {
		n, err := master.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	status := regexp.MustCompile(`\rmps-launch: queued, position 2 in group g, waited \d+s\x1b\[K`)
	if !status.Match(got) || !bytes.Contains(got, []byte("mps-launch: gave up")) {
		t.Errorf("terminal showed %q", got)
	}
}

// BenchmarkTrue compares `mps-launch --sm 10 --mem 1G -- /bin/true`
// against the fake mpsd with `/bin/true` alone, in the same run; the
// difference is what mps-launch adds (its own start, the trampoline's
// exec, the lease and attach round trips). `mps-launch --help` is the
// floor of any Go launcher: the binary starting and exiting, with no
// lease. Besides ns/op it reports the median and p99.
func BenchmarkTrue(b *testing.B) {
	fake := apitest.New(b, apitest.Grant)
	env := []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	for _, bc := range []struct {
		name string
		argv []string
	}{
		{"direct", []string{"/bin/true"}},
		{"mps-launch", []string{bin, "--sm", "10", "--mem", "1G", "--", "/bin/true"}},
		{"mps-launch-help", []string{bin, "--help"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var times []time.Duration
			for b.Loop() {
				start := time.Now()
				cmd := exec.Command(bc.argv[0], bc.argv[1:]...)
				cmd.Env = env
				cmd.Stdout = io.Discard
				if err := cmd.Run(); err != nil {
					b.Fatalf("%v: %v", bc.argv, err)
				}
				times = append(times, time.Since(start))
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds()), "median-µs")
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// waitCaught waits until process pid catches sig (SigCgt in its
// /proc/PID/status).
func waitCaught(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if mask, ok := strings.CutPrefix(line, "SigCgt:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64); err == nil && m&(1<<(sig-1)) != 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d does not catch %v after 10s", pid, sig)
		}
		time.Sleep(time.Millisecond)
	}
}
