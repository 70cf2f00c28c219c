package mpsd

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
)

// The join's three findings, and what it accounts for: a leased client
// of its own instance's server, a server of another instance on a shared
// GPU, an MPS client NVML lists, a process both a client and a compute
// process (reported once, as the client).
func TestJoinReconcile(t *testing.T) {
	view := reconView{key: "a/0", group: "a", gpus: []int{0}, clients: map[int][]int{
		100: {11, 12, 13, 14},
	}}
	servers := map[int]string{100: "a/0", 200: "b/0", 300: "a/1"}
	leased := map[int]leaseAt{
		11: {lease: "a-1", inst: "a/0", group: "a"},
		13: {lease: "a-2", inst: "a/1", group: "a"},
		14: {lease: "c-1", inst: "c/1", group: "c"},
		21: {lease: "b-1", inst: "b/0", group: "b"},
	}
	procs := map[int][]gpu.ProcessMemory{0: {
		{PID: 100, Kind: gpu.ProcessCompute}, // this instance's server
		{PID: 200, Kind: gpu.ProcessCompute}, // another group's server on the GPU
		{PID: 11, Kind: gpu.ProcessMPSClient},
		{PID: 21, Kind: gpu.ProcessMPSClient},
		{PID: 12, Kind: gpu.ProcessCompute}, // also a client: reported as one
		{PID: 50, Kind: gpu.ProcessCompute}, // beside MPS
		{PID: 11, Kind: gpu.ProcessCompute}, // a leased client NVML also lists as compute
	}}
	got := joinReconcile(view, servers, leased, procs)
	want := []finding{
		{kind: reconUnleased, inst: "a/0", group: "a", gpu: 0, server: 100, pid: 12},
		{kind: reconWrongInstance, inst: "a/0", group: "a", gpu: 0, server: 100, pid: 13, lease: "a-2"},
		{kind: reconWrongInstance, inst: "a/0", group: "c", gpu: 0, server: 100, pid: 14, lease: "c-1"},
		{kind: reconBypass, inst: "a/0", gpu: 0, pid: 50},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("joinReconcile:\n got %+v\nwant %+v", got, want)
	}
	// Everything accounted for: nothing found.
	if got := joinReconcile(reconView{key: "a/0", group: "a", gpus: []int{0}, clients: map[int][]int{100: {11}}},
		servers, leased, map[int][]gpu.ProcessMemory{0: {{PID: 100, Kind: gpu.ProcessCompute}, {PID: 11, Kind: gpu.ProcessMPSClient}}}); len(got) != 0 {
		t.Fatalf("a clean instance: %+v", got)
	}
}

// leaseClients counts each lease's MPS client processes on the instance:
// from NVML's MPS client lists and MPS's own, a process on two GPUs or in
// both once; compute processes, the servers and other instances' leases
// not at all.
func TestLeaseClients(t *testing.T) {
	leased := map[int]leaseAt{
		11: {lease: "a-1", inst: "a/0"}, 12: {lease: "a-1", inst: "a/0"}, 13: {lease: "a-1", inst: "a/0"},
		14: {lease: "a-1", inst: "a/0"}, 15: {lease: "a-1", inst: "a/0"}, // its front end, no client
		21: {lease: "a-2", inst: "a/0"},
		31: {lease: "b-1", inst: "b/0"}, // another instance's, on the same GPU
	}
	procs := map[int][]gpu.ProcessMemory{
		0: {{PID: 100, Kind: gpu.ProcessCompute}, {PID: 11, Kind: gpu.ProcessMPSClient}, {PID: 12, Kind: gpu.ProcessMPSClient},
			{PID: 31, Kind: gpu.ProcessMPSClient}, {PID: 15, Kind: gpu.ProcessCompute}, {PID: 99, Kind: gpu.ProcessMPSClient}},
		1: {{PID: 11, Kind: gpu.ProcessMPSClient}, {PID: 13, Kind: gpu.ProcessMPSClient}},
	}
	lists := map[int][]int{100: {12, 14, 21}}
	got := leaseClients("a/0", procs, lists, leased)
	if want := map[string]int{"a-1": 4, "a-2": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("leaseClients = %v, want %v", got, want)
	}
	if got := leaseClients("a/0", nil, nil, nil); len(got) != 0 {
		t.Errorf("leaseClients of nothing = %v", got)
	}
}

