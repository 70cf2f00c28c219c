package dra

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/mpsd/mpsd/api"
)

// prepare prepares claims on d and fails the test on an overall error.
func prepare(t *testing.T, d *Driver, claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(claims) {
		t.Fatalf("%d results for %d claims", len(res), len(claims))
	}
	return res
}

// readSpec reads a claim's CDI spec as a container runtime does
// (validated by the CDI library).
func readSpec(t *testing.T, d *Driver, uid types.UID) *cdi.Spec {
	t.Helper()
	s, err := cdi.ReadSpec(d.specPath(uid), 0)
	if err != nil {
		t.Fatalf("CDI spec of claim %s: %v", uid, err)
	}
	return s
}

// Two users' claims (two namespaces) on one device each get a lease of
// what they consumed, under their claim's UID as job id, a CDI spec with
// their lease's environment and the instance's masked pipe directory and
// private /dev/shm (no host /dev/shm), and their lease in the claim's
// status.
func TestPrepareTwoClaims(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	kube := fake.NewClientset(alice, bob)
	d := newTestDriver(t, f, func(o *Options) { o.Kube = kube })

	res := prepare(t, d, alice, bob)
	for _, c := range []struct {
		claim   *resourceapi.ResourceClaim
		sm      int
		mem     int64
		ownEnvs []string
	}{
		{alice, 30, 8 << 30, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"}},
		{bob, 20, 4 << 30, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M"}},
	} {
		t.Run(c.claim.Namespace, func(t *testing.T) {
			r := res[c.claim.UID]
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			want := CDIDeviceID(c.claim.UID, 0)
			if len(r.Devices) != 1 || r.Devices[0].DeviceName != "inference-gpu0" || r.Devices[0].PoolName != "node-a" ||
				!slices.Equal(r.Devices[0].CDIDeviceIDs, []string{want}) || !slices.Equal(r.Devices[0].Requests, []string{"gpu"}) ||
				r.Devices[0].ShareID == nil {
				t.Fatalf("devices %+v, want inference-gpu0 of node-a as %s with its share", r.Devices, want)
			}
			var ls *api.LeaseStatus
			for _, l := range f.leases() {
				if l.JobID == JobID(c.claim.UID, 0) {
					ls = &l
				}
			}
			if ls == nil || ls.SM != c.sm || ls.MemBytes != c.mem {
				t.Fatalf("lease of job %s: %+v, want sm %d, mem %d", JobID(c.claim.UID, 0), ls, c.sm, c.mem)
			}
			spec := readSpec(t, d, c.claim.UID)
			dev := spec.GetDevice(strings.TrimPrefix(want, CDIKind+"="))
			if dev == nil {
				t.Fatalf("CDI spec has no device %s", want)
			}
			e := dev.ContainerEdits
			for _, env := range append(c.ownEnvs, "MPSD_LEASE_ID="+ls.ID, "MPSD_GROUP=inference") {
				if !slices.Contains(e.Env, env) {
					t.Errorf("env %q missing from %q", env, e.Env)
				}
			}
			mounts := map[string]string{}
			for _, m := range e.Mounts {
				mounts[m.ContainerPath] = m.HostPath + " " + strings.Join(m.Options, ",")
			}
			pipe := "/run/mpsd/inference/GPU-00000000-0000-0000-0000-000000000000/pipe"
			for path, want := range map[string]string{
				pipe:                                  pipe + " rbind,rprivate,nosuid,nodev,ro",
				pipe + "/log":                         "/dev/null rbind,rprivate,nosuid,nodev,ro",
				pipe + "/nvidia-cuda-mps-control.pid": "/dev/null rbind,rprivate,nosuid,nodev,ro",
				"/dev/shm":                            pipe + ".shm rbind,rprivate,nosuid,nodev,rw",
			} {
				if mounts[path] != want {
					t.Errorf("mount at %s: %q, want %q", path, mounts[path], want)
				}
			}
			got, err := kube.ResourceV1().ResourceClaims(c.claim.Namespace).Get(context.Background(), c.claim.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Status.Devices) != 1 || got.Status.Devices[0].Driver != DriverName || got.Status.Devices[0].Device != "inference-gpu0" {
				t.Fatalf("claim status devices %+v, want one of %s", got.Status.Devices, DriverName)
			}
			var data LeaseData
			if err := json.Unmarshal(got.Status.Devices[0].Data.Raw, &data); err != nil {
				t.Fatal(err)
			}
			if data.Lease != ls.ID || data.State != "running" || data.SM != c.sm || data.MemBytes != c.mem {
				t.Errorf("claim status data %+v, want lease %s running with sm %d, mem %d", data, ls.ID, c.sm, c.mem)
			}
		})
	}
}

// A second prepare of a claim (the kubelet restarted) makes no new lease
// and returns the same devices.
func TestPrepareIdempotent(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	d := newTestDriver(t, f, nil)
	c := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	first := prepare(t, d, c)[c.UID]
	second := prepare(t, d, c)[c.UID]
	if first.Err != nil || second.Err != nil {
		t.Fatal(first.Err, second.Err)
	}
	if n := len(f.leaseRequests()); n != 1 {
		t.Errorf("%d lease requests, want 1", n)
	}
	if !slices.Equal(first.Devices[0].CDIDeviceIDs, second.Devices[0].CDIDeviceIDs) {
		t.Errorf("devices %v then %v", first.Devices, second.Devices)
	}
}

// A claim mpsd cannot honour fails with mpsd's reason and leaves no
// lease and no CDI spec; the other user's claim is untouched.
func TestPrepareRefused(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	d := newTestDriver(t, f, nil)
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 80, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 30, 4<<30)
	res := prepare(t, d, alice, bob)
	if res[alice.UID].Err != nil {
		t.Fatal(res[alice.UID].Err)
	}
	err := res[bob.UID].Err
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "no room now: GPU 0 has 20% SM") {
		t.Fatalf("bob's claim: %v, want ErrRefused with mpsd's reason", err)
	}
	if _, err := os.Stat(d.specPath(bob.UID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused claim's CDI spec: %v, want none", err)
	}
	if n := len(f.leases()); n != 1 {
		t.Errorf("%d leases, want alice's only", n)
	}
	f.mu.Lock()
	f.refuse = `uid 1001 is not a member of group "inference"`
	f.mu.Unlock()
	carol := allocated("carol", "x", "uid-carol", "node-a", "inference-gpu0", 10, 1<<30)
	if err := prepare(t, d, carol)[carol.UID].Err; !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "not a member") {
		t.Errorf("carol's claim: %v, want mpsd's refusal", err)
	}
}

