package mpsd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
)

const oneGroup = `  inference:
    users: [root]
    memory: 20G
`

// The launcher's command gets the lease's limits, and MPS enforces them
// inside the client: its thread percentage and pinned memory limit are the
// request's, and an allocation beyond the limit fails with CUDA's
// out-of-memory error, whose exit status mps-launch passes on.
func TestLaunchAppliesLimits(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")

	r := run(t, e.launch("--sm", "30", "--mem", "8G", "--", client, "--alloc", "4G", "--duration", "1s"))
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"sm=30.0", "mem0=8192M", "allocated 4294967296 bytes"} {
		if !strings.Contains(r.stdout+r.stderr, want) {
			t.Errorf("client output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}

	r = run(t, e.launch("--sm", "30", "--mem", "8G", "--", client, "--alloc", "9G"))
	if r.code != 12 {
		t.Fatalf("--alloc 9G: exit %d, want the client's 12 (out of memory); stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "out of memory") {
		t.Errorf("stderr lacks the out-of-memory error: %q", r.stderr)
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// cgroupMount is the mount where the daemon's cgroup manager finds lease
// cgroups on this host (the unified hierarchy on v2 and hybrid hosts, the
// freezer hierarchy on v1), asked of a manager made from the daemon's own
// cgroup config. A lease cgroup path (leaseCgroup) is relative to it.
func (e *testEnv) cgroupMount(t testing.TB) string {
	t.Helper()
	return e.cgroupManager(t).MembershipMount()
}

// cgroupHierarchies are the mounts of every hierarchy a lease cgroup is
// made of on this host's layout, by name ("unified", or a v1 controller).
func (e *testEnv) cgroupHierarchies(t testing.TB) map[string]string {
	t.Helper()
	return e.cgroupManager(t).Hierarchies()
}

func (e *testEnv) cgroupManager(t testing.TB) *cgroup.Cgroups {
	t.Helper()
	if e.d.cgCfg == nil {
		t.Fatal("cgroups are disabled in this test's mpsd: no lease cgroup to look at")
	}
	m, err := cgroup.New(*e.d.cgCfg)
	if err != nil {
		t.Fatalf("the cgroup manager of mpsd's config: %v", err)
	}
	return m
}

// cgroupOf is pid's cgroup in the membership hierarchy: the unified one
// where the host has it, else v1 freezer (cgroup.Cgroups.MembershipMount).
func cgroupOf(t testing.TB, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(string(b), "0::") || strings.Contains(string(b), "\n0::") {
		return cgroupIn(t, pid, "unified")
	}
	return cgroupIn(t, pid, "freezer")
}

// cgroupIn is pid's cgroup in hierarchy h ("unified", or a v1
// controller), from /proc/<pid>/cgroup.
func cgroupIn(t testing.TB, pid int, h string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if (h == "unified" && f[0] == "0" && f[1] == "") || (h != "unified" && slices.Contains(strings.Split(f[1], ","), h)) {
			return f[2]
		}
	}
	t.Fatalf("pid %d has no line for the %s hierarchy: %s", pid, h, b)
	return ""
}

// The workload and everything it starts live in the lease's cgroup;
// mps-launch stays outside, so killing the lease never kills it.
func TestWorkloadInLeaseCgroup(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	pids := filepath.Join(e.dir, "pids")
	gateArgs, open := e.gate("cg")
	script := "sleep 300 & echo $$ $! > " + pids + ".tmp && mv " + pids + ".tmp " + pids + "; " + gateArgs[2] + "; kill $!"
	cmd := e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script)
	p := startProc(t, cmd)

	st := e.waitStatus("a running lease", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	leaseID := st.Leases[0].ID
	var fields []string
	deadline := time.Now().Add(waitFor)
	for len(fields) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("workload did not write its pids")
		}
		b, _ := os.ReadFile(pids)
		fields = strings.Fields(string(b))
		time.Sleep(10 * time.Millisecond)
	}
	want := e.leaseCgroup("inference", leaseID)
	// Where the cgroup manager keeps it on this host's layout; it must be
	// there now, so that its absence at the end says something.
	dir := filepath.Join(e.cgroupMount(t), want)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the running lease's cgroup: %v", err)
	}
	// In every hierarchy the lease cgroup is made of (the unified one and
	// each v1 controller on a hybrid host, the v1 ones on a v1 host).
	hier := e.cgroupHierarchies(t)
	if len(hier) == 0 {
		t.Fatal("the cgroup manager names no hierarchy")
	}
	for h := range hier {
		for _, f := range fields {
			pid, _ := strconv.Atoi(f)
			if got := cgroupIn(t, pid, h); got != want {
				t.Errorf("pid %d is in %s in the %s hierarchy, want the lease cgroup %s", pid, got, h, want)
			}
		}
		if got := cgroupIn(t, p.pid(), h); got == want || strings.Contains(got, leaseID) {
			t.Errorf("mps-launch (pid %d) is inside the lease cgroup %s in the %s hierarchy", p.pid(), got, h)
		}
	}
	st = e.d.Status()
	for _, f := range fields {
		pid, _ := strconv.Atoi(f)
		if !slices.Contains(st.Leases[0].PIDs, pid) {
			t.Errorf("status pids %v lack %d", st.Leases[0].PIDs, pid)
		}
	}
	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
	for h, mount := range hier {
		dir := filepath.Join(mount, want)
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("lease cgroup %s (%s hierarchy) still there after the lease ended (stat: %v)", dir, h, err)
		}
	}
}
