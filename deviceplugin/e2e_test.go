package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Two groups on two simulated A100s: a on both GPUs with the whole SM
// budget, b on GPU 1 only with half of it.
const twoGroups = `  a:
    users: ["UID"]
    memory: 20G
  b:
    users: ["UID"]
    gpus: ["1"]
    sm_percent: 50
    memory: 10G
`

func allHealthy(devs []*pluginapi.Device) bool {
	for _, d := range devs {
		if d.Health != pluginapi.Healthy {
			return false
		}
	}
	return len(devs) > 0
}

// The plugin registers one resource per group, or only the groups it is
// given, each with one unit per SM percent of each instance's budget.
func TestRegistration(t *testing.T) {
	m := newMPSD(t, twoGroups)
	for _, tc := range []struct {
		name   string
		groups []string
		want   map[string]map[string]int // resource → "gpuN Health" → units
	}{
		{"every group", nil, map[string]map[string]int{
			"mpsd.io/a-sm": {"gpu0 Healthy": 100, "gpu1 Healthy": 100},
			"mpsd.io/b-sm": {"gpu1 Healthy": 50},
		}},
		{"only the groups given", []string{"b"}, map[string]map[string]int{
			"mpsd.io/b-sm": {"gpu1 Healthy": 50},
		}},
	} {
		firstID := map[string]string{"mpsd.io/a-sm": "a-gpu0-sm0", "mpsd.io/b-sm": "b-gpu1-sm0"}
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			k := newFakeKubelet(t, dir)
			runPlugin(t, m, dir, tc.groups...)
			var resources []string
			for r := range tc.want {
				resources = append(resources, r)
			}
			for r, pc := range k.waitRegistered(resources...) {
				group := strings.TrimSuffix(strings.TrimPrefix(r, ResourceDomain+"/"), "-sm")
				if pc.req.Endpoint != "mpsd-"+group+".sock" {
					t.Errorf("%s: endpoint %q", r, pc.req.Endpoint)
				}
				if !pc.req.Options.GetGetPreferredAllocationAvailable() || !pc.opts.GetGetPreferredAllocationAvailable() || pc.opts.PreStartRequired {
					t.Errorf("%s: options %v at registration, %v from the plugin", r, pc.req.Options, pc.opts)
				}
				devs := pc.waitList(t, "the first list", func([]*pluginapi.Device) bool { return true })
				if got := health(devs); !mapsEqual(got, tc.want[r]) {
					t.Errorf("%s: units %v, want %v", r, got, tc.want[r])
				}
				if devs[0].ID != firstID[r] {
					t.Errorf("%s: first device %q", r, devs[0].ID)
				}
			}
			select {
			case pc := <-k.registered:
				t.Errorf("unexpected registration of %s", pc.req.ResourceName)
			default:
			}
		})
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// allocate asks the plugin for the preferred units of one container and
// allocates them, as the kubelet does.
func allocate(t *testing.T, pc *pluginConn, available []string, size int) ([]string, *pluginapi.ContainerAllocateResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	pref, err := pc.client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: available, AllocationSize: int32(size)},
	}})
	if err != nil {
		t.Fatalf("GetPreferredAllocation: %v", err)
	}
	ids := pref.ContainerResponses[0].DeviceIDs
	if len(ids) != size {
		t.Fatalf("GetPreferredAllocation proposed %v, want %d units", ids, size)
	}
	resp, err := pc.client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return ids, nil, err
	}
	return ids, resp.ContainerResponses[0], nil
}

func deviceIDs(devs []*pluginapi.Device) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.ID
	}
	return out
}

// without returns ids less those in taken.
func without(ids []string, taken ...[]string) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool {
		for _, t := range taken {
			if slices.Contains(t, id) {
				return true
			}
		}
		return false
	})
}