// Unprepare releases the claim's lease and removes its CDI spec; a
// second unprepare, and one of a claim never prepared, are no error.
func TestUnprepareReleases(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	d := newTestDriver(t, f, nil)
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	prepare(t, d, alice, bob)
	objs := []kubeletplugin.NamespacedObject{{UID: alice.UID}, {UID: "never-prepared"}}
	for range 2 {
		res, err := d.UnprepareResourceClaims(context.Background(), objs)
		if err != nil {
			t.Fatal(err)
		}
		for uid, err := range res {
			if err != nil {
				t.Errorf("unprepare %s: %v", uid, err)
			}
		}
	}
	ls := f.leases()
	if len(ls) != 1 || ls[0].JobID != JobID(bob.UID, 0) {
		t.Fatalf("leases %+v, want bob's only", ls)
	}
	if _, err := os.Stat(d.specPath(alice.UID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("alice's CDI spec: %v, want removed", err)
	}
	readSpec(t, d, bob.UID)
	entries, _ := os.ReadDir(d.opts.CDIDir)
	if len(entries) != 1 {
		t.Errorf("CDI dir holds %d entries, want bob's spec only (no temporary files)", len(entries))
	}
}

// After mpsd and the driver restart, a prepare of a claim prepared before
// adopts its lease by job id and resumes it: no new lease, the same CDI
// device; unprepare then releases it.
func TestPrepareAfterRestart(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	dir := t.TempDir()
	d1 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	c := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	before := prepare(t, d1, c)[c.UID]
	f.restart()
	d1.stop()
	if n := len(f.leases()); n != 1 {
		t.Fatalf("%d leases after the restart, want 1 kept", n)
	}
	d2 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	after := prepare(t, d2, c)[c.UID]
	if after.Err != nil {
		t.Fatal(after.Err)
	}
	reqs := f.leaseRequests()
	if len(reqs) != 2 || reqs[1].ResumeLeaseID != f.leases()[0].ID {
		t.Fatalf("lease requests %+v, want the first and its resumption", reqs)
	}
	if !slices.Equal(before.Devices[0].CDIDeviceIDs, after.Devices[0].CDIDeviceIDs) {
		t.Errorf("CDI devices %v, then %v", before.Devices[0].CDIDeviceIDs, after.Devices[0].CDIDeviceIDs)
	}
	readSpec(t, d2, c.UID)
	if _, err := d2.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.leases()); n != 0 {
		t.Errorf("%d leases after unprepare, want 0", n)
	}
}

