package dra

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"sigs.k8s.io/yaml"

	"github.com/mpsd/mpsd/api"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -run %s -update to accept):\n%s", path, t.Name(), got)
	}
}

// twoGroups is a node of two GPUs and two groups, the second GPU's
// training instance quarantined and the inference one without a known
// driver.
func twoGroups() api.Status {
	a, b, c := instance("inference", 0), instance("training_big", 1), instance("inference", 1)
	b.State, b.Multiuser, b.SMBudget, b.MemBudgetBytes = api.InstanceQuarantined, false, 60, 20<<30
	c.DriverVersion, c.MPSVersion, c.GPUModel = "", "", ""
	return api.Status{Instances: []api.InstanceStatus{b, a, c}}
}

var testLimits = map[string]Limits{
	"inference":    {MaxSM: 50, DefaultSM: 10, MaxMem: 12 << 30, DefaultMem: 1 << 30},
	"training_big": {MaxSM: 100, DefaultSM: 25, MaxMem: 40 << 30, DefaultMem: 5 << 30},
}

// The devices of each mode, as YAML: capacity, requestPolicy (max_sm and
// max_mem bounded by the capacity, steps of 1 and 1Mi), attributes, the
// taint of the quarantined instance.
func TestDevicesGolden(t *testing.T) {
	since := map[string]time.Time{"training-big-gpu1": time.Date(2026, 12, 8, 1, 2, 3, 400, time.UTC)}
	for _, c := range []struct {
		mode Mode
		file string
	}{{Consumable, "devices-consumable.yaml"}, {Whole, "devices-whole.yaml"}} {
		t.Run(c.mode.String(), func(t *testing.T) {
			b, err := yaml.Marshal(Devices(twoGroups(), testLimits, c.mode, since))
			if err != nil {
				t.Fatal(err)
			}
			golden(t, c.file, b)
		})
	}
}

// Each state but ready taints the instance's device NoSchedule with the
// state as value; ready has none, nor has a group with no limits known
// a requestPolicy beyond its capacity.
func TestDeviceTaints(t *testing.T) {
	for _, c := range []struct {
		state   string
		drained bool
		want    string // "" for no taint
	}{
		{api.InstanceReady, false, ""},
		{api.InstanceStarting, false, "starting"},
		{api.InstanceRecovering, false, "recovering"},
		{api.InstanceQuarantined, false, "quarantined"},
		{api.InstanceDraining, false, "draining"},
		{api.InstanceDrained, false, "drained"},
		{api.InstanceRetiring, false, "retiring"},
		{api.InstanceReady, true, "drained"},
		{"", false, "unknown"},
	} {
		t.Run(c.want+"/"+c.state, func(t *testing.T) {
			in := instance("inference", 0)
			in.State, in.Drained = c.state, c.drained
			devs := Devices(api.Status{Instances: []api.InstanceStatus{in}}, nil, Consumable, nil)
			if len(devs) != 1 {
				t.Fatalf("%d devices", len(devs))
			}
			taints := devs[0].Taints
			switch {
			case c.want == "" && len(taints) != 0:
				t.Errorf("taints %+v, want none", taints)
			case c.want != "" && (len(taints) != 1 || taints[0].Key != TaintKey || taints[0].Value != c.want || taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule):
				t.Errorf("taints %+v, want %s=%s:NoSchedule", taints, TaintKey, c.want)
			}
			rp := devs[0].Capacity[CapacitySM].RequestPolicy
			if rp == nil || rp.ValidRange.Max.Value() != 100 || rp.Default.Value() != 1 {
				t.Errorf("sm requestPolicy %+v, want 1 to the capacity, default 1", rp)
			}
		})
	}
}

// publisher records what the driver publishes.
type publisher struct {
	got chan []resourceapi.Device
}

func (p *publisher) PublishResources(ctx context.Context, r resourceslice.DriverResources) error {
	p.got <- r.Pools["node-a"].Slices[0].Devices
	return nil
}

// next waits for the next publication.
func (p *publisher) next(t *testing.T) []resourceapi.Device {
	t.Helper()
	select {
	case d := <-p.got:
		return d
	case <-time.After(wait):
		t.Fatal("nothing published")
		return nil
	}
}

// The driver publishes the node's devices of the offered groups; a
// quarantine taints the instance's device, and its resume lifts the
// taint; a poll that finds nothing changed publishes nothing.
func TestRunTaintsAndLifts(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0), instance("inference", 1), instance("other", 0))
	d := newTestDriver(t, f, func(o *Options) { o.Groups = []string{"inference"} })
	pub := &publisher{got: make(chan []resourceapi.Device)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx, pub) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	devs := pub.next(t)
	if len(devs) != 2 || devs[0].Name != "inference-gpu0" || devs[1].Name != "inference-gpu1" || len(devs[0].Taints)+len(devs[1].Taints) != 0 {
		t.Fatalf("devices %+v, want inference-gpu0 and inference-gpu1 untainted", devs)
	}
	f.setState(1, "inference", api.InstanceQuarantined)
	devs = pub.next(t)
	if len(devs[1].Taints) != 1 || devs[1].Taints[0].Value != "quarantined" || devs[1].Taints[0].TimeAdded == nil || len(devs[0].Taints) != 0 {
		t.Fatalf("devices %+v, want inference-gpu1 tainted quarantined", devs)
	}
	f.setState(1, "inference", api.InstanceReady)
	devs = pub.next(t)
	if len(devs[1].Taints) != 0 {
		t.Fatalf("taints %+v after resume, want none", devs[1].Taints)
	}
}