// Allocate leases the container's units on mpsd and hands the container
// the lease's MPS environment and mounts; a request mpsd has no room for
// fails with mpsd's reason; units the kubelet hands out again release the
// lease that held them.
func TestAllocate(t *testing.T) {
	m := newMPSD(t, `  a:
    users: ["UID"]
    memory: 20G
    max_clients: 2
`)
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	runPlugin(t, m, dir)
	pc := k.waitRegistered("mpsd.io/a-sm")["mpsd.io/a-sm"]
	all := deviceIDs(pc.waitList(t, "all units healthy", allHealthy))
	st := m.waitStatus("status", func(api.Status) bool { return true })
	uuid := map[int]string{}
	for _, in := range st.Instances {
		uuid[in.GPUIndex] = in.GPUUUID
	}

	// 30 units: packed on GPU 0 (both GPUs are empty: the lower index).
	first, resp, err := allocate(t, pc, all, 30)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if want := ids("a", 0, seq(0, 29)...); !slices.Equal(first, want) {
		t.Errorf("preferred %v, want %v", first, want)
	}
	st = m.waitStatus("the lease running", func(st api.Status) bool { _, ok := leaseByJob(st, "k8s:sm=0-29"); return ok })
	lease, _ := leaseByJob(st, "k8s:sm=0-29")
	if lease.State != api.LeaseRunning || lease.SM != 30 || lease.MemBytes != 6<<30 || !slices.Equal(lease.GPUIndexes, []int{0}) || lease.Group != "a" {
		t.Errorf("lease in mpsd's status: %+v; want running, sm 30, 6 GiB (30%% of 20G), GPU 0", lease)
	}
	pipe := filepath.Join(m.dir, "run", "a", uuid[0], "pipe")
	wantEnv := map[string]string{
		api.EnvPipeDirectory:    pipe,
		api.EnvThreadPercentage: "30",
		api.EnvPinnedMemLimit:   "0=6144M",
		api.EnvLeaseID:          lease.ID,
		api.EnvGroup:            "a",
		EnvVisibleDevices:       uuid[0],
		// The simulated driver's MPS takes it; the group's priority is 0.
		api.EnvClientPriority:  "0",
		"CUDA_VISIBLE_DEVICES": uuid[0],
	}
	if len(resp.Envs) != len(wantEnv) {
		t.Errorf("envs %v, want %v", resp.Envs, wantEnv)
	}
	for k, v := range wantEnv {
		if resp.Envs[k] != v {
			t.Errorf("env %s=%q, want %q", k, resp.Envs[k], v)
		}
	}
	if _, err := os.Stat(filepath.Join(pipe, "control")); err != nil {
		t.Errorf("the pipe directory handed out has no control socket: %v", err)
	}
	checkPodMounts(t, resp, pipe, filepath.Join(m.dir, "run", "a", uuid[0], "shm"))
	if len(resp.Devices) != 0 {
		t.Errorf("device nodes %v on simulated GPUs", resp.Devices)
	}
	// A CUDA client given the container's environment runs within the
	// lease's limits: 5 GiB fits its 6 GiB, 7 GiB does not.
	for _, tc := range []struct {
		alloc string
		ok    bool
	}{{"5G", true}, {"7G", false}} {
		cmd := exec.Command(filepath.Join(emutest.BinDir(t), emutest.ClientName), "--alloc", tc.alloc)
		for k, v := range resp.Envs {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out, err := cmd.CombinedOutput()
		if (err == nil) != tc.ok || !strings.Contains(string(out), "sm=30.0 devices=1 mem0=6144M") {
			t.Errorf("client allocating %s in the container's environment: %v, want success %v with sm 30, 6144M\n%s", tc.alloc, err, tc.ok, out)
		}
	}

	// A second container fits GPU 0 too (binpack); then GPU 0 has
	// max_clients leases, and mpsd refuses a third there, whatever the
	// kubelet thinks is free.
	second, _, err := allocate(t, pc, without(all, first), 20)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if u, _ := ParseUnit(second[0]); u.GPU != 0 {
		t.Errorf("second allocation on GPU %d, want 0 (binpack)", u.GPU)
	}
	_, _, err = allocate(t, pc, without(ids("a", 0, seq(0, 99)...), first, second), 10)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "no room now in group a") {
		t.Errorf("Allocate beyond max_clients: %v, want ResourceExhausted with mpsd's reason", err)
	}

	for _, tc := range []struct {
		name string
		ids  []string
		code codes.Code
		msg  string
	}{
		{"units on two GPUs", []string{"a-gpu0-sm90", "a-gpu1-sm0"}, codes.InvalidArgument, "must lie on one GPU"},
		{"another group's unit", []string{"b-gpu0-sm0"}, codes.InvalidArgument, "not a unit of group a"},
		{"a malformed ID", []string{"gpu0"}, codes.InvalidArgument, "bad device ID"},
		{"a GPU without an instance", []string{"a-gpu7-sm0"}, codes.FailedPrecondition, "no instance of group a on GPU 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pc.client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tc.ids}}})
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Allocate(%v) = %v, want %v containing %q", tc.ids, err, tc.code, tc.msg)
			}
		})
	}

	// The first pod ended: the kubelet lists its units as available and
	// hands some of them to a new container. The old lease goes and the
	// new one takes its place, with room on GPU 0 again.
	third, _, err := allocate(t, pc, without(ids("a", 0, seq(0, 99)...), second), 10)
	if err != nil {
		t.Fatalf("Allocate after the first pod ended: %v", err)
	}
	if want := ids("a", 0, seq(0, 9)...); !slices.Equal(third, want) {
		t.Errorf("preferred %v, want %v", third, want)
	}
	st = m.waitStatus("the first lease released", func(st api.Status) bool { return !hasLease(st, lease.ID) })
	if _, ok := leaseByJob(st, "k8s:sm=0-9"); !ok || len(st.Leases) != 2 {
		t.Errorf("leases after the reuse: %+v; want the second's and the new one", st.Leases)
	}
}

