package slurmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
)

// waitFor bounds every wait of these tests; reaching it fails the test.
const waitFor = 30 * time.Second

// requireEnv makes a missing prerequisite a failure instead of a skip.
const requireEnv = "MPSD_REQUIRE_SLURM"

// markerEnv is set, to the test's directory, in the environment of every
// process the tests start; cleanup finds what is left by it.
const markerEnv = "MPSD_SLURMTEST_DIR"

// missing skips the test because of why, or fails it under
// MPSD_REQUIRE_SLURM=1.
func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("%s (%s=1 requires it)", why, requireEnv)
	}
	t.Skipf("skipping: %s", why)
}

// shortDir makes a temporary directory with a short path (MPS pipe
// directories under it hold unix sockets, whose paths are limited to 107
// bytes), traversable by everyone (munged insists on that for its socket's
// directory), and removes it when the test ends, after every other
// cleanup.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := testrun.MkdirTemp("", "mpsd-slurm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		killMarked(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// killMarked waits a moment for the processes whose environment carries
// the marker of dir to end (a slurmstepd finishing its job's last
// bookkeeping), then SIGKILLs the rest and fails the test for each:
// cleanup should have stopped them all, in order.
func killMarked(t testing.TB, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	left := marked(dir)
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		left = marked(dir)
	}
	for _, pid := range left {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		t.Errorf("process %d (%s) outlived the test's cleanup; killing it", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		_ = syscall.Kill(pid, syscall.SIGKILL)
		emutest.WaitGone(pid)
	}
}

// marked lists the live processes whose environment has the marker of
// dir.
func marked(dir string) []int {
	needle := []byte(markerEnv + "=" + dir + "\x00")
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && bytes.Contains(env, needle) && emutest.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// baseEnv is this process's environment without what would leak into the
// programs the tests run: a Slurm job's variables (when the tests run
// inside one), CUDA's and mpsd's.
func baseEnv(dir string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SLURM_") || strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "MPSD_") || k == testrun.EnvEmuRun {
			continue
		}
		env = append(env, kv)
	}
	return append(testrun.Env(append(env, markerEnv+"="+dir)), extra...)
}

var mpsdSeq atomic.Int64

// mpsdEnv is one mpsd --simulate, run as a process from the built
// binaries, with the MPS emulator and (as root) real cgroups.
type mpsdEnv struct {
	t        testing.TB
	dir      string
	cfgPath  string
	socket   string
	bin      string // mpsd, mps-launch, mpsctl
	emu      string // the emulator's programs
	cgParent string
	logPath  string
	cmd      *exec.Cmd
	done     chan struct{}
	stopped  sync.Once
	hc       *http.Client
}

// startMpsd writes a config for two simulated GPUs with groups (YAML
// indented as under `groups:`) into dir and starts mpsd on it; it returns
// once every instance is ready. Cleanup stops mpsd, then the MPS daemons
// it left running (by design SIGTERM stops mpsd alone) and removes its
// cgroups.
func startMpsd(t testing.TB, dir, groups string) *mpsdEnv {
	t.Helper()
	e := &mpsdEnv{
		t:       t,
		dir:     dir,
		cfgPath: filepath.Join(dir, "mpsd.yaml"),
		socket:  filepath.Join(dir, "mpsd.sock"),
		bin:     emutest.CmdDir(t),
		emu:     emutest.BinDir(t),
		logPath: filepath.Join(dir, "mpsd.log"),
		done:    make(chan struct{}),
	}
	cgroup := "  enabled: false"
	if os.Geteuid() == 0 {
		// Named for the test run, whose leftover check looks for it.
		e.cgParent = testrun.CgroupName(fmt.Sprintf("slurm-%d-%d", os.Getpid(), mpsdSeq.Add(1)))
		cgroup = "  parent: " + e.cgParent
	}
	cfg := fmt.Sprintf(`version: 1
socket: %[1]s/mpsd.sock
run_dir: %[1]s/run
state_dir: %[1]s/state
log_dir: %[1]s/log
cgroup:
%[2]s
metrics:
  listen: ""
admins:
  users: ["%[5]d"]
watchdog:
  backoff_initial: 50ms
  backoff_max: 1s
simulate:
  gpus: 2
  model: a100-40g
  emulator_dir: %[3]s
groups:
%[4]s`, dir, cgroup, e.emu, groups, os.Geteuid())
	if err := os.WriteFile(e.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(e.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	e.cmd = exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate", "--log-level", "debug")
	e.cmd.Env = baseEnv(dir)
	e.cmd.Stdout, e.cmd.Stderr = log, log
	e.hc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", e.socket)
		},
	}}
	if err := testrun.Start(e.cmd); err != nil {
		t.Fatalf("start mpsd: %v", err)
	}
	go func() { _ = e.cmd.Wait(); close(e.done) }()
	t.Cleanup(e.stop)
	e.waitStatus("every instance ready", func(st api.Status) bool {
		if len(st.Instances) == 0 {
			return false
		}
		for _, in := range st.Instances {
			if in.State != api.InstanceReady {
				return false
			}
		}
		return true
	})
	return e
}

