package mpsd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Test users of the reconciliation tests.
const (
	reconUID      = 65000 // the group member: leases, and the offenders
	reconOtherUID = 65001 // a second member, who runs nothing
	reconOutsider = 65002 // no member of any group
)

// Reconciliation on the emulator, under each policy. One member of a
// group with two instances (GPU 0 and GPU 1) runs a leased client on each
// (the bystanders), and then, on instance 0 without mps-launch:
//   - an unleased mpsemu-client given instance 0's pipe directory;
//   - a lease placed on instance 1 whose command connects to instance 0's
//     pipe directory (a lease process on the wrong instance);
//   - a process NVML lists as a compute process on GPU 0 beside MPS (a
//     bypass), and the same for a root process (no member: reported,
//     never ended).
//
// Each offender is reported once (metric, log line naming kind, group,
// GPU and pid); under terminate each member's offender is ended, under
// report none is. The bystanders' leases keep running on their first
// attempt with the same processes, and no instance restarts.
func TestReconcileFindsAndEndsUnaccountedClients(t *testing.T) {
	for _, pol := range []string{"report", "terminate"} {
		t.Run(pol, func(t *testing.T) { testReconcile(t, pol) })
	}
}

// In a group with multiuser one server serves every member, so a pid
// MPS lists under it cannot be checked against the server's uid. One
// whose owner is no member of the group (a pid a client claimed, or one
// reused since it was listed) is reported under terminate, never ended:
// here a root client that became a non-member's uid once connected.
func TestReconcileSharedServerNeverEndsNonMembers(t *testing.T) {
	member := emutest.User(t, reconUID)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s]
    memory: 10G
    gpus: ["0"]
    multiuser: true
    reconcile: terminate
