package mpsd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/mps"
)

// Test uids of the caps tests (this file's range: 64850-64899).
const (
	capsUIDTenant    = 64850 // owns its MPS server and lifts its caps
	capsUIDBystander = 64851 // another group's member on another GPU
)

// ctl runs nvidia-cuda-mps-control (the emulator's) as uid against the
// pipe directory of the instance of group on GPU uuid, with command as
// its one line of input, and returns what it printed.
func (e *testEnv) ctl(t *testing.T, uid uint32, group, uuid, command string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.emu, "nvidia-cuda-mps-control"))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(e.dir, "run", group, uuid, "pipe")}
	cmd.Stdin = strings.NewReader(command + "\n")
	if uid != 0 {
		asUID(cmd, uid)
	}
	r := run(t, cmd)
	if r.code != 0 {
		t.Fatalf("%q as uid %d: exit %d, stdout %q, stderr %q", command, uid, r.code, r.stdout, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// A tenant whose group runs without multiuser owns its MPS server, and MPS
// lets the owner change its own server's limits (the emulator's choice,
// unverified until a GPU run confirms it: NVIDIA's text protects only
// another user's server). It lifts its server's thread percentage to 100
// and its pinned memory to 40 GiB through the control pipe. mpsd finds
// both at its next probe, sets them back to what its uid's lease was
// granted (10% and 1 GiB: a server not shared is held to its uid's
// leases), counts each drift in mpsd_mps_cap_drift_total and logs it with
// the group, GPU and server; the tenant's lease runs on. The bystander's
// instance (another group, another GPU) keeps its caps and counts no
// drift, and no drift is counted before the tenant acts.
func TestServerCapsReasserted(t *testing.T) {
	tenant, bystander := emutest.User(t, capsUIDTenant), emutest.User(t, capsUIDBystander)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s]
    memory: 10G
    max_sm: 40
    gpus: ["0"]
  b:
    users: [%s]
    memory: 10G
    max_sm: 40
    gpus: ["1"]
`, tenant, bystander), "watchdog:\n  probe_interval: 500ms\n  probe_timeout: 400ms\n  backoff_initial: 50ms\n  backoff_max: 1s\n")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	pa := startProc(t, asUID(e.launch("--group", "a", "--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"), capsUIDTenant))
	pb := startProc(t, asUID(e.launch("--group", "b", "--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"), capsUIDBystander))
	st := e.waitStatus("a server on each instance", func(st api.Status) bool {
		n := 0
		for _, in := range st.Instances {
			if len(in.ServerPIDs) > 0 {
				n++
			}
		}
		return countLeases(st, api.LeaseRunning) == 2 && n == 2
	})
	server := map[string]int{}
	uuid := map[string]string{}
	for _, in := range st.Instances {
		server[in.Group], uuid[in.Group] = in.ServerPIDs[0], in.GPUUUID
	}
	drift := func(group, c string) float64 {
		return e.limMetric("mpsd_mps_cap_drift_total", map[string]string{"group": group, "cap": c})
	}
	sa, sb := strconv.Itoa(server["a"]), strconv.Itoa(server["b"])
	// Both servers were checked once ready: nothing drifted.
	for _, pid := range []string{sa, sb} {
		e.waitLogLine("MPS server's caps checked at its start", "server="+pid)
	}
	for _, c := range []string{"thread_percentage", "pinned_memory"} {
		if n := drift("a", c) + drift("b", c); n != 0 {
			t.Fatalf("%v %s drifts counted before anyone changed a cap", n, c)
		}
	}

	if got := e.ctl(t, capsUIDTenant, "a", uuid["a"], "set_active_thread_percentage "+sa+" 100"); got != "100.0" {
		t.Fatalf("the tenant's set_active_thread_percentage answered %q, want 100.0 (MPS lets a server's owner change it)", got)
	}
	e.ctl(t, capsUIDTenant, "a", uuid["a"], "set_device_pinned_mem_limit "+sa+" 0 40G")

	deadline := time.Now().Add(waitFor)
	for drift("a", "thread_percentage") < 1 || drift("a", "pinned_memory") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no drift counted within %s: thread_percentage %v, pinned_memory %v", waitFor, drift("a", "thread_percentage"), drift("a", "pinned_memory"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.waitStatus("the caps set back", func(api.Status) bool {
		return e.ctl(t, 0, "a", uuid["a"], "get_active_thread_percentage "+sa) == "10.0" &&
			e.ctl(t, 0, "a", uuid["a"], "get_device_pinned_mem_limit "+sa+" 0") == "1G"
	})
	e.waitLogLine("MPS server's cap drifted from what mpsd set", "group=a", "gpu="+uuid["a"], "server="+sa, "cap=thread_percentage", "got=100")
	e.waitLogLine("MPS server's cap drifted from what mpsd set", "group=a", "server="+sa, "cap=pinned_memory")

	// The bystander's server kept its caps; nothing counted for it.
	if got := e.ctl(t, 0, "b", uuid["b"], "get_active_thread_percentage "+sb); got != "10.0" {
		t.Errorf("the bystander's server runs at %s%%, want 10.0", got)
	}
	if got := e.ctl(t, 0, "b", uuid["b"], "get_device_pinned_mem_limit "+sb+" 0"); got != "1G" {
		t.Errorf("the bystander's server's pinned limit is %s, want 1G", got)
	}
	for _, c := range []string{"thread_percentage", "pinned_memory"} {
		if n := drift("b", c); n != 0 {
			t.Errorf("%v %s drifts counted for the bystander's instance", n, c)
		}
	}
	// Both leases run on, none revoked.
	st = e.d.Status()
	if n := countLeases(st, api.LeaseRunning); n != 2 {
		t.Errorf("%d leases running after the correction, want 2", n)
	}
	for _, in := range st.Instances {
		if in.Restarts != 0 {
			t.Errorf("instance of group %s restarted %d times", in.Group, in.Restarts)
		}
	}
	_, _ = pa, pb
}

// waitLogLine waits until one line of mpsd's log holds all of ss.
func (e *testEnv) waitLogLine(ss ...string) {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		b, _ := os.ReadFile(e.log.Name())
		for _, line := range strings.Split(string(b), "\n") {
			if all(ss, func(s string) bool { return strings.Contains(line, s) }) {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("mpsd logged no line with all of %q within %s", ss, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// capsUIDDefaults changes the daemon's defaults on a 535 daemon.
const capsUIDDefaults = 64852

// NVIDIA's 535 daemon lets any user change its defaults, which the next
// server starts with. A tenant lifts the default thread percentage to 100
// before its first launch: mpsd's grant sets the defaults to the lease's
// share, so that change is undone before the lease's command runs. The
// lease's command then lifts the default again itself before its client
// connects; its server starts at 100, and mpsd, checking the caps of every
// new server once it is ready, sets it back to the lease's 10% at once
// (the drift is logged as seen at the server's start and counted).
func TestServerCapsAppliedAtStart(t *testing.T) {
	tenant := emutest.User(t, capsUIDDefaults)
	e := newEnvGPUs(t, 1, fmt.Sprintf(`  a:
    users: [%s]
    memory: 10G
    max_sm: 40
`, tenant), "watchdog:\n  probe_interval: 10m\n  backoff_initial: 50ms\n  backoff_max: 1s\n")
	// No probe runs within the test: only the check at the server's start
	// can set the cap back.
	base := e.opts.MPS
	e.opts.MPS = func(c mps.Config, l Layout) (mps.Config, error) {
		c, err := base(c, l)
		c.Env = append(c.Env, "MPSEMU_DRIVER=535")
		return c, err
	}
	e.start()
	st := e.waitStatus("the instance up", func(st api.Status) bool {
		return len(st.Instances) == 1 && st.Instances[0].State == api.InstanceReady
	})
	uuid := st.Instances[0].GPUUUID
	if got := e.ctl(t, capsUIDDefaults, "a", uuid, "set_default_active_thread_percentage 100"); got != "100.0" {
		t.Fatalf("the tenant's set_default_active_thread_percentage on 535 answered %q, want 100.0", got)
	}
	client := filepath.Join(e.emu, "mpsemu-client")
	lift := `echo set_default_active_thread_percentage 100 | "$1"; exec "$0" --duration 1m`
	startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", lift, client, filepath.Join(e.emu, "nvidia-cuda-mps-control")), capsUIDDefaults))
	st = e.waitStatus("its server", func(st api.Status) bool { return len(st.Instances[0].ServerPIDs) == 1 })
	sa := strconv.Itoa(st.Instances[0].ServerPIDs[0])
	e.waitLogLine("MPS server's cap drifted from what mpsd set", "group=a", "server="+sa, "cap=thread_percentage", "got=100", `seen_at="server start"`)
	e.waitStatus("the cap set back", func(api.Status) bool {
		return e.ctl(t, 0, "a", uuid, "get_active_thread_percentage "+sa) == "10.0"
	})
	if n := e.limMetric("mpsd_mps_cap_drift_total", map[string]string{"group": "a", "cap": "thread_percentage"}); n != 1 {
		t.Errorf("%v thread_percentage drifts counted, want 1", n)
	}
	if n := e.limMetric("mpsd_mps_cap_drift_total", map[string]string{"group": "a", "cap": "pinned_memory"}); n != 0 {
		t.Errorf("%v pinned_memory drifts counted, want 0 (the tenant changed none)", n)
	}
}

// In a group without multiuser each MPS server is one uid's, and mpsd
// holds it to what that uid was granted: a lease of --sm 5 --mem 1G whose
// command raises its own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE to 100 and its
// pinned limit to 40 GiB still gets 5% and 1 GiB (MPS lets a client's
// environment only lower its server's limits). The next member's lease,
// of --sm 20 --mem 2G, gets its own 20% and 2 GiB on the server MPS
// starts for it, and a third lease of the first member again 5%: no uid
// inherits another's caps.
func TestServerHeldToItsUIDsGrant(t *testing.T) {
	u1, u2 := emutest.User(t, capsUIDTenant), emutest.User(t, capsUIDBystander)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    max_sm: 40
    gpus: ["0"]
`, u1, u2), "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	greedy := func(uid uint32, sm, mem string) result {
		t.Helper()
		r := run(t, asUID(e.launch("--group", "a", "--sm", sm, "--mem", mem, "--", "/bin/sh", "-c",
			`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40G exec "$0" --duration 100ms`, client), uid))
		if r.code != 0 {
			t.Fatalf("uid %d, --sm %s --mem %s: exit %d, stderr %q", uid, sm, mem, r.code, r.stderr)
		}
		return r
	}
	for _, tc := range []struct {
		uid      uint32
		sm, mem  string
		wantSM   string
		wantMem0 string
	}{
		{capsUIDTenant, "5", "1G", " sm=5.0 ", " mem0=1024M"},
		{capsUIDBystander, "20", "2G", " sm=20.0 ", " mem0=2048M"},
		{capsUIDTenant, "5", "1G", " sm=5.0 ", " mem0=1024M"},
	} {
		r := greedy(tc.uid, tc.sm, tc.mem)
		if !strings.Contains(r.stdout, tc.wantSM) || !strings.Contains(r.stdout, tc.wantMem0) {
			t.Errorf("uid %d, --sm %s --mem %s, asking for 100%% and 40G itself: %q, want%s and%s", tc.uid, tc.sm, tc.mem, r.stdout, tc.wantSM, tc.wantMem0)
		}
	}
	// MPS ran a server for each uid in turn; none was taken for a fault.
	st := e.d.Status()
	for _, in := range st.Instances {
		if in.Restarts != 0 {
			t.Errorf("instance of group %s on GPU %d restarted %d times", in.Group, in.GPUIndex, in.Restarts)
		}
	}
}
