package mpsd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
	"github.com/mpsd/mpsd/internal/procstat"
)

// ptyReader collects what mps-launch writes on a terminal.
type ptyReader struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (p *ptyReader) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.String()
}

func readPTY(master *os.File) *ptyReader {
	r := &ptyReader{}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			r.mu.Lock()
			r.buf.Write(b[:n])
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return r
}

// Five --sm 40 launches on two GPUs with a 100% budget each: four run,
// the fifth waits (its terminal shows its place in the queue) and starts
// as soon as one of the four ends.
func TestCapacityQueue(t *testing.T) {
	e := newEnv(t, `  inference:
    users: [root]
    sm_percent: 100
    memory: 20G
`, "")
	e.start()
	var opens []func()
	var procs []*proc
	for i := range 4 {
		args, open := e.gate(string(rune('a' + i)))
		opens = append(opens, open)
		procs = append(procs, startProc(t, e.launch(append([]string{"--sm", "40", "--mem", "1G", "--"}, args...)...)))
	}
	e.waitStatus("four running leases", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 4 })

	master, slave := apitest.OpenPTY(t)
	term := readPTY(master)
	args, openFifth := e.gate("e")
	fifth := e.launch(append([]string{"--sm", "40", "--mem", "1G", "--"}, args...)...)
	fifth.Stderr = slave
	fp := startProc(t, fifth)
	st := e.waitStatus("the fifth queued", func(st api.Status) bool { return st.Queue["inference"] == 1 })
	if n := countLeases(st, api.LeaseRunning); n != 4 {
		t.Fatalf("%d leases running with one queued, want 4", n)
	}
	for _, in := range st.Instances {
		if in.SMAllocated != 80 || in.Clients != 2 {
			t.Errorf("instance %d: sm %d%%, %d clients; want 80%% and 2", in.GPUIndex, in.SMAllocated, in.Clients)
		}
	}
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(term.String(), "queued, position 1 in group inference") {
		if time.Now().After(deadline) {
			t.Fatalf("terminal shows %q, want the queue position", term.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	opens[0]()
	if r := procs[0].wait(t); r.code != 0 {
		t.Fatalf("first launch: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the fifth running", func(st api.Status) bool {
		return st.Queue["inference"] == 0 && countLeases(st, api.LeaseRunning) == 4
	})
	openFifth()
	for _, open := range opens[1:] {
		open()
	}
	for i, p := range append(procs[1:], fp) {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("launch %d: exit %d, stderr %q", i+2, r.code, r.stderr)
		}
	}
	e.waitStatus("no leases", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// --no-wait gives up at once when the group is full, --wait after the
// time it names; both exit 75 (EX_TEMPFAIL) and leave no lease behind.
func TestNoWaitAndWaitTimeout(t *testing.T) {
	e := newEnv(t, `  inference:
    users: [root]
    memory: 20G
    gpus: ["0"]
`, "")
	e.start()
	args, open := e.gate("full")
	holder := startProc(t, e.launch(append([]string{"--sm", "100", "--mem", "1G", "--"}, args...)...))
	e.waitStatus("the GPU full", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })

	r := run(t, e.launch("--sm", "10", "--mem", "1G", "--no-wait", "--", "/bin/true"))
	if r.code != 75 {
		t.Fatalf("--no-wait: exit %d, want 75; stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "no room") {
		t.Errorf("--no-wait: stderr %q does not say there is no room", r.stderr)
	}
	r = run(t, e.launch("--sm", "10", "--mem", "1G", "--wait", "1s", "--", "/bin/true"))
	if r.code != 75 {
		t.Fatalf("--wait 1s: exit %d, want 75; stderr %q", r.code, r.stderr)
	}
	if r.took < time.Second || r.took > 10*time.Second {
		t.Errorf("--wait 1s gave up after %s", r.took)
	}
	st := e.d.Status()
	if len(st.Leases) != 1 || st.Queue["inference"] != 0 {
		t.Errorf("after the timeouts: %d leases, %d queued; want only the holder", len(st.Leases), st.Queue["inference"])
	}
	open()
	if r := holder.wait(t); r.code != 0 {
		t.Fatalf("holder: exit %d, stderr %q", r.code, r.stderr)
	}
}

func daemonPIDs(st api.Status) map[string]int {
	m := map[string]int{}
	for _, in := range st.Instances {
		m[in.Group+"/"+in.GPUUUID] = in.DaemonPID
	}
	return m
}

func leaseIDs(st api.Status) []string {
	var ids []string
	for _, l := range st.Leases {
		ids = append(ids, l.ID)
	}
	slices.Sort(ids)
	return ids
}

// Stopping mpsd (SIGTERM) kills no workload; the next mpsd re-adopts the
// MPS daemons and the leases, the launchers resume their leases, and
// status shows the same leases, which end normally afterwards.
func TestRestartKeepsLeases(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	var opens []func()
	var procs []*proc
	for _, name := range []string{"r1", "r2"} {
		args, open := e.gate(name)
		opens = append(opens, open)
		procs = append(procs, startProc(t, e.launch(append([]string{"--sm", "20", "--mem", "2G", "--"}, args...)...)))
	}
	before := e.waitStatus("two running workloads", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 2 && len(shellPIDs(st)) == 2
	})
	workload := shellPIDs(before)

	e.stop()
	for _, pid := range workload {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("workload pid %d gone after mpsd stopped: %v", pid, err)
		}
	}
	e.start()
	after := e.waitStatus("the leases re-adopted", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 2 })
	if !slices.Equal(leaseIDs(after), leaseIDs(before)) {
		t.Errorf("leases after restart %v, before %v", leaseIDs(after), leaseIDs(before))
	}
	if !maps.Equal(daemonPIDs(after), daemonPIDs(before)) {
		t.Errorf("MPS daemons after restart %v, before %v: they were not adopted", daemonPIDs(after), daemonPIDs(before))
	}
	out, err := exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "status", "--json").Output()
	if err != nil {
		t.Fatalf("mpsctl status --json: %v", err)
	}
	var shown api.Status
	if err := json.Unmarshal(out, &shown); err != nil {
		t.Fatalf("mpsctl status --json: %v\n%s", err, out)
	}
	if !slices.Equal(leaseIDs(shown), leaseIDs(before)) {
		t.Errorf("mpsctl status shows leases %v, want %v", leaseIDs(shown), leaseIDs(before))
	}
	// The launchers resumed their leases: when the workloads end, the
	// leases end at once (an abandoned lease would wait out its grace).
	for _, open := range opens {
		open()
	}
	for i, p := range procs {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("launch %d: exit %d, stderr %q", i+1, r.code, r.stderr)
		}
	}
	e.waitStatus("no leases", func(st api.Status) bool { return len(st.Leases) == 0 })
}