`, member), "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	by := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"), reconUID))
	st := e.waitStatus("the member's client on a live shared server", func(st api.Status) bool {
		in0 := instanceOf(st, "a", 0)
		return countLeases(st, api.LeaseRunning) == 1 && len(in0.ServerPIDs) == 1 && e.mpsClients(in0) == 1
	})
	in0 := instanceOf(st, "a", 0)
	cmd := exec.Command(client, "--duration", "1m", "--setuid-after-connect", strconv.Itoa(reconOutsider))
	cmd.Env = append(os.Environ(), api.EnvPipeDirectory+"="+Layout{RunDir: filepath.Join(e.dir, "run")}.PipeDir("a", in0.GPUUUID))
	outsider := startProc(t, cmd)

	e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", map[string]float64{reconUnleased: 1})
	e.waitLogAny(fmt.Sprintf("whose owner is no member of the group; reported, never ended\" group=a gpu=%s gpu_index=0 server=%d pid=%d uid=%d", in0.GPUUUID, in0.ServerPIDs[0], outsider.pid(), reconOutsider))
	e.waitLogAny(fmt.Sprintf("kind=%s group=a gpu=%s gpu_index=0 instance=a/0 pid=%d uid=%d", reconUnleased, in0.GPUUUID, outsider.pid(), reconOutsider))
	if b, _ := os.ReadFile(e.log.Name()); bytes.Contains(b, []byte(fmt.Sprintf("pid=%d uid=%d exe=%s action=terminated", outsider.pid(), reconOutsider, client))) {
		t.Errorf("mpsd logged the non-member's process %d as terminated", outsider.pid())
	}
	if !alive(outsider.pid()) {
		t.Errorf("the non-member's process %d was ended", outsider.pid())
	}
	if n := e.limSum("mpsd_unreconciled_clients_terminated_total"); n != 0 {
		t.Errorf("mpsd_unreconciled_clients_terminated_total = %v, want 0", n)
	}
	if l := e.d.Status().Leases; len(l) != 1 || l[0].Attempt != 1 || !alive(by.pid()) {
		t.Errorf("the member's lease: %+v; want it running at its first attempt", l)
	}
	_ = outsider.cmd.Process.Kill()
	outsider.wait(t)
	_ = by.cmd.Process.Signal(syscall.SIGTERM)
	by.wait(t)
}

func testReconcile(t *testing.T, pol string) {
	member, other := emutest.User(t, reconUID), emutest.User(t, reconOtherUID)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    gpus: ["0", "1"]
    reconcile: %s
`, member, other, pol), "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	by0 := startProc(t, asUID(e.launch("--gpu", "0", "--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"), reconUID))
	by1 := startProc(t, asUID(e.launch("--gpu", "1", "--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"), reconUID))
	st := e.waitStatus("both bystanders running on a live server", func(st api.Status) bool {
		in0, in1 := instanceOf(st, "a", 0), instanceOf(st, "a", 1)
		return countLeases(st, api.LeaseRunning) == 2 && len(in0.ServerPIDs) == 1 && len(in1.ServerPIDs) == 1 &&
			e.mpsClients(in0) == 1 && e.mpsClients(in1) == 1
	})
	in0 := instanceOf(st, "a", 0)
	byPids := map[string][]int{}
	for _, l := range st.Leases {
		byPids[l.ID] = l.PIDs
	}
	pipe0 := Layout{RunDir: filepath.Join(e.dir, "run")}.PipeDir("a", in0.GPUUUID)

	// The offenders.
	unleasedCmd := asUID(exec.Command(client, "--duration", "1m"), reconUID)
	unleasedCmd.Env = append(os.Environ(), api.EnvPipeDirectory+"="+pipe0)
	unleased := startProc(t, unleasedCmd)
	wrong := startProc(t, asUID(e.launch("--gpu", "1", "--sm", "10", "--mem", "1G", "--no-requeue", "--",
		"/bin/sh", "-c", `unset CUDA_VISIBLE_DEVICES; CUDA_MPS_PIPE_DIRECTORY="$1" exec "$0" --duration 1m`, client, pipe0), reconUID))
	bypass := startProc(t, asUID(exec.Command("sleep", "300"), reconUID))
	rootBypass := startProc(t, exec.Command("sleep", "300"))
	for _, p := range []*proc{bypass, rootBypass} {
		if err := e.sim.SetProcessMemory(0, p.pid(), gpu.ProcessCompute, 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	wrongPid := 0
	if pol == "report" {
		// (Under terminate they may be gone before a look at the status.)
		st = e.waitStatus("the wrong-instance lease running and both offending clients on instance 0's server", func(st api.Status) bool {
			return countLeases(st, api.LeaseRunning) == 3 && e.mpsClients(instanceOf(st, "a", 0)) == 3
		})
		for _, l := range st.Leases {
			if _, bystander := byPids[l.ID]; !bystander && len(l.PIDs) > 0 {
				wrongPid = l.PIDs[0]
			}
		}
	}

	want := map[string]float64{reconUnleased: 1, reconWrongInstance: 1, reconBypass: 1}
	e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", want)
	e.reconWaitMetric("mpsd_unreconciled_clients_total", "", map[string]float64{reconBypass: 1})
	for kind, pid := range map[string]int{reconUnleased: unleased.pid(), reconWrongInstance: wrongPid, reconBypass: bypass.pid()} {
		line := fmt.Sprintf("kind=%s group=a gpu=%s gpu_index=0 instance=a/0 pid=", kind, in0.GPUUUID)
		if pid != 0 {
			line += strconv.Itoa(pid)
		}
		e.waitLogAny(line)
	}
	e.waitLogAny("action=" + map[string]string{"report": "reported", "terminate": "terminated"}[pol] + " server=" + strconv.Itoa(in0.ServerPIDs[0]) + " lease=")
	e.waitLogAny(fmt.Sprintf("kind=bypass group=\"\" gpu=%s gpu_index=0 instance=a/0 pid=%d uid=0", in0.GPUUUID, rootBypass.pid()))

	if pol == "terminate" {
		if r := unleased.wait(t); r.code != 90 && r.code != 128+9 {
			t.Errorf("unleased client: exit %d (stderr %q), want 90 (terminated, CUDA error 810) or SIGKILL", r.code, r.stderr)
		}
		if r := wrong.wait(t); r.code != 90 && r.code != 128+9 {
			t.Errorf("wrong-instance lease: mps-launch exit %d (stderr %q), want its command's 90 or SIGKILL", r.code, r.stderr)
		}
		if r := bypass.wait(t); r.code != 128+9 {
			t.Errorf("member's bypass process: exit %d, want SIGKILL", r.code)
		}
		e.reconWaitMetric("mpsd_unreconciled_clients_terminated_total", "a", want)
	} else {
		for _, p := range []*proc{unleased, wrong, bypass} {
			if !alive(p.pid()) {
				t.Errorf("%v ended under reconcile: report", p.cmd.Args)
			}
		}
		if n := e.limSum("mpsd_unreconciled_clients_terminated_total"); n != 0 {
			t.Errorf("mpsd_unreconciled_clients_terminated_total = %v under report", n)
		}
	}
	// Root's process is never ended.
	if !alive(rootBypass.pid()) {
		t.Error("root's bypass process was ended")
	}
	if n := e.reconMetric("mpsd_unreconciled_clients_terminated_total", "", reconBypass); n != 0 {
		t.Errorf("terminated of no group = %v", n)
	}

	// The bystanders: running, first attempt, same processes; no instance
	// restarted; found once, not once per probe.
	after := e.d.Status()
	for id, pids := range byPids {
		var found bool
		for _, l := range after.Leases {
			if l.ID == id {
				found = true
				if l.State != api.LeaseRunning || l.Attempt != 1 || fmt.Sprint(l.PIDs) != fmt.Sprint(pids) {
					t.Errorf("bystander %s: %+v, want running, attempt 1, pids %v", id, l, pids)
				}
			}
		}
		if !found {
			t.Errorf("bystander %s gone", id)
		}
	}
	for _, in := range after.Instances {
		if in.Restarts != 0 {
			t.Errorf("instance %s/%d restarted %d times", in.Group, in.GPUIndex, in.Restarts)
		}
	}
	for _, p := range []*proc{by0, by1} {
		if !alive(p.pid()) {
			t.Errorf("bystander launcher %v ended", p.cmd.Args)
		}
	}
	for kind, n := range want {
		if got := e.reconMetric("mpsd_unreconciled_clients_total", "a", kind); got != n {
			t.Errorf("mpsd_unreconciled_clients_total{group=a,kind=%s} = %v after the findings, want %v", kind, got, n)
		}
	}
	if b, _ := os.ReadFile(e.log.Name()); bytes.Count(b, []byte("kind=unleased")) != 1 {
		t.Errorf("the unleased client was reported %d times, want once", bytes.Count(b, []byte("kind=unleased")))
	}
}

// reconMetric is one series of a reconciliation counter.
func (e *testEnv) reconMetric(name, group, kind string) float64 {
	e.t.Helper()
	fams, err := e.d.metricsGatherer().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var g, k string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "group":
					g = l.GetValue()
				case "kind":
					k = l.GetValue()
				}
			}
			if g == group && k == kind {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// reconWaitMetric waits until the counter's series of group reach want, by kind.
func (e *testEnv) reconWaitMetric(name, group string, want map[string]float64) {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ok := true
		got := map[string]float64{}
		for kind, n := range want {
			got[kind] = e.reconMetric(name, group, kind)
			ok = ok && got[kind] >= n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s{group=%q} = %v, want %v", name, group, got, want)
		}
		time.Sleep(20 * time.Millisecond) // a metric offers nothing to wait on
	}
}