// reconBenchInputs is a host of instances instances with leases leases
// spread over them, every lease's process a client of its instance's one
// server and listed by NVML, as a busy host looks when all is well.
func reconBenchInputs(instances, leases int) ([]reconView, map[int]string, map[int]leaseAt, map[int][]gpu.ProcessMemory) {
	views := make([]reconView, instances)
	servers := map[int]string{}
	leased := map[int]leaseAt{}
	procs := map[int][]gpu.ProcessMemory{}
	for i := range views {
		key := fmt.Sprintf("g%d/%d", i%4, i)
		server := 1_000_000 + i
		views[i] = reconView{key: key, group: fmt.Sprintf("g%d", i%4), gpus: []int{i}, clients: map[int][]int{server: nil}}
		servers[server] = key
		procs[i] = []gpu.ProcessMemory{{PID: server, Kind: gpu.ProcessCompute}}
	}
	for l := range leases {
		i := l % instances
		pid := 10_000 + l
		v := &views[i]
		for s := range v.clients {
			v.clients[s] = append(v.clients[s], pid)
		}
		leased[pid] = leaseAt{lease: fmt.Sprintf("l%d", l), inst: v.key, group: v.group}
		procs[i] = append(procs[i], gpu.ProcessMemory{PID: pid, Kind: gpu.ProcessMPSClient})
	}
	return views, servers, leased, procs
}

// BenchmarkReconcileJoin is one probe round of reconciliation's join at
// 64 instances and 1,000 leases: every instance joined once (what a probe
// interval costs in CPU besides the reads; see docs/architecture.md).
func BenchmarkReconcileJoin(b *testing.B) {
	views, servers, leased, procs := reconBenchInputs(64, 1000)
	b.ReportAllocs()
	for b.Loop() {
		for _, v := range views {
			if f := joinReconcile(v, servers, leased, procs); len(f) != 0 {
				b.Fatalf("findings on a clean host: %+v", f)
			}
		}
	}
}

// noteUsage sums memory per GPU and keeps the GPU where it is highest:
// the instance's clients of no lease, and all its clients (its leases'
// too, not another instance's); each client of no lease has its memory
// summed over the GPUs, none when NVML gives none.
func TestNoteUsage(t *testing.T) {
	b := func(n uint64) *uint64 { return &n }
	procs := map[int][]gpu.ProcessMemory{
		4: {{PID: 10, UsedBytes: b(100)}, {PID: 20, UsedBytes: b(7)}, {PID: 30, UsedBytes: b(1000)}, {PID: 40}},
		5: {{PID: 10, UsedBytes: b(50)}, {PID: 20, UsedBytes: b(300)}},
	}
	leased := map[int]leaseAt{20: {lease: "l", inst: "a/4,5"}, 30: {lease: "m", inst: "b/4"}}
	unleased := []unleasedFact{{pid: 40, uid: 1002, server: 9}, {pid: 10, uid: 1001, server: 9}, {pid: 10, uid: 1001, server: 9}}
	got := noteUsage("a/4,5", []int{4, 5}, procs, leased, unleased)
	want := clientUsage{read: true, unleased: []api.UnleasedClient{
		{PID: 10, UID: 1001, Server: 9, MemBytes: b(150)},
		{PID: 40, UID: 1002, Server: 9},
	}, unleasedMem: 100, memUsed: 350}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("noteUsage = %+v; want %+v", got, want)
	}
	if got := noteUsage("a/4,5", []int{4, 5}, nil, nil, nil); !got.read || got.memUsed != 0 || got.unleased != nil {
		t.Errorf("nothing on the GPUs: %+v", got)
	}
}