// A quarantine makes the instance's units unhealthy, and its lease is
// revoked; a resume makes them healthy again and the running allocation
// gets a lease back. A drain makes them unhealthy too, but leaves the
// lease. The other GPU is untouched throughout.
func TestHealthQuarantineAndRecovery(t *testing.T) {
	m := newMPSD(t, `  a:
    users: ["UID"]
    memory: 20G
`)
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	runPlugin(t, m, dir)
	pc := k.waitRegistered("mpsd.io/a-sm")["mpsd.io/a-sm"]
	pc.waitList(t, "all units healthy", allHealthy)
	if _, _, err := allocate(t, pc, ids("a", 1, seq(0, 99)...), 10); err != nil {
		t.Fatalf("Allocate on GPU 1: %v", err)
	}
	st := m.waitStatus("the lease", func(st api.Status) bool { _, ok := leaseByJob(st, "k8s:sm=0-9"); return ok })
	before, _ := leaseByJob(st, "k8s:sm=0-9")

	m.admin(api.PathInjectXid, api.InjectXidRequest{GPU: 1, Xid: 79})
	pc.waitList(t, "GPU 1 unhealthy", func(devs []*pluginapi.Device) bool {
		return mapsEqual(health(devs), map[string]int{"gpu0 Healthy": 100, "gpu1 Unhealthy": 100})
	})
	st = m.waitStatus("GPU 1 quarantined and its lease gone", func(st api.Status) bool {
		return instanceState(st, "a", 1) == api.InstanceQuarantined && !hasLease(st, before.ID)
	})
	if _, ok := leaseByJob(st, "k8s:sm=0-9"); ok {
		t.Errorf("a lease on the quarantined GPU: %+v", st.Leases)
	}

	m.admin(api.PathResume, api.AdminTarget{GPU: "1", Group: "a"})
	pc.waitList(t, "every unit healthy again", allHealthy)
	st = m.waitStatus("the allocation's lease renewed", func(st api.Status) bool {
		l, ok := leaseByJob(st, "k8s:sm=0-9")
		return ok && l.State == api.LeaseRunning
	})
	if l, _ := leaseByJob(st, "k8s:sm=0-9"); l.ID == before.ID || !slices.Equal(l.GPUIndexes, []int{1}) || l.SM != 10 {
		t.Errorf("renewed lease %+v; want a new one of 10 SM on GPU 1", l)
	}

	// Draining closes an instance to new pods: its units are unhealthy
	// until it is resumed, and the running allocation keeps its lease.
	m.admin(api.PathDrain, api.AdminTarget{GPU: "1", Group: "a"})
	pc.waitList(t, "GPU 1 draining", func(devs []*pluginapi.Device) bool {
		return mapsEqual(health(devs), map[string]int{"gpu0 Healthy": 100, "gpu1 Unhealthy": 100})
	})
	m.admin(api.PathResume, api.AdminTarget{GPU: "1", Group: "a"})
	pc.waitList(t, "every unit healthy after the drain", allHealthy)
	renewed, _ := leaseByJob(st, "k8s:sm=0-9")
	if st := m.waitStatus("status", func(api.Status) bool { return true }); !hasLease(st, renewed.ID) {
		t.Errorf("the drain took the running allocation's lease: %+v", st.Leases)
	}
}

func instanceState(st api.Status, group string, gpu int) string {
	in, _ := findInstance(st, group, gpu)
	return in.State
}