// A lease whose two processes together hold more device memory than its
// --mem (MPS caps each process, not the lease) is revoked once it has been
// over for the group's memory_grace, with the reason, and not requeued:
// mps-launch exits 125 saying why. A lease on the same instance within
// its limit runs on untouched.
func TestLeaseOverMemoryRevoked(t *testing.T) {
	member := emutest.User(t, reconUID)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s]
    memory: 10G
    gpus: ["0"]
    memory_grace: 1s
`, member), "metrics:\n  listen: \"\"\n  per_lease: true")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	bystander := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--alloc", "700M", "--duration", "1m"), reconUID))
	// Its usage as NVML reports it: in the status and, summed, per group.
	e.waitStatus("the bystander running with 700 MiB in use", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && st.Leases[0].MemUsedBytes != nil && *st.Leases[0].MemUsedBytes == 700<<20
	})
	if got := e.limMetric("mpsd_lease_memory_used_bytes", map[string]string{"group": "a"}); got != 700<<20 {
		t.Errorf("mpsd_lease_memory_used_bytes{group=a} = %v, want 700 MiB", got)
	}
	st := e.d.Status()
	if got := e.limMetric("mpsd_lease_memory_used_bytes_by_lease", map[string]string{"group": "a", "lease": st.Leases[0].ID}); got != 700<<20 {
		t.Errorf("mpsd_lease_memory_used_bytes_by_lease (metrics.per_lease) = %v, want 700 MiB", got)
	}
	over := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c",
		`"$0" --alloc 700M --duration 1m & "$0" --alloc 700M --duration 1m & wait`, client), reconUID))
	r := over.wait(t)
	if r.code != 125 || !strings.Contains(r.stderr, "memory limit exceeded") || !strings.Contains(r.stderr, "not requeued") {
		t.Errorf("the lease over its memory: exit %d, stderr %q; want 125 and the reason", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "requeued, attempt") {
		t.Errorf("the lease over its memory was requeued: %q", r.stderr)
	}
	st = e.waitStatus("only the bystander left", func(st api.Status) bool { return len(st.Leases) == 1 })
	if l := st.Leases[0]; l.State != api.LeaseRunning || l.Attempt != 1 {
		t.Errorf("bystander: %+v, want running on its first attempt", l)
	}
	if !alive(bystander.pid()) {
		t.Error("the bystander's launcher ended")
	}
	e.waitLogAny("lease revoked: memory limit exceeded")
	// Its history: ended over its limit, at the most memory it held.
	if h := e.history(0); len(h.Records) != 1 || h.Records[0].Ended != api.EndedOverLimit ||
		h.Records[0].PeakMemBytes == nil || *h.Records[0].PeakMemBytes != 1400<<20 {
		t.Errorf("history: %+v; want the lease over its memory, ended over_limit at a peak of 1400 MiB", h.Records)
	}
}
