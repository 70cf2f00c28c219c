package mpsd

import (
	"encoding/json"
	"fmt"
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

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// faultGroups: group a on both GPUs, group b on both but filled on GPU 0
// (binpack). Fast probes so a hung daemon is found quickly.
const faultGroups = `  a:
    users: [root]
    memory: 20G
    requeue_attempts: 3
  b:
    users: [root]
    memory: 10G
`

const faultWatchdog = `watchdog:
  probe_interval: 250ms
  probe_timeout: 200ms
  probe_failures: 2
  backoff_initial: 50ms
  backoff_max: 1s
  quarantine_after: 3
  quarantine_window: 1m`

// faultEnv is the scenario of the fault-isolation acceptance: on GPU 0,
// group a with three clients (the victims) and group b with two; on GPU 1
// group a with one. Every workload is an emulated CUDA client connected to
// its instance's MPS server.
type faultEnv struct {
	*testEnv
	victims    []*proc
	bystanders []*proc
	byLeases   map[string][]int // bystander lease → its pids when the fault came
	a0, a1, b0 api.InstanceStatus
	faults     chan fault // as the watchdog saw them
}

// firstFault is the first fault the watchdog reported.
func (e *faultEnv) firstFault(t *testing.T) fault {
	t.Helper()
	select {
	case f := <-e.faults:
		return f
	case <-time.After(waitFor):
		t.Fatal("no fault reported")
		return fault{}
	}
}

func newFaultEnv(t *testing.T, victimCmd func(i int, client string) []string, victimArgs ...string) *faultEnv {
	t.Helper()
	e := &faultEnv{testEnv: newEnv(t, faultGroups, faultWatchdog), faults: make(chan fault, 64)}
	e.opts.faultHook = func(in *instance, f fault) {
		select {
		case e.faults <- f:
		default:
		}
	}
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	launch := func(group string, args ...string) *proc {
		p := startProc(t, e.launch(append([]string{"--group", group, "--sm", "30", "--mem", "1G"}, args...)...))
		return p
	}
	running := 0
	wait := func() {
		running++
		e.waitStatus(fmt.Sprintf("%d leases running", running), func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == running })
	}
	for i := range 3 {
		cmd := []string{"--", client, "--duration", "3s"}
		if victimCmd != nil {
			cmd = append([]string{"--"}, victimCmd(i, client)...)
		}
		e.victims = append(e.victims, launch("a", append(victimArgs, cmd...)...))
		wait()
	}
	for range 2 {
		e.bystanders = append(e.bystanders, launch("b", "--", client, "--duration", "6s"))
		wait()
	}
	e.bystanders = append(e.bystanders, launch("a", "--", client, "--duration", "6s"))
	wait()
	st := e.waitStatus("every client connected", func(st api.Status) bool {
		for _, in := range st.Instances {
			if in.Clients > 0 && (len(in.ServerPIDs) == 0 || e.mpsClients(in) < in.Clients) {
				return false
			}
		}
		return true
	})
	for _, in := range st.Instances {
		switch {
		case in.Group == "a" && in.GPUIndex == 0:
			e.a0 = in
		case in.Group == "a" && in.GPUIndex == 1:
			e.a1 = in
		case in.Group == "b" && in.GPUIndex == 0:
			e.b0 = in
		}
	}
	if e.a0.Clients != 3 || e.b0.Clients != 2 || e.a1.Clients != 1 {
		t.Fatalf("placement: a/0 %d, b/0 %d, a/1 %d clients; want 3, 2, 1", e.a0.Clients, e.b0.Clients, e.a1.Clients)
	}
	e.byLeases = map[string][]int{}
	for _, l := range st.Leases {
		if l.Group == "b" || l.GPUIndexes[0] == 1 {
			e.byLeases[l.ID] = l.PIDs
		}
	}
	return e
}

// mpsClients asks the instance's control daemon how many clients its
// server has, so a scenario starts only once every workload is an MPS
// client.
func (e *testEnv) mpsClients(in api.InstanceStatus) int {
	pipe := Layout{RunDir: filepath.Join(e.dir, "run")}.PipeDir(in.Group, in.GPUUUID)
	n := 0
	for _, server := range in.ServerPIDs {
		cmd := exec.Command(filepath.Join(e.emu, "nvidia-cuda-mps-control"))
		cmd.Env = append(os.Environ(), api.EnvPipeDirectory+"="+pipe)
		cmd.Stdin = strings.NewReader("get_client_list " + strconv.Itoa(server) + "\n")
		out, err := cmd.Output()
		if err != nil {
			continue
		}
		n += len(strings.Fields(string(out)))
	}
	return n
}

