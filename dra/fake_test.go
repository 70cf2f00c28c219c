package dra

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/deviceplugin"
)

// wait bounds every wait of a test on an event.
const wait = 20 * time.Second

// fakeMPSD is mpsd's API as the driver sees it: a status of instances
// and leases, admission by the instances' SM and memory budgets (what
// mpsd refuses, with a reason in mpsd's words), lease streams that
// release their lease when closed, and a restart that ends every stream
// while keeping the leases.
type fakeMPSD struct {
	mu       sync.Mutex
	st       api.Status
	next     int
	requests []api.LeaseRequest
	streams  map[string]*fakeStream
	// refuse, when set, is the message of a refusal of every new lease.
	refuse string
	// statusErr, when set, is what Status answers.
	statusErr error
	// leaseErr, when set, is what Lease answers.
	leaseErr error
}

var _ deviceplugin.MPSD = (*fakeMPSD)(nil)

func newFakeMPSD(instances ...api.InstanceStatus) *fakeMPSD {
	return &fakeMPSD{st: api.Status{Instances: instances}, streams: map[string]*fakeStream{}}
}

// instance is a ready instance of group on GPU gpu: 100 % of its SMs,
// 16 GiB, multiuser.
func instance(group string, gpu int) api.InstanceStatus {
	uuid := fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", gpu)
	return api.InstanceStatus{
		GPUUUID: uuid, GPUIndex: gpu, Group: group, State: api.InstanceReady, DaemonPID: 100 + gpu,
		GPUIndexes: []int{gpu}, GPUUUIDs: []string{uuid}, SMBudget: 100, MemBudgetBytes: 16 << 30,
		Multiuser: true, GPUModel: "NVIDIA A100-SXM4-40GB", DriverVersion: "580.159.04", MPSVersion: "13000",
	}
}

func (f *fakeMPSD) Status(ctx context.Context) (api.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.statusErr != nil {
		return api.Status{}, f.statusErr
	}
	st := f.st
	st.Instances = slices.Clone(st.Instances)
	st.Leases = slices.Clone(st.Leases)
	return st, nil
}

func (f *fakeMPSD) setState(gpu int, group, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.st.Instances {
		if in := &f.st.Instances[i]; in.GPUIndex == gpu && in.Group == group {
			in.State = state
		}
	}
}

func (f *fakeMPSD) Lease(ctx context.Context, req api.LeaseRequest) (deviceplugin.LeaseStream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	if f.leaseErr != nil {
		return nil, f.leaseErr
	}
	if req.ResumeLeaseID != "" {
		for _, l := range f.st.Leases {
			if l.ID == req.ResumeLeaseID {
				s := f.stream(l.ID)
				s.events <- api.Event{Type: api.EventGranted, Lease: f.leaseOf(l)}
				return s, nil
			}
		}
		return nil, &api.Error{Code: api.CodeNotFound, Message: "lease " + req.ResumeLeaseID + " is not known to mpsd (it ended or was lost)"}
	}
	s := &fakeStream{f: f, events: make(chan api.Event, 4), done: make(chan struct{})}
	if f.refuse != "" {
		s.events <- api.Event{Type: api.EventError, Code: api.CodeRefused, Message: f.refuse}
		return s, nil
	}
	var in *api.InstanceStatus
	for i := range f.st.Instances {
		if c := &f.st.Instances[i]; c.Group == req.Group && slices.Contains(req.GPUSelect, c.GPUUUID) {
			in = c
		}
	}
	if in == nil {
		return nil, &api.Error{Code: api.CodeBadRequest, Message: "no instance of group " + req.Group + " among the selected GPUs"}
	}
	if in.SMAllocated+req.SM > in.SMBudget || in.MemAllocatedBytes+req.MemBytes > in.MemBudgetBytes {
		s.events <- api.Event{Type: api.EventError, Code: api.CodeWaitTimeout,
			Message: fmt.Sprintf("no room now: GPU %d has %d%% SM and %d MiB free in group %s", in.GPUIndex, in.SMBudget-in.SMAllocated, (in.MemBudgetBytes-in.MemAllocatedBytes)>>20, in.Group)}
		return s, nil
	}
	in.SMAllocated += req.SM
	in.MemAllocatedBytes += req.MemBytes
	f.next++
	ls := api.LeaseStatus{ID: "l" + strconv.Itoa(f.next), Group: req.Group, GPUIndexes: []int{in.GPUIndex}, UID: uint32(os.Getuid()),
		SM: req.SM, MemBytes: req.MemBytes, Attempt: 1, State: api.LeaseRunning, JobID: req.JobID}
	f.st.Leases = append(f.st.Leases, ls)
	s.id = ls.ID
	f.streams[ls.ID] = s
	s.events <- api.Event{Type: api.EventGranted, Lease: f.leaseOf(ls)}
	return s, nil
}

func (f *fakeMPSD) stream(id string) *fakeStream {
	s := &fakeStream{f: f, id: id, events: make(chan api.Event, 4), done: make(chan struct{})}
	f.streams[id] = s
	return s
}

func (f *fakeMPSD) leaseOf(l api.LeaseStatus) *api.Lease {
	var uuids []string
	for _, in := range f.st.Instances {
		if in.Group == l.Group && in.GPUIndex == l.GPUIndexes[0] {
			uuids = in.GPUUUIDs
		}
	}
	pipe := fmt.Sprintf("/run/mpsd/%s/%s/pipe", l.Group, uuids[0])
	return &api.Lease{ID: l.ID, Group: l.Group, GPUIndexes: l.GPUIndexes, GPUUUIDs: uuids, SM: l.SM, MemBytes: l.MemBytes, Attempt: l.Attempt,
		Env: map[string]string{
			api.EnvPipeDirectory: pipe, api.EnvThreadPercentage: strconv.Itoa(l.SM),
			api.EnvPinnedMemLimit: fmt.Sprintf("0=%dM", l.MemBytes>>20), api.EnvLeaseID: l.ID, api.EnvGroup: l.Group,
		}}
}

