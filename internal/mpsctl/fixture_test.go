package mpsctl

import (
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

// statusFixture is a status document of a 4-GPU host, its lists in no
// particular order (mpsctl sorts them).
func statusFixture() api.Status {
	at := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	return api.Status{
		SchemaVersion: api.StatusSchemaVersion,
		At:            at,
		Instances: []api.InstanceStatus{
			{
				GPUUUID: "GPU-bbbbbbbb-1111-2222-3333-444444444444", GPUIndex: 1, Group: "inference",
				State: api.InstanceDraining, Drained: true, DrainReason: "fan replacement", DrainedBy: "alice", DrainedAt: at.Add(-20 * time.Minute),
				DaemonPID: 2100, ServerPIDs: []int{2101}, Clients: 1, Restarts: 0,
				Servers:    []api.ServerStatus{{PID: 2101, UID: 1002, UnleasedClients: 1}},
				GPUIndexes: []int{1}, GPUUUIDs: []string{"GPU-bbbbbbbb-1111-2222-3333-444444444444"},
				SMAllocated: 25, SMBudget: 100, MemAllocatedBytes: 8 * units.GiB, MemBudgetBytes: 24 * units.GiB, MaxClients: 16,
				Unleased:         []api.UnleasedClient{{PID: 2150, UID: 1002, Server: 2101, MemBytes: uint64p(uint64(2 * units.GiB))}},
				UnleasedMemBytes: 2 * units.GiB, MemUsedBytes: uint64p(uint64(2 * units.GiB)), ServingUID: intp(1002),
			},
			{
				GPUUUID: "GPU-bbbbbbbb-1111-2222-3333-444444444444", GPUIndex: 1, Group: "training",
				State: api.InstanceDrained, Drained: true, DrainReason: "driver upgrade", DrainedBy: "root", DrainedAt: at.Add(-3 * time.Hour),
				DaemonPID: 2300, ServerPIDs: []int{}, GPUIndexes: []int{1}, GPUUUIDs: []string{"GPU-bbbbbbbb-1111-2222-3333-444444444444"},
				SMBudget: 100, MemBudgetBytes: 24 * units.GiB, MaxClients: 16,
			},
			{
				GPUUUID: "GPU-bbbbbbbb-1111-2222-3333-444444444444", GPUIndex: 1, Group: "legacy",
				State: api.InstanceRetiring, DaemonPID: 2400, ServerPIDs: []int{2401}, Clients: 1,
				GPUIndexes: []int{1}, GPUUUIDs: []string{"GPU-bbbbbbbb-1111-2222-3333-444444444444"},
				SMAllocated: 10, SMBudget: 100, MemAllocatedBytes: units.GiB, MemBudgetBytes: 24 * units.GiB, MaxClients: 16, ClientsAllocated: 1,
			},
			{
				GPUUUID: "GPU-cccccccc-1111-2222-3333-444444444444", GPUIndex: 2, Group: "batch", Multiuser: true,
				State: api.InstanceRecovering, DaemonPID: 0, ServerPIDs: nil, Clients: 0, Restarts: 3,
				GPUIndexes: []int{2, 3}, GPUUUIDs: []string{"GPU-cccccccc-1111-2222-3333-444444444444", "GPU-dddddddd-1111-2222-3333-444444444444"},
				SMAllocated: 0, SMBudget: 100, MemAllocatedBytes: 0, MemBudgetBytes: 12 * units.GiB, MaxClients: 8,
				LastStartError: `start control daemon on /run/mpsd/batch/GPU-cccccccc-1111-2222-3333-444444444444/pipe: mps: start /usr/bin/nvidia-cuda-mps-control -d on /run/mpsd/batch/GPU-cccccccc-1111-2222-3333-444444444444/pipe: exit status 1 (output "Cannot find MPS control daemon process")`,
			},
			{
				GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "inference",
				State: api.InstanceReady, DaemonPID: 1000, ServerPIDs: []int{1001, 1002}, Clients: 3, Restarts: 1,
				Servers:    []api.ServerStatus{{PID: 1001, UID: 0, LeasedClients: 1}, {PID: 1002, UID: 1001, LeasedClients: 5}},
				GPUIndexes: []int{0}, GPUUUIDs: []string{"GPU-aaaaaaaa-1111-2222-3333-444444444444"},
				SMAllocated: 75, SMBudget: 100, MemAllocatedBytes: 20*units.GiB + 512*units.MiB, MemBudgetBytes: 24 * units.GiB, MaxClients: 16,
				ClientsAllocated: 6, MemUsedBytes: uint64p(uint64(9*units.GiB + 256*units.MiB)), ServingUID: intp(1001),
			},
			{
				GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "batch", Multiuser: true,
				State: api.InstanceQuarantined, Drained: true, QuarantineReason: "5 failures in 10m0s; the last: MPS server 1501 of uid 1002 exited (killed by SIGSEGV)", DaemonPID: 1500, ServerPIDs: []int{}, Clients: 0, Restarts: 5,
				GPUIndexes: []int{0}, GPUUUIDs: []string{"GPU-aaaaaaaa-1111-2222-3333-444444444444"},
				SMAllocated: 0, SMBudget: 50, MemAllocatedBytes: 0, MemBudgetBytes: 12 * units.GiB, MaxClients: 8,
			},
		},
		Leases: []api.LeaseStatus{
			{ID: "l-0003", Group: "inference", GPUIndexes: nil, UID: 1001, PIDs: nil, SM: 25, MemBytes: 8 * units.GiB, Attempt: 1, State: api.LeaseQueued,
				Command: []string{"python3", "serve.py", "--port", "8080"}, QueuedSince: at.Add(-90 * time.Second), Position: 2, WaitReason: "waiting for room; GPU 1 draining",
				Procs: 2, SMPerProcess: 12, LauncherPID: 3299},
			{ID: "l-0001", Group: "inference", GPUIndexes: []int{0}, UID: 1001, PIDs: []int{3001, 3002}, SM: 50, MemBytes: 12 * units.GiB, Attempt: 2, State: api.LeaseRunning, JobID: "4242.0",
				Command: []string{"python3", "-c", "import torch; print(torch.cuda.is_available()) and a long tail"}, RunningSince: at.Add(-(2*time.Hour + 3*time.Minute + 4*time.Second)),
				Procs: 4, SMPerProcess: 12, Clients: intp(5), MemUsedBytes: uint64p(uint64(9*units.GiB + 256*units.MiB)), LauncherPID: 2999},
			{ID: "l-0002", Group: "inference", GPUIndexes: []int{0}, UID: 0, PIDs: []int{3100}, SM: 25, MemBytes: 8*units.GiB + 512*units.MiB, Attempt: 1, State: api.LeaseRunning,
				Command: []string{"./bench"}, RunningSince: at.Add(-1500 * time.Millisecond), Procs: 1, SMPerProcess: 25, Clients: intp(1), MemUsedBytes: uint64p(0), LauncherPID: 3099},
			{ID: "b-0001", Group: "batch", GPUIndexes: []int{2, 3}, UID: 1002, PIDs: nil, SM: 50, MemBytes: 10 * units.GiB, Attempt: 1, State: api.LeaseQueued, JobID: "run 7",
				QueuedSince: at.Add(-5 * time.Minute), Position: 1, WaitReason: "waiting for room; GPU 0 quarantined, GPU 2,3 recovering"},
			{ID: "l-0004", Group: "inference", UID: 1003, SM: 10, MemBytes: units.GiB, Attempt: 3, State: api.LeaseQueued,
				Command: []string{"true"}, QueuedSince: at.Add(-2 * time.Second), Position: 1, WaitReason: "waiting for room; GPU 1 draining", LauncherPID: 3399},
		},
		Queue: map[string]int{"inference": 2, "batch": 1, "idle": 0},
	}
}

func intp(n int) *int { return &n }

func uint64p(n uint64) *uint64 { return &n }

// withUnknownField adds a field a newer mpsd might send to a JSON object.
func withUnknownField(t *testing.T, r reply) reply {
	t.Helper()
	if !strings.HasPrefix(r.body, "{") {
		t.Fatalf("not an object: %s", r.body)
	}
	r.body = `{"future_field":{"since":"v1.1","n":[1,2]},` + r.body[1:]
	return r
}

// ownViewFixture is statusFixture as mpsd shows it to a non-admin: its own
// lease only, counts per group, no pids on the instances.
func ownViewFixture() api.Status {
	st := statusFixture()
	st.OwnOnly = true
	st.Running = map[string]int{}
	for g := range st.Queue {
		st.Running[g] = 0
	}
	for _, l := range st.Leases {
		if l.State == api.LeaseRunning {
			st.Running[l.Group]++
		}
	}
	st.Leases = st.Leases[:1]
	for i := range st.Instances {
		st.Instances[i].DaemonPID, st.Instances[i].ServerPIDs, st.Instances[i].Servers = 0, []int{}, nil
		st.Instances[i].Unleased, st.Instances[i].UnleasedMemBytes, st.Instances[i].MemUsedBytes, st.Instances[i].ServingUID = nil, 0, nil, nil
		if st.Instances[i].LastStartError != "" {
			st.Instances[i].LastStartError = "the control daemon does not start (an admin's status names why)"
		}
	}
	return st
}