const requeueLine = "requeued, attempt"

// check waits for every launch and checks the outcome: victims were
// requeued (one line saying why) and completed; bystanders completed on
// their first run with the same processes; nothing leaked.
func (e *faultEnv) check(t *testing.T, victims, bystanders []*proc) {
	t.Helper()
	st := e.d.Status()
	for id, pids := range e.byLeases {
		i := slices.IndexFunc(st.Leases, func(l api.LeaseStatus) bool { return l.ID == id })
		// Still running: first attempt, and the processes it had then.
		if i >= 0 && (st.Leases[i].Attempt != 1 || len(st.Leases[i].PIDs) > 0 && !subset(pids, st.Leases[i].PIDs)) {
			t.Errorf("bystander lease %s changed: %+v, pids before %v", id, st.Leases[i], pids)
		}
	}
	for i, p := range victims {
		r := p.wait(t)
		if r.code != 0 {
			t.Errorf("victim %d: exit %d, stderr %q", i, r.code, r.stderr)
		}
		if !strings.Contains(r.stderr, requeueLine) {
			t.Errorf("victim %d was not requeued: stderr %q", i, r.stderr)
		}
	}
	for i, p := range bystanders {
		r := p.wait(t)
		if r.code != 0 || strings.Contains(r.stderr, requeueLine) || strings.Contains(r.stdout+r.stderr, "error") {
			t.Errorf("bystander %d disturbed: exit %d, stdout %q, stderr %q", i, r.code, r.stdout, r.stderr)
		}
	}
	e.noLeaks(t)
}

func subset(a, b []int) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// noLeaks: no lease, queued request, allocation or lease cgroup is left.
func (e *testEnv) noLeaks(t *testing.T) {
	t.Helper()
	st := e.waitStatus("no leases", func(st api.Status) bool { return len(st.Leases) == 0 })
	for _, in := range st.Instances {
		if in.SMAllocated != 0 || in.MemAllocatedBytes != 0 || in.Clients != 0 {
			t.Errorf("instance %s/%d holds sm %d, mem %d, %d clients with no lease", in.Group, in.GPUIndex, in.SMAllocated, in.MemAllocatedBytes, in.Clients)
		}
	}
	for g, n := range st.Queue {
		if n != 0 {
			t.Errorf("group %s has %d queued", g, n)
		}
	}
	// Every group's directory under this mpsd's own, where the cgroup
	// manager keeps lease cgroups on this host's layout. The caller ran
	// leases, so the directory is there; not being able to read it is a
	// failure, never "nothing left".
	// Every hierarchy a lease cgroup is made of: the unified one and each
	// v1 controller on a hybrid host, the v1 ones on a v1 host.
	for h, mount := range e.cgroupHierarchies(t) {
		owner := filepath.Join(mount, e.leaseCgroup("", ""))
		groups, err := os.ReadDir(owner)
		if err != nil {
			t.Errorf("list the lease cgroups (%s hierarchy): %v", h, err)
			continue
		}
		for _, g := range groups {
			if !g.IsDir() {
				continue
			}
			ents, err := os.ReadDir(filepath.Join(owner, g.Name()))
			if err != nil {
				t.Errorf("list the lease cgroups of group %s (%s hierarchy): %v", g.Name(), h, err)
				continue
			}
			for _, ent := range ents {
				if ent.IsDir() {
					t.Errorf("lease cgroup %s/%s left behind in the %s hierarchy", g.Name(), ent.Name(), h)
				}
			}
		}
	}
}

func instanceOf(st api.Status, group string, gpu int) api.InstanceStatus {
	for _, in := range st.Instances {
		if in.Group == group && in.GPUIndex == gpu {
			return in
		}
	}
	return api.InstanceStatus{}
}