// Without consumable capacity a claim gets the whole device: a lease of
// the group's max_sm and max_mem.
func TestPrepareWholeDevice(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	d := newTestDriver(t, f, func(o *Options) { o.Mode = Whole })
	c := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 0, 0)
	if err := prepare(t, d, c)[c.UID].Err; err != nil {
		t.Fatal(err)
	}
	ls := f.leases()
	if len(ls) != 1 || ls[0].SM != 50 || ls[0].MemBytes != 12<<30 {
		t.Fatalf("leases %+v, want one of max_sm 50, max_mem 12G", ls)
	}
}

// A claim for a device of another node or one mpsd runs no instance of
// fails without a lease.
func TestPrepareUnknownDevice(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	d := newTestDriver(t, f, nil)
	for _, c := range []*resourceapi.ResourceClaim{
		allocated("alice", "a", "uid-a", "node-b", "inference-gpu0", 10, 1<<30),
		allocated("alice", "b", "uid-b", "node-a", "inference-gpu7", 10, 1<<30),
	} {
		if err := prepare(t, d, c)[c.UID].Err; err == nil {
			t.Errorf("claim %s on %s/%s prepared", c.Name, c.Status.Allocation.Devices.Results[0].Pool, c.Status.Allocation.Devices.Results[0].Device)
		}
	}
	if n := len(f.leaseRequests()); n != 0 {
		t.Errorf("%d lease requests, want none", n)
	}
	if entries, _ := os.ReadDir(filepath.Clean(d.opts.CDIDir)); len(entries) != 0 {
		t.Errorf("CDI dir holds %d entries", len(entries))
	}
}

// A lease mpsd ends (its instance recovering) is asked for anew once the
// instance is ready again, and the claim's CDI spec rewritten with the
// new lease; the other user's claim keeps its lease.
func TestLeaseRenewedAfterMPSDEndsIt(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	d := newTestDriver(t, f, nil)
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	prepare(t, d, alice, bob)
	var aliceLease, bobLease string
	for _, l := range f.leases() {
		switch l.JobID {
		case JobID(alice.UID, 0):
			aliceLease = l.ID
		case JobID(bob.UID, 0):
			bobLease = l.ID
		}
	}
	pub := &publisher{got: make(chan []resourceapi.Device, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx, pub) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	f.setState(0, "inference", api.InstanceRecovering)
	f.end(aliceLease, api.CodeUnavailable, "the instance's MPS server failed")
	for devs := pub.next(t); len(devs[0].Taints) == 0; devs = pub.next(t) {
	}
	f.setState(0, "inference", api.InstanceReady)
	deadline := afterWait()
	for {
		spec := readSpec(t, d, alice.UID)
		env := spec.Devices[0].ContainerEdits.Env
		if slices.ContainsFunc(env, func(e string) bool {
			return strings.HasPrefix(e, "MPSD_LEASE_ID=") && e != "MPSD_LEASE_ID="+aliceLease
		}) {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("alice's CDI spec still names lease %s: %q", aliceLease, env)
		case <-pub.got:
		case <-time.After(10 * time.Millisecond):
		}
	}
	ls := f.leases()
	if len(ls) != 2 || !slices.ContainsFunc(ls, func(l api.LeaseStatus) bool { return l.ID == bobLease }) {
		t.Errorf("leases %+v, want bob's %s and alice's new one", ls, bobLease)
	}
}

// A claim prepared before mpsd and the driver restarted, unprepared
// before any prepare: its lease, adopted by job id, is resumed and
// released.
func TestUnprepareAfterRestart(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	dir := t.TempDir()
	d1 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	prepare(t, d1, alice, bob)
	f.restart()
	d1.stop()
	d2 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	if _, err := d2.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: alice.UID}}); err != nil {
		t.Fatal(err)
	}
	if ls := f.leases(); len(ls) != 1 || ls[0].JobID != JobID(bob.UID, 0) {
		t.Fatalf("leases %+v, want bob's only", ls)
	}
	if _, err := os.Stat(d2.specPath(alice.UID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("alice's CDI spec: %v, want removed", err)
	}
	readSpec(t, d2, bob.UID)
}