func groupsAB(bMemory string) string {
	return `  a:
    users: [root]
    memory: 10G
  b:
    users: [root]
    memory: ` + bMemory + `
`
}

// A config edit changes only what it names: group b's new budget applies
// to its next admissions without restarting anything, group a's daemons
// are untouched, a removed group's daemons stop and an added group's
// start.
func TestReloadTouchesOnlyWhatChanged(t *testing.T) {
	e := newEnv(t, groupsAB("10G"), "")
	e.start()
	before := daemonPIDs(e.d.Status())
	if len(before) != 4 {
		t.Fatalf("instances %v, want 2 groups × 2 GPUs", before)
	}
	// One supervisor goroutine per instance (supervisor.go).
	if n := e.d.supervisors.Load(); n != 4 {
		t.Errorf("%d instance supervisors run, want 4", n)
	}

	e.writeConfig(groupsAB("15G"), "")
	st := e.waitStatus("group b's new budget", func(st api.Status) bool {
		for _, in := range st.Instances {
			if in.Group == "b" && in.MemBudgetBytes != 15<<30 {
				return false
			}
		}
		return true
	})
	if got := daemonPIDs(st); !maps.Equal(got, before) {
		t.Errorf("daemons after a budget change %v, before %v", got, before)
	}
	for _, in := range st.Instances {
		if in.Group == "a" && in.MemBudgetBytes != 10<<30 {
			t.Errorf("group a's budget became %d", in.MemBudgetBytes)
		}
	}
	// The new budget admits what the old one refused as never fitting.
	if r := run(t, e.launch("--group", "b", "--sm", "10", "--mem", "12G", "--", "/bin/true")); r.code != 0 {
		t.Errorf("--mem 12G in b after the raise: exit %d, stderr %q", r.code, r.stderr)
	}

	e.writeConfig(`  a:
    users: [root]
    memory: 10G
  c:
    users: [root]
    memory: 5G
`, "")
	st = e.waitStatus("b gone and c ready", func(st api.Status) bool {
		ready := 0
		for _, in := range st.Instances {
			if in.Group == "b" {
				return false
			}
			if in.Group == "c" && in.State == api.InstanceReady {
				ready++
			}
		}
		return ready == 2
	})
	for key, pid := range daemonPIDs(st) {
		if strings.HasPrefix(key, "a/") && pid != before[key] {
			t.Errorf("group a's daemon %s changed from %d to %d", key, before[key], pid)
		}
	}
	for key, pid := range before {
		if strings.HasPrefix(key, "b/") {
			emutestWaitGone(t, pid)
		}
	}
	// b's two supervisors ended with its instances; c's two began.
	waitCond(t, "one supervisor per instance after the reload", func() bool { return e.d.supervisors.Load() == 4 },
		func() string { return fmt.Sprintf("%d supervisors run", e.d.supervisors.Load()) })
	// A bad edit is refused and the config in force stays.
	if err := os.WriteFile(e.cfgPath, []byte("version: 1\ngroups: {a: {memroy: 1G}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, e.launch("--group", "c", "--sm", "10", "--mem", "1G", "--", "/bin/true")); r.code != 0 {
		t.Errorf("launch in c after a bad edit: exit %d, stderr %q", r.code, r.stderr)
	}
}

// emutestWaitGone waits until pid is gone (or a zombie: an orphan's
// reaper here may be slow), failing the test at the deadline.
func emutestWaitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	alive := func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		// The state follows the command name in parentheses.
		i := bytes.LastIndexByte(b, ')')
		return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
	}
	for alive() {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A lease whose launcher died while mpsd was down is not kept for ever:
// if its command has ended it is released at once; if the command still
// runs, it is killed and released when the reconnect grace is over.
func TestAdoptedLeaseWithoutLauncher(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endFirst bool // the command ends while mpsd is down
		grace    time.Duration
	}{
		{"command ended", true, time.Hour},
		{"command still running", false, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, oneGroup, "")
			e.start()
			args, open := e.gate("g")
			p := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, args...)...))
			// The shell itself: before it runs, the launcher's death would
			// stop the trampoline from ever starting it.
			st := e.waitStatus("a running workload", func(st api.Status) bool { return len(shellPIDs(st)) == 1 })
			workload := shellPIDs(st)[0]
			e.stop()
			_ = p.cmd.Process.Kill()
			p.wait(t)
			if tc.endFirst {
				open()
				emutestWaitGone(t, workload)
			}
			e.opts.ReconnectGrace = tc.grace
			e.start()
			if st := e.d.Status(); len(st.Leases) != 1 {
				t.Fatalf("after the restart: %d leases, want the one re-adopted", len(st.Leases))
			}
			start := time.Now()
			e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
			if took := time.Since(start); !tc.endFirst && took < tc.grace/2 {
				t.Errorf("lease of a running command released after %s, before the grace of %s", took, tc.grace)
			}
			emutestWaitGone(t, workload)
		})
	}
}