// Killing one instance's server or control daemon, or stopping the
// daemon, affects that instance's clients only: they are requeued and
// complete; every other client keeps running untouched.
func TestFaultIsolation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kind   string // how the watchdog must have seen it
		reason string // what its reason must say of the exit; "" for none
		// restarting is the recovery's restarting= log field.
		restarting string
		inject     func(t *testing.T, e *faultEnv)
		after      func(t *testing.T, e *faultEnv, st api.Status)
	}{
		// The same kill is told the same way on every run: the wait
		// status read through the pidfd, whoever reaps the process.
		{"server SIGKILL", faultServerExit, "died (killed by SIGKILL)", "nothing", func(t *testing.T, e *faultEnv) {
			if err := syscall.Kill(e.a0.ServerPIDs[0], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"control daemon SIGKILL", faultDaemonExit, "exited (killed by SIGKILL)", "control_daemon", func(t *testing.T, e *faultEnv) {
			if err := syscall.Kill(e.a0.DaemonPID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, e *faultEnv, st api.Status) {
			in := instanceOf(st, "a", 0)
			if in.DaemonPID == 0 || in.DaemonPID == e.a0.DaemonPID || syscall.Kill(in.DaemonPID, 0) != nil {
				t.Errorf("no new control daemon: %+v (old %d)", in, e.a0.DaemonPID)
			}
		}},
		{"control daemon SIGSTOP", faultHung, "", "control_daemon", func(t *testing.T, e *faultEnv) {
			if err := syscall.Kill(e.a0.DaemonPID, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// A hung instance, and then its recovery, block nobody else:
			// group b admits at once meanwhile.
			if r := run(t, e.launch("--group", "b", "--no-wait", "--sm", "10", "--mem", "1G", "--", "/bin/true")); r.code != 0 {
				t.Errorf("launch in b while a/0 hangs: exit %d, stderr %q", r.code, r.stderr)
			}
		}, func(t *testing.T, e *faultEnv, st api.Status) {
			if in := instanceOf(st, "a", 0); in.DaemonPID == e.a0.DaemonPID {
				t.Errorf("hung daemon %d still in place", in.DaemonPID)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFaultEnv(t, nil)
			before := e.d.Status()
			tc.inject(t, e)
			st := e.waitStatus("a/0 recovered", func(st api.Status) bool {
				in := instanceOf(st, "a", 0)
				return in.Restarts == 1 && in.State == api.InstanceReady
			})
			for _, g := range []struct {
				group string
				gpu   int
			}{{"b", 0}, {"a", 1}, {"b", 1}} {
				was, now := instanceOf(before, g.group, g.gpu), instanceOf(st, g.group, g.gpu)
				if now.Restarts != 0 || now.DaemonPID != was.DaemonPID || !slices.Equal(now.ServerPIDs, was.ServerPIDs) {
					t.Errorf("bystander instance %s/%d touched: before %+v, after %+v", g.group, g.gpu, was, now)
				}
			}
			f := e.firstFault(t)
			if f.kind != tc.kind {
				t.Errorf("first fault %q (%s), want %q", f.kind, f.reason, tc.kind)
			}
			if !strings.Contains(f.reason, tc.reason) {
				t.Errorf("first fault's reason %q does not say %q", f.reason, tc.reason)
			}
			// What the recovery restarts, by name, and the failure count,
			// named as one.
			e.waitLogAny(" restarting=" + tc.restarting + " failures_in_window=1")
			if tc.after != nil {
				tc.after(t, e, st)
			}
			e.check(t, e.victims, e.bystanders)
		})
	}
}

// A fault the server contains (Volta+): MPS gives every client of that
// server a sticky error; all of them are requeued and complete, and
// nobody else is touched.
func TestContainedFaultRequeuesTheServersClients(t *testing.T) {
	e := newFaultEnv(t, func(i int, client string) []string {
		if i != 1 {
			return []string{client, "--duration", "3s"}
		}
		// The faulting client faults on its first run only, when the
		// test signals it, once every client is placed.
		return []string{"/bin/sh", "-c", `if [ "$MPSD_ATTEMPT" = 1 ]; then exec "$0" --fault-on-usr1 --duration 1m; else exec "$0" --duration 1s; fi`, client}
	})
	faulting := 0
	for _, l := range e.d.Status().Leases {
		if strings.Contains(strings.Join(l.Command, " "), "--fault-on-usr1") {
			for _, pid := range l.PIDs {
				if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
					t.Fatal(err)
				}
				faulting++
			}
		}
	}
	if faulting != 1 {
		t.Fatalf("signalled %d processes of the faulting lease; want its one client", faulting)
	}
	st := e.waitStatus("a/0 recovered", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.Restarts >= 1 && in.State == api.InstanceReady
	})
	if in := instanceOf(st, "a", 0); in.DaemonPID != e.a0.DaemonPID {
		t.Errorf("a contained fault restarted the control daemon: %d → %d", e.a0.DaemonPID, in.DaemonPID)
	}
	for _, g := range []string{"b/0", "a/1"} {
		group, gpu, _ := strings.Cut(g, "/")
		idx, _ := strconv.Atoi(gpu)
		if in := instanceOf(st, group, idx); in.Restarts != 0 {
			t.Errorf("instance %s touched: %+v", g, in)
		}
	}
	e.check(t, e.victims, e.bystanders)
}

// Xids: a device-level one takes down every instance on its GPU and
// nothing else; an application-level one only the faulting process's.
func TestXidBlastRadius(t *testing.T) {
	e := newFaultEnv(t, nil)
	sim := e.sim
	select {
	case <-sim.XidWatched():
	case <-time.After(waitFor):
		t.Fatal("mpsd does not watch Xid events")
	}
	// Application-level Xid 13 from group a's client on GPU 1.
	var pid int
	for id, pids := range e.byLeases {
		if strings.HasPrefix(id, "a-") {
			pid = pids[0]
		}
	}
	a1pid := pid
	if err := sim.InjectXid(1, 13, a1pid); err != nil {
		t.Fatal(err)
	}
	st := e.waitStatus("a/1 recovered", func(st api.Status) bool {
		in := instanceOf(st, "a", 1)
		return in.Restarts == 1 && in.State == api.InstanceReady
	})
	for _, g := range []struct {
		group string
		gpu   int
	}{{"a", 0}, {"b", 0}, {"b", 1}} {
		if in := instanceOf(st, g.group, g.gpu); in.Restarts != 0 {
			t.Errorf("application Xid touched %s/%d: %+v", g.group, g.gpu, in)
		}
	}
	// An application-level Xid that names no process (what NVML gives on a
	// real host) takes down nobody: MPS's own signals find the instance.
	if err := sim.InjectXid(0, 13, 0); err != nil {
		t.Fatal(err)
	}
	e.waitStatus("the anonymous Xid counted", func(api.Status) bool {
		e.d.mu.Lock()
		defer e.d.mu.Unlock()
		return e.d.metrics.xids[[2]uint64{0, 13}] == 1
	})
	st = e.d.Status()
	for _, g := range []string{"a", "b"} {
		if in := instanceOf(st, g, 0); in.Restarts != 0 {
			t.Errorf("an application Xid without a pid touched %s/0: %+v", g, in)
		}
	}
	// Device-level Xid 79 on GPU 1: both of its instances, not GPU 0's.
	if err := sim.InjectXid(1, 79, 0); err != nil {
		t.Fatal(err)
	}
	st = e.waitStatus("GPU 1 recovered", func(st api.Status) bool {
		return instanceOf(st, "a", 1).Restarts == 2 && instanceOf(st, "b", 1).Restarts == 1 &&
			instanceOf(st, "a", 1).State == api.InstanceReady && instanceOf(st, "b", 1).State == api.InstanceReady
	})
	for _, g := range []struct {
		group string
		gpu   int
	}{{"a", 0}, {"b", 0}} {
		if in := instanceOf(st, g.group, g.gpu); in.Restarts != 0 {
			t.Errorf("device Xid on GPU 1 touched %s/%d: %+v", g.group, g.gpu, in)
		}
	}
	// GPU 0's clients ran through undisturbed; a/1's client was requeued.
	a1 := e.bystanders[2]
	for id := range e.byLeases {
		if strings.HasPrefix(id, "a-") {
			delete(e.byLeases, id)
		}
	}
	e.check(t, nil, append(e.victims, e.bystanders[:2]...))
	r := a1.wait(t)
	if r.code != 0 || !strings.Contains(r.stderr, requeueLine) || !strings.Contains(r.stderr, "Xid 13") {
		t.Errorf("a/1's client: exit %d, stderr %q; want requeued for Xid 13, then done", r.code, r.stderr)
	}
}

// With --requeue 1, the second fault ends the launch with 75 and the
// reason.
func TestRequeueBudget(t *testing.T) {
	e := newEnv(t, `  a:
    users: [root]
    memory: 20G
    gpus: ["0"]
`, faultWatchdog)
	e.start()
	args, open := e.gate("r")
	p := startProc(t, e.launch(append([]string{"--requeue", "1", "--sm", "10", "--mem", "1G", "--"}, args...)...))
	restarted := 0
	for range 2 {
		e.waitStatus("the workload running", func(st api.Status) bool { return len(shellPIDs(st)) == 1 })
		restarted++
		res := e.admin(t, "restart", "--group", "a")
		if !strings.Contains(res, "group a") {
			t.Fatalf("mpsctl restart: %q", res)
		}
		e.waitStatus("a restarted", func(st api.Status) bool {
			return st.Instances[0].Restarts == restarted && st.Instances[0].State == api.InstanceReady
		})
	}
	r := p.wait(t)
	open()
	if r.code != 75 || !strings.Contains(r.stderr, "administrator restarted") {
		t.Fatalf("exit %d, stderr %q; want 75 with the reason", r.code, r.stderr)
	}
	e.noLeaks(t)
}

// admin runs mpsctl against the env and returns its output, failing the
// test if it fails.
func (e *testEnv) admin(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, exec.Command(filepath.Join(e.bin, "mpsctl"), append([]string{"--socket", e.socket}, args...)...))
	if r.code != 0 {
		t.Fatalf("mpsctl %v: exit %d, stderr %q", args, r.code, r.stderr)
	}
	return r.stdout
}

// crashingEmulator is an emulator directory whose MPS server fails its
// initialisation (MPSEMU_SERVER_FAIL_INIT: it runs the server program, as
// a real crashing server does, and exits 1 shortly after) for the pipe
// directories containing $MPSEMU_TEST_CRASH_PIPE while the
// file $MPSEMU_TEST_CRASH_FLAG exists (mpsd passes MPSEMU_* variables on
// to the daemons, and servers inherit them).
func crashingEmulator(t *testing.T, real string) string {
	dir := filepath.Join(t.TempDir(), "emu")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nvidia-cuda-mps-control", "mpsemu-client"} {
		if err := os.Symlink(filepath.Join(real, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	script := `#!/bin/sh
case "$CUDA_MPS_PIPE_DIRECTORY" in
*"$MPSEMU_TEST_CRASH_PIPE"*) [ -e "$MPSEMU_TEST_CRASH_FLAG" ] && export MPSEMU_SERVER_FAIL_INIT=300ms ;;
esac
exec ` + filepath.Join(real, "nvidia-cuda-mps-server") + ` "$@"
`
	if err := os.WriteFile(filepath.Join(dir, "nvidia-cuda-mps-server"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A server that dies on every start puts its instance in a crash loop;
// after quarantine_after failures the instance is quarantined, the waiting
// lease stays queued (the group's other GPU is full) rather than being
// sent back to it, and mpsctl resume brings it back.
func TestCrashLoopQuarantine(t *testing.T) {
	flag := filepath.Join(t.TempDir(), "crash")
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, `  a:
    users: [root]
    memory: 20G
    requeue_attempts: 10
`, faultWatchdog)
	e.emu = crashingEmulator(t, e.emu)
	e.writeConfig(`  a:
    users: [root]
    memory: 20G
    requeue_attempts: 10
`, faultWatchdog)
	t.Setenv("MPSEMU_TEST_CRASH_FLAG", flag)
	t.Setenv("MPSEMU_TEST_CRASH_PIPE", "/a/GPU-aa532ddb")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	// The first lease lands on GPU 0, crashes, and is requeued onto GPU 1,
	// where it runs; the second has only GPU 0 left and loops there.
	first := startProc(t, e.launch("--sm", "60", "--mem", "1G", "--", client, "--duration", "1m"))
	e.waitStatus("the first lease running on GPU 1", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].State == api.LeaseRunning && st.Leases[0].GPUIndexes[0] == 1
	})
	master, slave := apitest.OpenPTY(t)
	term := readPTY(master)
	second := e.launch("--sm", "60", "--mem", "1G", "--", client, "--duration", "500ms")
	second.Stderr = slave
	sp := startProc(t, second)
	st := e.waitStatus("GPU 0 quarantined", func(st api.Status) bool {
		return instanceOf(st, "a", 0).State == api.InstanceQuarantined
	})
	if r := instanceOf(st, "a", 0).Restarts; r < 3 {
		t.Errorf("quarantined after %d failures, want quarantine_after = 3", r)
	}
	e.waitStatus("the second lease waiting", func(st api.Status) bool { return st.Queue["a"] == 1 })
	if in := instanceOf(e.d.Status(), "a", 1); in.Restarts != 0 || in.Clients != 1 {
		t.Errorf("GPU 1's instance disturbed: %+v", in)
	}
	// Quarantined means no placements: the lease keeps waiting.
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(term.String(), "queued, position 1 in group a (waiting for room; GPU 0 quarantined until an admin's mpsctl resume)") {
		if time.Now().After(deadline) {
			t.Fatalf("terminal shows %q", term.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A quarantine outlives an mpsd restart.
	e.stop()
	e.start()
	if in := instanceOf(e.d.Status(), "a", 0); in.State != api.InstanceQuarantined {
		t.Errorf("after a restart GPU 0's instance is %s, want still quarantined", in.State)
	}
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	// Status says why, before and after the restart (the state file
	// keeps the reason), and resume says it lifted the quarantine.
	why := instanceOf(e.d.Status(), "a", 0).QuarantineReason
	if !strings.HasPrefix(why, "3 failures in ") {
		t.Errorf("quarantine reason %q after a restart; want the failures", why)
	}
	out := e.admin(t, "resume", "--gpu", "0", "--group", "a")
	if !strings.Contains(out, "gpu 0 (") || !strings.Contains(out, "group a: quarantine lifted (was: "+why+")") {
		t.Errorf("mpsctl resume: %q; want the quarantine lifted and why it was", out)
	}
	if r := sp.wait(t); r.code != 0 {
		t.Errorf("second launch after resume: exit %d, terminal %q", r.code, term.String())
	}
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	if r := first.wait(t); r.code != 143 {
		t.Errorf("first launch: exit %d, want 143 from the forwarded SIGTERM", r.code)
	}
	e.noLeaks(t)
}

// mpsctl requeue moves one lease, without using up its attempts; on real
// GPUs inject-xid is refused with a clear error.
func TestAdminRequeueAndInjectXidOnRealGPUs(t *testing.T) {
	e := newEnv(t, `  a:
    users: [root]
    memory: 20G
    requeue_attempts: 0
`, "mps:\n  control: "+filepath.Join(emutest.BinDir(t), "nvidia-cuda-mps-control")+"\n  path: "+emutest.BinDir(t)+":/usr/bin:/bin")
	// Real-GPU mode: NVML is given (here the simulated one, so no real
	// GPU is needed), and nothing says "simulate".
	sim, err := gpu.NewSim(gpu.SimSpec{GPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	e.sim = nil
	e.opts.NVML, e.opts.MPS, e.opts.Beside, e.opts.XidInjector = sim.NVML(), nil, nil, nil
	e.start()
	r := run(t, exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "inject-xid", "0", "79"))
	if r.code != 1 || !strings.Contains(r.stderr, "mpsd --simulate") {
		t.Errorf("inject-xid on real GPUs: exit %d, stderr %q", r.code, r.stderr)
	}

	args, open := e.gate("q")
	p := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, args...)...))
	st := e.waitStatus("the workload running", func(st api.Status) bool { return len(shellPIDs(st)) == 1 })
	id := st.Leases[0].ID
	out := e.admin(t, "requeue", id)
	if !strings.Contains(out, id) {
		t.Errorf("mpsctl requeue: %q", out)
	}
	// requeue_attempts is 0, yet an operator's requeue relaunches it.
	e.waitStatus("attempt 2 running", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].Attempt == 2 && len(shellPIDs(st)) == 1
	})
	if r := run(t, exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "requeue", "a-000000000000")); r.code != 1 {
		t.Errorf("requeue of no lease: exit %d", r.code)
	}
	open()
	r = p.wait(t)
	if r.code != 0 || !strings.Contains(r.stderr, "administrator requeued") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
	e.noLeaks(t)
}

// A fault the server contains while mpsd is stopped is not lost: the next
// mpsd reads server.log on from where the last one stopped, revokes the
// lease and the launcher's command runs again.
// oneGPUGroup is group a on GPU 0 only.
const oneGPUGroup = `  a:
    users: [root]
    memory: 10G
    gpus: ["0"]
`

// firstRunFails is mps-launch's arguments for an emulated client that runs
// with firstRun (say, faulting) on its first attempt and ends well, soon,
// on the next.
func firstRunFails(client, firstRun string) []string {
	return []string{"--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c",
		`if [ "$MPSD_ATTEMPT" = 1 ]; then exec "$0" ` + firstRun + `; else exec "$0" --duration 100ms; fi`, client}
}

// signalLeaseProcs sends sig to the processes of uid's leases in st (an
// emulated client started by firstRunFails is the shell's exec'd process:
// --fault-on-usr1 makes it fault on SIGUSR1).
func signalLeaseProcs(st api.Status, uid uint32, sig syscall.Signal) {
	for _, l := range st.Leases {
		if l.UID == uid {
			for _, pid := range l.PIDs {
				_ = syscall.Kill(pid, sig)
			}
		}
	}
}

// wantRequeuedAndDone waits for a launch whose first run a fault took:
// requeued (its stderr says so, with want) and done on a later attempt.
func wantRequeuedAndDone(t *testing.T, p *proc, want string) {
	t.Helper()
	r := p.wait(t)
	if r.code != 0 || !strings.Contains(r.stderr, requeueLine) || !strings.Contains(r.stderr, want) {
		t.Fatalf("exit %d, stderr %q; want the faulted run requeued (%q) and the next one done", r.code, r.stderr, want)
	}
}

func TestFaultWhileMpsdDown(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "stopped", true: "killed"}[crash], func(t *testing.T) {
			e := newEnv(t, oneGPUGroup, faultWatchdog)
			e.start()
			client := filepath.Join(e.emu, "mpsemu-client")
			p := startProc(t, e.launch(firstRunFails(client, "--fault-after 1s --duration 1m")...))
			st := e.waitStatus("the client connected", func(st api.Status) bool {
				in := instanceOf(st, "a", 0)
				return in.Clients == 1 && len(in.ServerPIDs) == 1 && e.mpsClients(in) == 1
			})
			// Killed: what a SIGKILL leaves, the state as last written.
			e.d.crashStop.Store(crash)
			e.stop()
			serverLog := filepath.Join(e.dir, "log", "a", instanceOf(st, "a", 0).GPUUUID, "server.log")
			deadline := time.Now().Add(waitFor)
			for {
				b, _ := os.ReadFile(serverLog)
				if strings.Contains(string(b), "Server is handling a fatal GPU error.") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the client did not fault")
				}
				time.Sleep(20 * time.Millisecond)
			}
			e.start()
			wantRequeuedAndDone(t, p, requeueLine)
			e.noLeaks(t)
		})
	}
}