// release drops lease id, as mpsd does when its stream closes.
func (f *fakeMPSD) release(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, l := range f.st.Leases {
		if l.ID != id {
			continue
		}
		for j := range f.st.Instances {
			if in := &f.st.Instances[j]; in.Group == l.Group && in.GPUIndex == l.GPUIndexes[0] {
				in.SMAllocated -= l.SM
				in.MemAllocatedBytes -= l.MemBytes
			}
		}
		f.st.Leases = slices.Delete(f.st.Leases, i, i+1)
		return
	}
}

// restart ends every stream as a stopping mpsd does, keeping the leases.
func (f *fakeMPSD) restart() {
	f.mu.Lock()
	streams := f.streams
	f.streams = map[string]*fakeStream{}
	f.mu.Unlock()
	for _, s := range streams {
		s.end()
	}
}

// add puts lease l in mpsd's status, as another client's request did,
// counting it on its instance.
func (f *fakeMPSD) add(l api.LeaseStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for j := range f.st.Instances {
		if in := &f.st.Instances[j]; in.Group == l.Group && in.GPUIndex == l.GPUIndexes[0] {
			in.SMAllocated += l.SM
			in.MemAllocatedBytes += l.MemBytes
		}
	}
	f.st.Leases = append(f.st.Leases, l)
}

func (f *fakeMPSD) leases() []api.LeaseStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.st.Leases)
}

func (f *fakeMPSD) leaseRequests() []api.LeaseRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

// fakeStream is one lease's stream: closing it releases the lease,
// unless mpsd ended it first (a restart).
type fakeStream struct {
	f      *fakeMPSD
	id     string
	events chan api.Event
	once   sync.Once
	done   chan struct{}
	mu     sync.Mutex
	ended  bool
}

func (s *fakeStream) Next() (api.Event, error) {
	select {
	case ev := <-s.events:
		return ev, nil
	case <-s.done:
		return api.Event{}, io.EOF
	}
}

func (s *fakeStream) Close() error {
	s.once.Do(func() {
		close(s.done)
		s.mu.Lock()
		ended := s.ended
		s.mu.Unlock()
		if !ended && s.id != "" {
			s.f.release(s.id)
		}
	})
	return nil
}

// end is mpsd's side ending the stream while keeping the lease.
func (s *fakeStream) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.once.Do(func() { close(s.done) })
}

// fakeEdits is deviceplugin.ContainerEdits without a host: the lease's
// environment and the mounts an instance with a private /dev/shm gets.
func fakeEdits(l *api.Lease, in api.InstanceStatus) (*pluginapi.ContainerAllocateResponse, error) {
	pipe := l.Env[api.EnvPipeDirectory]
	envs := map[string]string{}
	for k, v := range l.Env {
		envs[k] = v
	}
	envs[deviceplugin.EnvVisibleDevices] = l.GPUUUIDs[0]
	return &pluginapi.ContainerAllocateResponse{Envs: envs, Mounts: []*pluginapi.Mount{
		{ContainerPath: pipe, HostPath: pipe, ReadOnly: true},
		{ContainerPath: pipe + "/log", HostPath: "/dev/null", ReadOnly: true},
		{ContainerPath: pipe + "/nvidia-cuda-mps-control.pid", HostPath: "/dev/null", ReadOnly: true},
		{ContainerPath: "/dev/shm", HostPath: pipe + ".shm"},
	}}, nil
}

// allocated is a claim of namespace/name allocated on device of node,
// consuming sm percent and mem bytes (none: whole device).
func allocated(namespace, name, uid, node, device string, sm int64, mem int64) *resourceapi.ResourceClaim {
	r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: DriverName, Pool: node, Device: device}
	if sm > 0 {
		share := types.UID("share-" + uid)
		r.ShareID = &share
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			CapacitySM: *resource.NewQuantity(sm, resource.DecimalSI), CapacityMemory: *resource.NewQuantity(mem, resource.BinarySI),
		}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}},
		}},
	}
}

// newTestDriver is a Driver of node "node-a" over f with fakeEdits,
// writing CDI specs into a temporary directory.
func newTestDriver(t *testing.T, f *fakeMPSD, mutate func(*Options)) *Driver {
	t.Helper()
	opts := Options{MPSD: f, NodeName: "node-a", CDIDir: t.TempDir(), Edits: fakeEdits, PollInterval: 10 * time.Millisecond,
		Limits: map[string]Limits{"inference": {MaxSM: 50, DefaultSM: 10, MaxMem: 12 << 30, DefaultMem: 1 << 30}}}
	if mutate != nil {
		mutate(&opts)
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	return d
}

// afterWait fires when a test has waited too long for an event.
func afterWait() <-chan time.Time { return time.After(wait) }

// end ends lease id for good, as mpsd does (an error event), and
// forgets it.
func (f *fakeMPSD) end(id string, code api.ErrorCode, msg string) {
	f.mu.Lock()
	s := f.streams[id]
	delete(f.streams, id)
	f.mu.Unlock()
	f.release(id)
	s.events <- api.Event{Type: api.EventError, Code: code, Message: msg}
}
