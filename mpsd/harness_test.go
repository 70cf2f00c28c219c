package mpsd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/simhost"
	"github.com/mpsd/mpsd/internal/testrun"
	"github.com/mpsd/mpsd/mps"
)

// waitFor bounds every wait of these tests; reaching it fails the test.
const waitFor = 30 * time.Second

var envSeq atomic.Int64

// testEnv is one mpsd, run in this process on simulated GPUs with the MPS
// emulator's real processes and real cgroups, in a temporary tree. The
// commands (mps-launch, mpsctl) run as real processes against it.
type testEnv struct {
	t       testing.TB
	dir     string
	cfgPath string
	socket  string
	parent  string
	emu     string
	bin     string
	opts    Options
	gpus    int
	// sim is the simulated GPUs mpsd runs on, as with --simulate; nil
	// once a test gives mpsd its own NVML.
	sim *gpu.Sim

	d      *Daemon
	cancel context.CancelFunc
	done   chan error
	log    *os.File
}

// newEnv writes a config with the given groups section (indented as under
// `groups:`) and extra top-level YAML, and starts mpsd on it.
func newEnv(t testing.TB, groups, extra string) *testEnv {
	t.Helper()
	return newEnvGPUs(t, 2, groups, extra)
}

// newEnvGPUs is newEnv on a host of gpus simulated GPUs.
func newEnvGPUs(t testing.TB, gpus int, groups, extra string) *testEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mpsd's end-to-end tests need root: real cgroups, pipe directory ownership and test uids")
	}
	// Short: the socket path must fit a sockaddr_un.
	dir, err := testrun.MkdirTemp("", "mpst")
	if err != nil {
		t.Fatal(err)
	}
	// Test uids must reach the socket, the binaries and their own files.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e := &testEnv{
		t:       t,
		dir:     dir,
		cfgPath: filepath.Join(dir, "mpsd.yaml"),
		socket:  filepath.Join(dir, "mpsd.sock"),
		parent:  testrun.CgroupName(fmt.Sprintf("e2e-%d-%d", os.Getpid(), envSeq.Add(1))),
		emu:     emutest.BinDir(t),
		bin:     emutest.CmdDir(t),
		gpus:    gpus,
	}
	e.log, err = os.Create(filepath.Join(dir, "mpsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	// An illegal transition of a lease or an instance (or a protocol
	// break) while the test ran fails it; checked after the cleanup below
	// has stopped mpsd (cleanups run last first).
	seen := illegalCount()
	t.Cleanup(func() {
		for _, err := range illegalSince(seen) {
			t.Errorf("mpsd: %v", err)
		}
	})
	t.Cleanup(e.cleanup)
	e.writeConfig(groups, extra)
	e.opts = Options{
		ConfigPath:     e.cfgPath,
		Logger:         slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RequestTimeout: 2 * time.Second,
	}
	e.simulate()
	return e
}

// simulate makes e.opts run on e.gpus simulated GPUs with the emulator in
// e.emu (read when mpsd starts), as cmd/mpsd does for --simulate.
func (e *testEnv) simulate() { e.simulateModel("a100-40g") }

// simulateModel is simulate with GPUs of the given model (and its
// driver, which the emulated MPS follows).
func (e *testEnv) simulateModel(model string) {
	e.t.Helper()
	sim, err := gpu.NewSim(gpu.SimSpec{GPUs: e.gpus, Model: model})
	if err != nil {
		e.t.Fatal(err)
	}
	e.sim = sim
	e.opts.NVML = sim.NVML()
	e.opts.XidInjector = sim
	e.opts.MPS = func(base mps.Config, l Layout) (mps.Config, error) {
		return simhost.MPS(base, e.emu, l.StateDir, sim.DriverVersion()), nil
	}
	log := e.opts.Logger.With("component", "sim")
	e.opts.Beside = func(l Layout) (func(), error) { return simhost.ServeXidReports(sim, l.StateDir, log) }
}

func (e *testEnv) config(groups, extra string) string {
	// Fast restarts, unless the test brings its own watchdog section.
	watchdog := "watchdog:\n  backoff_initial: 50ms\n  backoff_max: 1s"
	if strings.Contains(extra, "watchdog:") {
		watchdog = ""
	}
	// No metrics listener, unless the test brings its own metrics section.
	metrics := "metrics:\n  listen: \"\""
	if strings.Contains(extra, "metrics:") {
		metrics = ""
	}
	return fmt.Sprintf(`version: 1
socket: %s
run_dir: %s/run
state_dir: %s/state
log_dir: %s/log
cgroup:
  parent: %s
%s
%s
simulate:
  gpus: %d
  model: a100-40g
  emulator_dir: %s
%s
groups:
%s`, e.socket, e.dir, e.dir, e.dir, e.parent, metrics, watchdog, e.gpus, e.emu, extra, groups)
}

// writeConfig replaces the config file atomically, as a deployment tool
// would.
func (e *testEnv) writeConfig(groups, extra string) {
	e.t.Helper()
	tmp := e.cfgPath + ".new"
	if err := os.WriteFile(tmp, []byte(e.config(groups, extra)), 0o644); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, e.cfgPath); err != nil {
		e.t.Fatal(err)
	}
}