// A contained fault that mpsd sees as it stops, too late to handle, is not
// lost: the state file sends the next mpsd back to its server.log line,
// and the job is requeued rather than ending with its client's error.
func TestFaultSeenWhileStoppingIsReadAgain(t *testing.T) {
	e := newEnv(t, oneGPUGroup, faultWatchdog)
	hooked := make(chan struct{})
	var once sync.Once
	e.opts.faultHook = func(in *instance, f fault) {
		if f.kind != faultServerFault {
			return
		}
		once.Do(func() {
			// Hold the fault until mpsd is stopping, as if it had come a
			// moment before the stop.
			ctx := e.d.ctx
			close(hooked)
			<-ctx.Done()
		})
	}
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch(firstRunFails(client, "--fault-after 500ms --duration 1m")...))
	select {
	case <-hooked:
	case <-time.After(waitFor):
		t.Fatal("the client's fault was not reported")
	}
	e.stop()
	e.opts.faultHook = nil
	e.start()
	wantRequeuedAndDone(t, p, requeueLine)
	e.noLeaks(t)
}

// A launcher that resumes after several revocations is told where its
// lease stands now, not every event since it left: its command runs once,
// under the current attempt, not once per grant it missed.
func TestResumeAfterSeveralRequeues(t *testing.T) {
	e := newEnv(t, `  a:
    users: [root]
    memory: 10G
    gpus: ["0"]
    requeue_attempts: 5
`, faultWatchdog)
	e.start()
	runs := filepath.Join(e.dir, "runs")
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c",
		`echo "$MPSD_ATTEMPT" >> "$1"; if [ "$MPSD_ATTEMPT" = 1 ]; then exec "$0" --duration 1m; else exec "$0" --duration 100ms; fi`, client, runs))
	st := e.waitStatus("the client connected", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.Clients == 1 && len(in.ServerPIDs) == 1 && e.mpsClients(in) == 1
	})
	id := st.Leases[0].ID
	// The launcher sleeps through an mpsd restart and two requeues.
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.start()
	for attempt := 2; attempt <= 3; attempt++ {
		body, _ := json.Marshal(api.RequeueRequest{Lease: id})
		if status, _, b := inpPost(t, e.socket, api.PathRequeue, body); status != http.StatusOK {
			t.Fatalf("requeue: %d %s", status, b)
		}
		e.waitStatus(fmt.Sprintf("attempt %d running", attempt), func(st api.Status) bool {
			return len(st.Leases) == 1 && st.Leases[0].Attempt == attempt && st.Leases[0].State == api.LeaseRunning
		})
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	b, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(b)); !slices.Equal(got, []string{"1", "3"}) {
		t.Errorf("the command ran with MPSD_ATTEMPT %v, want [1 3]: once at first, once under the current attempt", got)
	}
	e.noLeaks(t)
}