// When the kubelet restarts it deletes the plugins' sockets and serves a
// new kubelet.sock: the plugin serves its sockets again and registers
// anew; allocations and their leases are untouched.
func TestKubeletRestart(t *testing.T) {
	m := newMPSD(t, twoGroups)
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	runPlugin(t, m, dir)
	pcs := k.waitRegistered("mpsd.io/a-sm", "mpsd.io/b-sm")
	pcs["mpsd.io/b-sm"].waitList(t, "all units healthy", allHealthy)
	if _, _, err := allocate(t, pcs["mpsd.io/b-sm"], ids("b", 1, seq(0, 49)...), 25); err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	st := m.waitStatus("the lease", func(st api.Status) bool { _, ok := leaseByJob(st, "k8s:sm=0-24"); return ok })
	held, _ := leaseByJob(st, "k8s:sm=0-24")

	for round := range 2 {
		k.restart()
		pcs = k.waitRegistered("mpsd.io/a-sm", "mpsd.io/b-sm")
		for r, pc := range pcs {
			pc.waitList(t, "the list after the restart", allHealthy)
			if _, err := os.Stat(filepath.Join(dir, pc.req.Endpoint)); err != nil {
				t.Errorf("round %d: %s: socket: %v", round, r, err)
			}
		}
	}
	// The new connection allocates; the old allocation still holds its
	// lease, so the kubelet's next 25 units fit beside it.
	if _, _, err := allocate(t, pcs["mpsd.io/b-sm"], ids("b", 1, seq(25, 49)...), 25); err != nil {
		t.Fatalf("Allocate after the kubelet restarted: %v", err)
	}
	st = m.waitStatus("both leases", func(st api.Status) bool { _, ok := leaseByJob(st, "k8s:sm=25-49"); return ok })
	if !hasLease(st, held.ID) {
		t.Errorf("the lease held before the restart is gone: %+v", st.Leases)
	}
}

// mpsd --kubelet-device-plugin runs the plugin on mpsd's own socket. When
// mpsd restarts, the new plugin registers again and adopts the leases the
// old one held (mpsd kept them): a unit handed out again releases the
// adopted lease as it would its own.
func TestMPSDFlag(t *testing.T) {
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	m := newMPSD(t, twoGroups, "--kubelet-device-plugin", "--kubelet-dir", dir, "--kubelet-groups", "a", "--kubelet-pod-resources", filepath.Join(dir, "none.sock"))
	pc := k.waitRegistered("mpsd.io/a-sm")["mpsd.io/a-sm"]
	pc.waitList(t, "all units healthy", allHealthy)
	// By default every container is checked before it starts, and one
	// that cannot be checked does not start.
	if err := kubeletStart(t, pc, ids("a", 0, 0)); !pc.opts.GetPreStartRequired() || status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "none.sock") {
		t.Errorf("mpsd's plugin: PreStartRequired %v, PreStartContainer without the kubelet's PodResources: %v; want it asked for and failing closed", pc.opts.GetPreStartRequired(), err)
	}
	if _, _, err := allocate(t, pc, ids("a", 0, seq(0, 99)...), 40); err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	st := m.waitStatus("the lease", func(st api.Status) bool { _, ok := leaseByJob(st, "k8s:sm=0-39"); return ok })
	held, _ := leaseByJob(st, "k8s:sm=0-39")
	// Only the daemons of the groups the plugin serves have a private
	// /dev/shm: b's clients may be on the host.
	mpsdNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", m.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range st.Instances {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", in.DaemonPID))
		_, serr := os.Stat(filepath.Join(m.dir, "run", in.Group, in.GPUUUID, "shm"))
		if private := in.Group == "a"; err != nil || (ns != mpsdNS) != private || (serr == nil) != private {
			t.Errorf("group %s's daemon on GPU %d: mount namespace %s (mpsd's %s, %v), shm dir: %v; want a private one only for group a", in.Group, in.GPUIndex, ns, mpsdNS, err, serr)
		}
	}

	m.stop()
	m.start("--kubelet-device-plugin", "--kubelet-dir", dir, "--kubelet-groups", "a")
	pc = k.waitRegistered("mpsd.io/a-sm")["mpsd.io/a-sm"]
	pc.waitList(t, "all units healthy", allHealthy)
	if st := m.waitStatus("status", func(api.Status) bool { return true }); !hasLease(st, held.ID) {
		t.Fatalf("mpsd did not keep the lease across its restart: %+v", st.Leases)
	}
	// The pod with units 0-39 ended; the kubelet hands 0-9 to a new one.
	if _, _, err := allocate(t, pc, ids("a", 0, seq(0, 99)...), 10); err != nil {
		t.Fatalf("Allocate after mpsd restarted: %v", err)
	}
	m.waitStatus("the adopted lease released and the new one running", func(st api.Status) bool {
		_, ok := leaseByJob(st, "k8s:sm=0-9")
		return ok && !hasLease(st, held.ID)
	})
}