// start runs mpsd until stop, and returns once it serves.
func (e *testEnv) start() {
	e.t.Helper()
	if e.sim != nil && e.d != nil {
		// A restarted mpsd gets fresh simulated GPUs, as a new mpsd
		// process does.
		e.simulate()
	}
	ready := make(chan struct{})
	opts := e.opts
	opts.Ready = func() { close(ready) }
	d, err := New(opts)
	if err != nil {
		e.t.Fatalf("mpsd.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.d, e.cancel, e.done = d, cancel, make(chan error, 1)
	go func() { e.done <- d.Run(ctx) }()
	select {
	case <-ready:
	case err := <-e.done:
		e.cancel = nil
		e.t.Fatalf("mpsd stopped before it was ready: %v", err)
	case <-time.After(waitFor):
		e.t.Fatalf("mpsd not ready after %s", waitFor)
	}
}

// stop stops mpsd as SIGTERM does: it alone stops; MPS and workloads run
// on.
func (e *testEnv) stop() {
	e.t.Helper()
	if e.cancel == nil {
		return
	}
	e.cancel()
	e.cancel = nil
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("mpsd.Run: %v", err)
		}
	case <-time.After(waitFor):
		var buf bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
		e.t.Fatalf("mpsd did not stop within %s; goroutines:\n%s", waitFor, buf.String())
	}
}

func (e *testEnv) cleanup() {
	e.stop()
	pipes, _ := filepath.Glob(filepath.Join(e.dir, "run", "*", "*", "pipe"))
	for _, p := range pipes {
		emutest.KillByPipeDir(p)
	}
	emutest.RemoveCgroupTree(e.parent)
	_ = e.log.Close()
	if e.t.Failed() {
		if keep := os.Getenv("MPSD_TEST_KEEP_LOGS"); keep != "" {
			if b, err := os.ReadFile(e.log.Name()); err == nil {
				name := filepath.Join(keep, strings.ReplaceAll(e.t.Name(), "/", "_")+".log")
				if os.WriteFile(name, b, 0o644) == nil {
					e.t.Logf("mpsd log kept in %s", name)
				}
			}
		}
		if b, err := os.ReadFile(e.log.Name()); err == nil {
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			e.t.Logf("mpsd log (tail):\n%s", b)
		}
	}
	_ = os.RemoveAll(e.dir)
}

// launch prepares mps-launch against this mpsd.
func (e *testEnv) launch(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(e.bin, "mps-launch"), args...)
	cmd.Env = append(os.Environ(), api.EnvSocket+"="+e.socket)
	return cmd
}

// asUID makes cmd run as uid (gid the same number, no supplementary
// groups).
func asUID(cmd *exec.Cmd, uid uint32) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	return cmd
}

type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// proc is a started command.
type proc struct {
	cmd       *exec.Cmd
	out, errb bytes.Buffer
	start     time.Time
	done      chan error
}

// startProc starts cmd, capturing what it writes unless its Stdout or
// Stderr are already set.
func startProc(t testing.TB, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	if cmd.Stdout == nil {
		cmd.Stdout = &p.out
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &p.errb
	}
	// A workload that outlives its launcher holds the output pipes open;
	// Wait must not wait for it once the launcher itself has exited.
	cmd.WaitDelay = 2 * time.Second
	p.start = time.Now()
	// It dies with this process, should the test be killed before its
	// cleanup.
	if err := testrun.Start(cmd); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// wait waits for the end of the command, bounded by waitFor.
func (p *proc) wait(t testing.TB) result {
	t.Helper()
	var err error
	select {
	case err = <-p.done:
	case <-time.After(waitFor):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("%v did not end within %s; stderr: %s", p.cmd.Args, waitFor, p.errb.String())
	}
	r := p.result(err)
	if r.code == -1 {
		t.Fatalf("%v: %v", p.cmd.Args, err)
	}
	return r
}

// result is the command's outcome: its exit status, 128+N for signal N,
// -1 when it could not be waited for.
func (p *proc) result(err error) result {
	r := result{stdout: p.out.String(), stderr: p.errb.String(), took: time.Since(p.start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.code = 128 + int(ws.Signal())
		}
	default:
		r.code = -1
	}
	return r
}

// waitQuiet is wait for goroutines other than the test's: it never fails
// the test itself; a command still running after limit is killed and
// reported with code -1.
func (p *proc) waitQuiet(limit time.Duration) result {
	var err error
	select {
	case err = <-p.done:
	case <-time.After(limit):
		_ = p.cmd.Process.Kill()
		<-p.done
		return result{code: -1, stdout: p.out.String(), stderr: p.errb.String() + "(killed: did not end in time)", took: time.Since(p.start)}
	}
	return p.result(err)
}

// run runs cmd to its end, bounded by waitFor.
func run(t testing.TB, cmd *exec.Cmd) result {
	t.Helper()
	return startProc(t, cmd).wait(t)
}

// waitStatus polls mpsd's status until cond holds, failing the test at the
// deadline with what it last saw.
func (e *testEnv) waitStatus(what string, cond func(api.Status) bool) api.Status {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st := e.d.Status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("waiting for %s: status is %+v", what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countLeases(st api.Status, state string) int {
	n := 0
	for _, l := range st.Leases {
		if l.State == state {
			n++
		}
	}
	return n
}

// gateShells are the pids of pids (a lease's processes, as status listed
// them) that are alive and not one of the gate's short-lived sleeps: the
// gate's shell, or the trampoline that would exec it (still mps-launch
// when its launcher died first, which is why shellPIDs' test of "sh" is
// not this one). It fails the test when none is left.
func gateShells(t *testing.T, pids []int) []int {
	t.Helper()
	var shells []int
	for _, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(comm)) != "sleep" {
			shells = append(shells, pid)
		}
	}
	if len(shells) == 0 {
		t.Fatalf("no gate shell left among %v: the workload died", pids)
	}
	return shells
}

// gate is a workload that runs until the test opens its gate file.
func (e *testEnv) gate(name string) (args []string, open func()) {
	path := filepath.Join(e.dir, "gate-"+name)
	script := fmt.Sprintf("while [ ! -e %s ]; do sleep 0.02; done", path)
	return []string{"/bin/sh", "-c", script}, func() {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
}

// syncBuffer is a log destination tests read while goroutines write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