// An MPS server that dies while mpsd is stopped takes its clients with it;
// the next mpsd finds it missing from the adopted daemon and requeues its
// leases, instead of taking their commands' failures as their own.
func TestServerDiesWhileMpsdDown(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "stopped", true: "killed"}[crash], func(t *testing.T) { serverDiesWhileMpsdDown(t, crash) })
	}
}

func serverDiesWhileMpsdDown(t *testing.T, crash bool) {
	e := newEnv(t, oneGPUGroup, faultWatchdog)
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch(firstRunFails(client, "--duration 1m")...))
	st := e.waitStatus("the client connected", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.Clients == 1 && len(in.ServerPIDs) == 1 && e.mpsClients(in) == 1
	})
	server := instanceOf(st, "a", 0).ServerPIDs[0]
	clientPIDs := st.Leases[0].PIDs
	if crash {
		// What a crash leaves is the state as last written: wait until
		// that has the server.
		deadline := time.Now().Add(waitFor)
		for {
			b := e.stateBytes()
			var saved savedState
			if json.Unmarshal(b, &saved) == nil {
				if _, ok := saved.Servers[instanceKey("a", []int{0})][server]; ok {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the state file never recorded server %d", server)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	e.d.crashStop.Store(crash)
	e.stop()
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The client dies of the lost server before mpsd comes back.
	deadline := time.Now().Add(waitFor)
	for _, pid := range clientPIDs {
		for inpAlive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("client %d outlived its server", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	e.start()
	wantRequeuedAndDone(t, p, "exited while mpsd was away")
	e.noLeaks(t)
}

// mpsd killed in the middle of a revocation: the state file says the
// lease was being revoked, and the next mpsd finishes the job (its command
// killed, the lease requeued, the launcher told why) instead of taking the
// victim's dead command for a job that ended.
func TestRevocationFinishedAfterCrash(t *testing.T) {
	e := newEnv(t, oneGPUGroup, faultWatchdog)
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch(firstRunFails(client, "--duration 1m")...))
	e.waitStatus("the client connected", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.Clients == 1 && len(in.ServerPIDs) == 1 && e.mpsClients(in) == 1
	})
	e.d.crashStop.Store(true)
	e.stop()
	// As the dead mpsd would have left it, had it died just after taking
	// the lease for a fault.
	b := e.stateBytes()
	var st savedState
	if err := json.Unmarshal(b, &st); err != nil || len(st.Leases) != 1 {
		t.Fatalf("state %s: %v", b, err)
	}
	st.Leases[0].Revoking, st.Leases[0].RevokedFor = true, "MPS server 1 of group a on GPU 0 died (test)"
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	e.setState(b)
	e.start()
	wantRequeuedAndDone(t, p, "died (test)")
	e.noLeaks(t)
}