// A claim unprepared after a restart while mpsd's status cannot be read
// fails (its lease is not known yet), keeping its lease; once the status
// reads, unprepare releases it and bob's lease stays.
func TestUnprepareWhileStatusFails(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	dir := t.TempDir()
	d1 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	prepare(t, d1, alice, bob)
	f.restart()
	d1.stop()
	d2 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	f.mu.Lock()
	f.statusErr = errors.New("connection refused")
	f.mu.Unlock()
	objs := []kubeletplugin.NamespacedObject{{UID: alice.UID}}
	res, err := d2.UnprepareResourceClaims(context.Background(), objs)
	if err != nil {
		t.Fatal(err)
	}
	if res[alice.UID] == nil {
		t.Fatal("unprepare succeeded while mpsd's status could not be read")
	}
	if n := len(f.leases()); n != 2 {
		t.Fatalf("%d leases, want both kept", n)
	}
	f.mu.Lock()
	f.statusErr = nil
	f.mu.Unlock()
	retryReleases(t, f, d2, objs, alice.UID, bob.UID, "once the status reads")
}

// A lease that cannot be released (mpsd answers its resumption with an
// error other than not found) fails the claim's unprepare, keeping the
// lease; the kubelet's retry then releases it. Bob's lease stays.
func TestUnprepareReleaseFails(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	dir := t.TempDir()
	d1 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	prepare(t, d1, alice, bob)
	f.restart()
	d1.stop()
	d2 := newTestDriver(t, f, func(o *Options) { o.CDIDir = dir })
	f.mu.Lock()
	f.leaseErr = &api.Error{Code: api.CodeUnavailable, Message: "mpsd is starting"}
	f.mu.Unlock()
	objs := []kubeletplugin.NamespacedObject{{UID: alice.UID}}
	res, err := d2.UnprepareResourceClaims(context.Background(), objs)
	if err != nil {
		t.Fatal(err)
	}
	if res[alice.UID] == nil || !strings.Contains(res[alice.UID].Error(), "mpsd is starting") {
		t.Fatalf("unprepare: %v, want mpsd's error", res[alice.UID])
	}
	if n := len(f.leases()); n != 2 {
		t.Fatalf("%d leases, want both kept", n)
	}
	readSpec(t, d2, alice.UID)
	f.mu.Lock()
	f.leaseErr = nil
	f.mu.Unlock()
	retryReleases(t, f, d2, objs, alice.UID, bob.UID, "once mpsd answers")
}

// retryReleases is the kubelet's retry of a failed unprepare of claim
// gone (objs): it must succeed now, release that claim's lease and remove
// its CDI spec, and leave kept's lease alone.
func retryReleases(t *testing.T, f *fakeMPSD, d *Driver, objs []kubeletplugin.NamespacedObject, gone, kept types.UID, when string) {
	t.Helper()
	res, err := d.UnprepareResourceClaims(context.Background(), objs)
	if err != nil || res[gone] != nil {
		t.Fatalf("unprepare %s: %v, %v", when, err, res[gone])
	}
	if ls := f.leases(); len(ls) != 1 || ls[0].JobID != JobID(kept, 0) {
		t.Fatalf("leases %+v, want %s's only", ls, kept)
	}
	if _, err := os.Stat(d.specPath(gone)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CDI spec of %s: %v, want removed", gone, err)
	}
}

