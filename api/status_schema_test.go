package api

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// fullStatus sets every field of the status document, so that the golden
// file shows each key of schema version StatusSchemaVersion.
func fullStatus() Status {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clients := 5
	unleasedMem, usedMem, servingUID := uint64(2<<30), uint64(3<<30), 1001
	return Status{
		Instances: []InstanceStatus{{GPUUUID: "GPU-1", GPUIndex: 1, Group: "g", State: InstanceQuarantined, DaemonPID: 10, ServerPIDs: []int{11}, Clients: 1, Restarts: 5,
			GPUIndexes: []int{0}, GPUUUIDs: []string{"GPU-1"}, SMAllocated: 30, SMBudget: 100, MemAllocatedBytes: 1, MemBudgetBytes: 2, MaxClients: 48,
			Drained: true, DrainReason: "fan replacement", DrainedBy: "root", DrainedAt: time.Date(2026, 12, 7, 9, 30, 0, 0, time.UTC),
			QuarantineReason: "5 failures in 10m0s; the last: MPS server exited", ClientsAllocated: 4,
			LastStartError: "mps: start control daemon: Cannot find MPS control daemon process",
			DriverVersion:  "580.159.04", MPSVersion: "13000", GPUModel: "NVIDIA A100-SXM4-40GB", Multiuser: true,
			Servers:          []ServerStatus{{PID: 11, UID: 1001, LeasedClients: 1, UnleasedClients: 2, PendingLeases: []string{"m2"}, Fault: true}},
			Unleased:         []UnleasedClient{{PID: 13, UID: 1001, Server: 11, MemBytes: &unleasedMem}, {PID: 14, UID: 1001, Server: 11}},
			UnleasedMemBytes: int64(unleasedMem), MemUsedBytes: &usedMem, ServingUID: &servingUID}},
		Leases: []LeaseStatus{
			{ID: "l", Group: "g", GPUIndexes: []int{0}, UID: 1001, PIDs: []int{12}, SM: 30, MemBytes: 1, Attempt: 2, State: LeaseRunning,
				JobID: "42", Command: []string{"python", "train.py"}, RunningSince: at.Add(-time.Minute),
				Procs: 4, SMPerProcess: 7, Clients: &clients,
				Pod: &PodContainer{Namespace: "default", Pod: "train-0", Container: "main", ContainerID: "0123456789abcdef"}, LauncherPID: 9},
			{ID: "m", Group: "g", GPUIndexes: []int{}, UID: 1002, PIDs: []int{}, SM: 10, MemBytes: 1, Attempt: 1, State: LeaseQueued,
				Command: []string{"true"}, QueuedSince: at.Add(-time.Second), Position: 1, WaitReason: "waiting for room; GPU 0 quarantined",
				Procs: 1, SMPerProcess: 10},
		},
		Queue:         map[string]int{"g": 1},
		Running:       map[string]int{"g": 1},
		OwnOnly:       true,
		SchemaVersion: StatusSchemaVersion,
		At:            at,
		Mpsd:          &Version{Version: "v1.2.3", Commit: "0123456789abcdef", Modified: true, APILevel: LevelOperatorView, GoVersion: "go1.26.0"},
	}
}

// The status document of schema version 1 as mpsctl status --json shows
// it. A change of this file is a change of the schema: within a version
// keys may only be added (api/doc.go), so an edit that renames, retypes
// or drops a key must bump StatusSchemaVersion.
func TestStatusSchemaGolden(t *testing.T) {
	b, err := json.MarshalIndent(fullStatus(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", "status-v1.json.golden")
	if *update {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Errorf("status document of schema version %d changed (go test -update rewrites it; a change that is not an addition needs a new version):\n got %s\nwant %s", StatusSchemaVersion, b, want)
	}
	// A reader of this version reads the golden document back to the same
	// value: no key it holds is lost or misread.
	var back Status
	if err := json.Unmarshal(want, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, fullStatus()) {
		t.Errorf("golden document read back as %+v, want %+v", back, fullStatus())
	}
	if back.SchemaVersion != 1 {
		t.Errorf("schema_version %d in the golden file of version 1", back.SchemaVersion)
	}
}

// fullStatus sets every field of every object of the document (each
// instance, server, unleased client and lease field), so that a field
// added without being set there fails here rather than missing from the
// golden file.
func TestFullStatusSetsEveryField(t *testing.T) {
	st := fullStatus()
	check := func(name string, v reflect.Value) {
		t.Helper()
		for i := range v.NumField() {
			if v.Field(i).IsZero() {
				t.Errorf("%s.%s is not set in fullStatus: set it so the golden file shows its key", name, v.Type().Field(i).Name)
			}
		}
	}
	check("Status", reflect.ValueOf(st))
	check("InstanceStatus", reflect.ValueOf(st.Instances[0]))
	check("ServerStatus", reflect.ValueOf(st.Instances[0].Servers[0]))
	check("UnleasedClient", reflect.ValueOf(st.Instances[0].Unleased[0]))
	check("Version", reflect.ValueOf(*st.Mpsd))
}
