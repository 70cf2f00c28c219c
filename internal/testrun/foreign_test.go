package testrun_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
)

// foreignMpsd is the README's "Try it" mpsd (bin/mpsd --simulate, two
// simulated GPUs, one group, MPS emulator daemons), started the way a
// person would: no test run's variables, a directory no ledger names.
// Only its cgroup parent and metrics listener differ from the README, so
// that it cannot meet a real mpsd of the host.
type foreignMpsd struct {
	dir, socket, mpsctl string
	cmd                 *exec.Cmd
	pid                 int
	daemons             []int // its MPS control daemons
}

func startForeignMpsd(t *testing.T) *foreignMpsd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the README's mpsd makes cgroups")
	}
	bin := emutest.CmdDir(t)
	dir, err := os.MkdirTemp("", "mpsf") // short: MPS sockets live under it
	if err != nil {
		t.Fatal(err)
	}
	parent := testrun.CgroupName(fmt.Sprintf("foreign-%d", os.Getpid()))
	m := &foreignMpsd{dir: dir, socket: filepath.Join(dir, "mpsd.sock"), mpsctl: filepath.Join(bin, "mpsctl")}
	t.Cleanup(func() {
		if m.cmd != nil {
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
			_ = m.cmd.Wait()
		}
		// SIGTERM stops mpsd alone; its MPS daemons run on.
		pipes, _ := filepath.Glob(filepath.Join(dir, "run", "*", "*", "pipe"))
		for _, p := range pipes {
			emutest.KillByPipeDir(p)
		}
		emutest.RemoveCgroupTree(parent)
		_ = os.RemoveAll(dir)
	})
	cfg := fmt.Sprintf(`version: 1
socket: %[1]s/mpsd.sock
run_dir: %[1]s/run
state_dir: %[1]s/state
log_dir: %[1]s/log
cgroup:
  parent: %[2]s
metrics:
  listen: ""
groups:
  inference:
    users: [root]
    memory: 20G
simulate:
  gpus: 2
  emulator_dir: %[3]s
`, dir, parent, emutest.BinDir(t))
	if err := os.WriteFile(filepath.Join(dir, "mpsd.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "mpsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	m.cmd = exec.Command(filepath.Join(bin, "mpsd"), "--config", filepath.Join(dir, "mpsd.yaml"), "--simulate")
	m.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, testrun.EnvRun+"=") || strings.HasPrefix(kv, testrun.EnvEmuRun+"=")
	})
	m.cmd.Stdout, m.cmd.Stderr = log, log
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.pid = m.cmd.Process.Pid
	// mpsd has no readiness event a client can wait on but its answer:
	// ask until every instance is ready, bounded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := m.status()
		if err == nil && len(st.Instances) == 2 && !slices.ContainsFunc(st.Instances, func(in api.InstanceStatus) bool { return in.State != api.InstanceReady }) {
			for _, in := range st.Instances {
				m.daemons = append(m.daemons, in.DaemonPID)
			}
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("the README's mpsd not ready within 30s: %+v, %v; log:\n%s", st, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return m
}

func (m *foreignMpsd) status() (api.Status, error) {
	var st api.Status
	out, err := exec.Command(m.mpsctl, "--socket", m.socket, "status", "--json").Output()
	if err != nil {
		return st, fmt.Errorf("mpsctl status: %w", err)
	}
	return st, json.Unmarshal(out, &st)
}

// TestCheckLeavesForeignMpsd: on a host where the README's mpsd runs, with
// its MPS daemons, a run's check finds the run's leftovers and nothing of
// that mpsd, and cleaning them up leaves it as it was; make test's runner
// on a slice of the suite passes next to it; after both, it has the same
// pids and still answers. (The check once looked for every MPS process of
// the host and failed there.)
func TestCheckLeavesForeignMpsd(t *testing.T) {
	m := startForeignMpsd(t)
	// What the old check (every nvidia-cuda-mps-* and bin/mpsd of the
	// host) took for a test's leftovers.
	for _, pid := range m.daemons {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !strings.Contains(string(b), "nvidia-cuda-mps-control") {
			t.Fatalf("the README's mpsd's daemon %d: %q, %v; want an MPS control daemon", pid, b, err)
		}
	}
	run, err := testrun.Begin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// What a test of the run leaves: a process of the run, and an MPS
	// daemon stand-in whose pipe directory is in the run's ledger.
	t.Setenv(testrun.EnvRun, run)
	testDir, err := testrun.MkdirTemp(t.TempDir(), "mpst")
	if err != nil {
		t.Fatal(err)
	}
	var ours []int
	for _, env := range [][]string{testrun.Env(nil), {"CUDA_MPS_PIPE_DIRECTORY=" + testDir + "/run/g/GPU-x/pipe"}} {
		cmd := exec.Command("sleep", "1000")
		cmd.Env = env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		ours = append(ours, cmd.Process.Pid)
	}
	t.Setenv(testrun.EnvRun, "")

	left, err := testrun.Check(run)
	if err != nil {
		t.Fatal(err)
	}
	var found []int
	for _, p := range left.Procs {
		pid, _ := strconv.Atoi(strings.Fields(p)[0])
		found = append(found, pid)
	}
	slices.Sort(found)
	slices.Sort(ours)
	if !slices.Equal(found, ours) {
		t.Errorf("the check found\n%s\nwant exactly the run's %v (mpsd %d and its daemons %v are not the run's)", left, ours, m.pid, m.daemons)
	}
	if !slices.Equal(left.Dirs, []string{testDir}) || len(left.Cgroups) != 0 {
		t.Errorf("directories %q, cgroups %q: want only %s", left.Dirs, left.Cgroups, testDir)
	}
	if errs := left.Clean(); len(errs) > 0 {
		t.Errorf("Clean: %v", errs)
	}
	after, err := testrun.Check(run)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Empty() {
		t.Errorf("after Clean, with the README's mpsd running:\n%s", after)
	}

	// And make test's runner itself, on a slice of the suite, next to it.
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	runner := exec.Command(goCmd, "run", "./internal/testrun/cmd/testrun", "-count=1", "-run", "^TestMentions$", "./internal/testrun")
	runner.Dir = "../.."
	runner.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, testrun.EnvRun+"=") || strings.HasPrefix(kv, testrun.EnvEmuRun+"=")
	})
	out, err := runner.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "check-leftovers: no processes, cgroups") || !strings.Contains(string(out), "skipped tests: 0\n") {
		t.Errorf("make test's runner next to the README's mpsd: %v\n%s", err, out)
	}

	if m.cmd.ProcessState != nil || syscall.Kill(m.pid, 0) != nil {
		t.Fatalf("the README's mpsd %d is gone", m.pid)
	}
	st, err := m.status()
	if err != nil {
		t.Fatalf("the README's mpsd no longer answers: %v", err)
	}
	var daemons []int
	for _, in := range st.Instances {
		if in.State != api.InstanceReady {
			t.Errorf("instance %s/%s is %s after the check", in.Group, in.GPUUUID, in.State)
		}
		daemons = append(daemons, in.DaemonPID)
	}
	if !slices.Equal(daemons, m.daemons) {
		t.Errorf("its MPS daemons are %v, were %v", daemons, m.daemons)
	}
}