// stop stops mpsd and everything it started; it runs once, at cleanup or
// when a test wants a dead mpsd.
func (e *mpsdEnv) stop() { e.stopped.Do(e.doStop) }

func (e *mpsdEnv) doStop() {
	if e.cmd.Process != nil {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(waitFor):
			e.t.Errorf("mpsd did not stop within %s of SIGTERM; killing it", waitFor)
			_ = e.cmd.Process.Kill()
			<-e.done
		}
	}
	e.hc.CloseIdleConnections()
	pipes, _ := filepath.Glob(filepath.Join(e.dir, "run", "*", "*", "pipe"))
	for _, p := range pipes {
		emutest.KillByPipeDir(p)
	}
	if e.cgParent != "" {
		emutest.RemoveCgroupTree(e.cgParent)
	}
	if e.t.Failed() {
		b, _ := os.ReadFile(e.logPath)
		if len(b) > 20000 {
			b = b[len(b)-20000:]
		}
		e.t.Logf("mpsd log (tail):\n%s", b)
	}
}

// status is mpsd's status document.
func (e *mpsdEnv) status() (api.Status, error) {
	var st api.Status
	resp, err := e.hc.Get("http://mpsd" + api.PathStatus)
	if err != nil {
		return st, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// waitStatus polls mpsd's status until cond holds, and returns it.
func (e *mpsdEnv) waitStatus(what string, cond func(api.Status) bool) api.Status {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := e.status()
		if err == nil && cond(st) {
			return st
		}
		select {
		case <-e.done:
			e.t.Fatalf("mpsd exited while waiting for %s", what)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %s within %s: last status %+v, %v", what, waitFor, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leaseOfJob returns the lease tagged with job, if any.
func leaseOfJob(st api.Status, job string) (api.LeaseStatus, bool) {
	for _, l := range st.Leases {
		if l.JobID == job {
			return l, true
		}
	}
	return api.LeaseStatus{}, false
}

// crashServer SIGKILLs the MPS server of the client whose limits line
// ("mpsemu-client: pid=P server=S ...") is in out: a crashed MPS server,
// as the watchdog sees one.
func crashServer(t testing.TB, e *mpsdEnv, out string) {
	t.Helper()
	m := regexp.MustCompile(`mpsemu-client: pid=\d+ server=(\d+) `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no client limits line in:\n%s", out)
	}
	pid, _ := strconv.Atoi(m[1])
	// Once mpsd has verified the server: a server killed before that is
	// one mpsd cannot tell from a record anyone could forge (its pidfd
	// can no longer be opened), and is no fault of its to act on.
	e.waitStatus(fmt.Sprintf("MPS server %d verified", pid), func(st api.Status) bool {
		for _, in := range st.Instances {
			if slices.Contains(in.ServerPIDs, pid) {
				return true
			}
		}
		return false
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill MPS server %d: %v", pid, err)
	}
}

// waitFile polls path until it contains want, and returns its content.
func waitFile(t testing.TB, path, want string) string {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has no %q within %s; it has:\n%s", path, want, waitFor, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