// shellPIDs are the gate shells of the running leases: the workload, not
// the short sleeps it runs, nor the trampoline it was a moment before.
func shellPIDs(st api.Status) []int {
	var out []int
	for _, l := range st.Leases {
		for _, pid := range l.PIDs {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			if err != nil {
				continue
			}
			ps, err := procstat.Parse(string(b))
			// A fork of the gate's shell that has not yet become its
			// sleep is named sh too, and is gone a moment later: only a
			// shell whose parent is no process of the lease is the
			// workload.
			if err == nil && ps.Comm == "sh" && !slices.Contains(l.PIDs, ps.PPID) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// mps.compute_mode: exclusive_process puts the instances' GPUs in
// EXCLUSIVE_PROCESS while mpsd runs and restores them when it stops.
func TestComputeModeExclusive(t *testing.T) {
	e := newEnv(t, `  a:
    users: [root]
    memory: 10G
    gpus: ["0"]
`, "mps:\n  compute_mode: exclusive_process")
	e.start()
	sim := e.sim
	mode := func(i int) nvml.ComputeMode {
		dev, ret := sim.NVML().DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		m, ret := dev.GetComputeMode()
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		return m
	}
	if m := mode(0); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 0 compute mode %v while mpsd runs, want EXCLUSIVE_PROCESS", m)
	}
	if m := mode(1); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 1 (no instance) compute mode %v, want DEFAULT", m)
	}
	e.stop()
	// mpsd shut NVML down; look again as another NVML user would.
	if ret := sim.NVML().Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer sim.NVML().Shutdown()
	if m := mode(0); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 0 compute mode %v after mpsd stopped, want DEFAULT again", m)
	}
}