// A running lease another client of this uid opened with a claim's job id
// (job ids are free text) is adopted, but not handed to the claim when its
// device or size is not the allocation's: prepare releases it and opens
// the claim's own. Bob's claim keeps his lease.
func TestForgedJobIDNotHandedOut(t *testing.T) {
	for _, c := range []struct {
		name    string
		gpu, sm int
		mem     int64
	}{
		{"other device", 1, 30, 8 << 30},
		{"other sm", 0, 50, 8 << 30},
		{"other memory", 0, 30, 12 << 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeMPSD(instance("inference", 0), instance("inference", 1))
			alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
			bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
			f.add(api.LeaseStatus{ID: "forged", Group: "inference", GPUIndexes: []int{c.gpu}, UID: uint32(os.Getuid()),
				SM: c.sm, MemBytes: c.mem, Attempt: 1, State: api.LeaseRunning, JobID: JobID(alice.UID, 0)})
			d := newTestDriver(t, f, nil)
			res := prepare(t, d, alice, bob)
			for uid, r := range res {
				if r.Err != nil {
					t.Fatalf("claim %s: %v", uid, r.Err)
				}
			}
			ls := f.leases()
			if len(ls) != 2 || slices.ContainsFunc(ls, func(l api.LeaseStatus) bool { return l.ID == "forged" }) {
				t.Fatalf("leases %+v, want alice's and bob's, not the forged one", ls)
			}
			for _, l := range ls {
				if l.JobID == JobID(alice.UID, 0) && (l.GPUIndexes[0] != 0 || l.SM != 30 || l.MemBytes != 8<<30) {
					t.Errorf("alice's lease %+v, want GPU 0, sm 30, 8 GiB", l)
				}
			}
			env := readSpec(t, d, alice.UID).Devices[0].ContainerEdits.Env
			if slices.Contains(env, "MPSD_LEASE_ID=forged") {
				t.Errorf("alice's CDI spec hands out the forged lease: %q", env)
			}
		})
	}
}

// A running lease of another uid carrying a claim's job id is not
// adopted: prepare opens the claim's own lease and leaves that one be.
func TestOtherUIDLeaseNotAdopted(t *testing.T) {
	in := instance("inference", 0)
	in.MemBudgetBytes = 32 << 30
	f := newFakeMPSD(in)
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	f.add(api.LeaseStatus{ID: "theirs", Group: "inference", GPUIndexes: []int{0}, UID: uint32(os.Getuid()) + 1000,
		SM: 30, MemBytes: 8 << 30, Attempt: 1, State: api.LeaseRunning, JobID: JobID(alice.UID, 0)})
	d := newTestDriver(t, f, nil)
	for uid, r := range prepare(t, d, alice, bob) {
		if r.Err != nil {
			t.Fatalf("claim %s: %v", uid, r.Err)
		}
	}
	for _, r := range f.leaseRequests() {
		if r.ResumeLeaseID != "" {
			t.Errorf("lease request %+v resumes a lease", r)
		}
	}
	if ls := f.leases(); len(ls) != 3 || ls[0].ID != "theirs" {
		t.Fatalf("leases %+v, want the other uid's kept, alice's and bob's", ls)
	}
	if env := readSpec(t, d, alice.UID).Devices[0].ContainerEdits.Env; slices.Contains(env, "MPSD_LEASE_ID=theirs") {
		t.Errorf("alice's CDI spec hands out the other uid's lease: %q", env)
	}
}

// In Consumable mode an allocation that consumed no memory, or nothing,
// is refused with a reason and without a lease (mpsd's defaults are not
// what the scheduler counted); bob's full one is prepared.
func TestConsumableWithoutCapacityRefused(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	d := newTestDriver(t, f, nil)
	noMem := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	delete(noMem.Status.Allocation.Devices.Results[0].ConsumedCapacity, CapacityMemory)
	none := allocated("alice", "whole", "uid-alice-2", "node-a", "inference-gpu0", 0, 0)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	res := prepare(t, d, noMem, none, bob)
	for _, c := range []*resourceapi.ResourceClaim{noMem, none} {
		if err := res[c.UID].Err; err == nil || !strings.Contains(err.Error(), "consumed no") {
			t.Errorf("claim %s: %v, want refused for its missing capacity", c.Name, err)
		}
	}
	if res[bob.UID].Err != nil {
		t.Fatal(res[bob.UID].Err)
	}
	if ls := f.leases(); len(ls) != 1 || ls[0].JobID != JobID(bob.UID, 0) {
		t.Fatalf("leases %+v, want bob's only", ls)
	}
}