// A lease whose launcher is gone is not kept alive by restarts: the time
// it has waited for its launcher is in the state file and the grace runs
// on from there, instead of starting again at every start of mpsd.
func TestAwayLeaseGraceSurvivesRestarts(t *testing.T) {
	e := newEnv(t, `  a:
    users: [root]
    memory: 10G
`, "")
	e.opts.ReconnectGrace = time.Hour
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"))
	e.waitStatus("the lease running with its client", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	e.stop()
	_ = p.cmd.Process.Signal(syscall.SIGKILL) // the launcher never comes back
	p.waitQuiet(waitFor)
	awaySince := func() time.Time {
		t.Helper()
		b := e.stateBytes()
		var st savedState
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Leases) != 1 {
			t.Fatalf("state has %d leases, want 1", len(st.Leases))
		}
		return st.Leases[0].AwaySince
	}
	if got := awaySince(); !got.IsZero() {
		t.Fatalf("a lease whose launcher was connected at the stop is saved as away since %v", got)
	}
	e.start()
	e.stop()
	first := awaySince()
	if first.IsZero() {
		t.Fatal("a lease waiting for its launcher is saved without the time it began waiting")
	}
	e.start()
	e.stop()
	if again := awaySince(); !again.Equal(first) {
		t.Errorf("a restart renewed the lease's grace: away since %v, then %v", first, again)
	}
	// With that time older than the grace, the next mpsd releases it.
	e.opts.ReconnectGrace = time.Millisecond
	e.start()
	e.waitStatus("the abandoned lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A re-adopted lease counts as ended when its cgroup empties only if its
// current attempt ran: one granted again while its launcher was away has
// run nothing yet (an empty or leftover cgroup says nothing), and waits
// for its launcher.
func TestSettledOnlyForAttemptsThatRan(t *testing.T) {
	e := newEnv(t, `  a:
    users: [root]
    memory: 10G
    requeue_attempts: 3
`, "")
	e.opts.ReconnectGrace = time.Hour
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"))
	st := e.waitStatus("the lease running with its client", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	id := st.Leases[0].ID
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }()
	e.stop()
	e.start()
	lease := func() *lease {
		e.d.mu.Lock()
		defer e.d.mu.Unlock()
		return e.d.leases[id]
	}
	e.waitStatus("the instances up", func(st api.Status) bool {
		return all(st.Instances, func(in api.InstanceStatus) bool { return in.State == api.InstanceReady })
	})
	if !e.d.settled(lease()) {
		t.Error("the re-adopted attempt that ran is not settled")
	}
	body, _ := json.Marshal(api.RequeueRequest{Lease: id})
	if status, _, b := inpPost(t, e.socket, api.PathRequeue, body); status != http.StatusOK {
		t.Fatalf("requeue: %d %s", status, b)
	}
	e.waitStatus("attempt 2 running", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].Attempt == 2 && st.Leases[0].State == api.LeaseRunning
	})
	if e.d.settled(lease()) {
		t.Error("attempt 2, granted while the launcher was away and never run, counts as ended")
	}
}
