package dra

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/units"
)

// DriverName is the DRA driver's name: the domain of its devices'
// attributes and capacities, the driver of its DeviceClasses' selectors,
// and the CDI vendor of the devices it prepares.
const DriverName = "mpsd.io"

// The capacities of a device: the SM percent of each of its GPUs and the
// pinned device memory per GPU, in bytes.
const (
	CapacitySM     resourceapi.QualifiedName = "sm"
	CapacityMemory resourceapi.QualifiedName = "memory"
)

// TaintKey is the key of the NoSchedule taint on a device whose instance
// is not ready; its value is the instance's state (or "drained").
const TaintKey = DriverName + "/unavailable"

// Mode is how claims share a device.
type Mode int

const (
	// Consumable: each device allows many allocations, each consuming
	// some of its sm and memory capacity (Kubernetes 1.36 and later), in
	// the steps mpsd admits: whole SM percents, whole MiB.
	Consumable Mode = iota
	// Whole: each device is one allocation, for clusters without
	// consumable capacity; its claim gets a lease of the group's max_sm
	// and max_mem (or the instance's budget, if smaller).
	Whole
)

func (m Mode) String() string {
	if m == Whole {
		return "whole-device"
	}
	return "consumable-capacity"
}

// Limits are what a group allows one lease (policy.Group's max_sm,
// max_mem, default_sm, default_mem): the bounds and defaults of its
// devices' requestPolicy. A group with none known has neither bounds
// nor defaults but the device's capacity.
type Limits struct {
	MaxSM, DefaultSM   int
	MaxMem, DefaultMem int64
}

// DeviceName is the name of the device of group's instance whose first
// GPU has NVML index gpu: "<group>-gpu<index>", with a group name's '_'
// written '-' (a device name is a DNS label).
func DeviceName(group string, gpu int) string {
	return strings.ReplaceAll(group, "_", "-") + "-gpu" + strconv.Itoa(gpu)
}

// Devices are the devices of mpsd's status st: one per (GPU, group)
// instance, sorted by name, with its capacity (the group's sm_percent
// and memory budget per GPU), a requestPolicy from limits in Consumable
// mode, its attributes, and a NoSchedule taint while the instance is not
// ready (TimeAdded from taintedSince, by device name, where it has one).
// An instance whose device name another already has is left out.
func Devices(st api.Status, limits map[string]Limits, mode Mode, taintedSince map[string]time.Time) []resourceapi.Device {
	var out []resourceapi.Device
	seen := map[string]bool{}
	for _, in := range st.Instances {
		name := DeviceName(in.Group, in.GPUIndex)
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, device(in, name, limits[in.Group], mode, taintedSince[name]))
	}
	slices.SortFunc(out, func(a, b resourceapi.Device) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func device(in api.InstanceStatus, name string, lim Limits, mode Mode, since time.Time) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	multiuser, index := in.Multiuser, int64(in.GPUIndex)
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"group":     str(in.Group),
		"uuid":      str(in.GPUUUID),
		"index":     {IntValue: &index},
		"multiuser": {BoolValue: &multiuser},
	}
	for k, v := range map[resourceapi.QualifiedName]string{"model": in.GPUModel, "driverVersion": in.DriverVersion, "mpsVersion": in.MPSVersion} {
		if v != "" {
			attrs[k] = str(v)
		}
	}
	d := resourceapi.Device{Name: name, Attributes: attrs, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}}
	sm := resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(in.SMBudget), resource.DecimalSI)}
	mem := resourceapi.DeviceCapacity{Value: *resource.NewQuantity(in.MemBudgetBytes, resource.BinarySI)}
	if mode == Consumable {
		yes := true
		d.AllowMultipleAllocations = &yes
		sm.RequestPolicy = policy(1, int64(lim.MaxSM), int64(lim.DefaultSM), int64(in.SMBudget), 1, resource.DecimalSI)
		mem.RequestPolicy = policy(units.MiB, lim.MaxMem, lim.DefaultMem, in.MemBudgetBytes, units.MiB, resource.BinarySI)
	}
	d.Capacity[CapacitySM] = sm
	if in.MemBudgetBytes > 0 {
		d.Capacity[CapacityMemory] = mem
	}
	if why, ok := unavailable(in); ok {
		t := resourceapi.DeviceTaint{Key: TaintKey, Value: why, Effect: resourceapi.DeviceTaintEffectNoSchedule}
		if !since.IsZero() {
			t.TimeAdded = &metav1.Time{Time: since.Truncate(time.Second)}
		}
		d.Taints = []resourceapi.DeviceTaint{t}
	}
	return d
}

// policy is a requestPolicy of steps of step from lo to hi (the group's
// max, at most the capacity; the capacity where the group's is unknown),
// defaulting to def (the group's default, else the smallest step): the
// requests mpsd's admission takes (policy.Group.NewRequest: whole SM
// percents, whole MiB), so that what the scheduler sums is what mpsd
// grants.
func policy(lo, hi, def, capacity, step int64, f resource.Format) *resourceapi.CapacityRequestPolicy {
	if hi <= 0 || hi > capacity {
		hi = capacity
	}
	if def <= 0 || def > hi {
		def = lo
	}
	hi = lo + (hi-lo)/step*step
	q := func(v int64) *resource.Quantity { return resource.NewQuantity(v, f) }
	return &resourceapi.CapacityRequestPolicy{
		Default:    q(def),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q(lo), Max: q(hi), Step: q(step)},
	}
}

// unavailable says whether an instance takes no new lease, and its state
// (or "drained") as the taint's value.
func unavailable(in api.InstanceStatus) (string, bool) {
	switch {
	case in.Drained:
		return api.InstanceDrained, true
	case in.State == api.InstanceReady:
		return "", false
	case in.State == "":
		return "unknown", true
	}
	return in.State, true
}

// instanceOf finds the instance of device name in st.
func instanceOf(st api.Status, name string) (api.InstanceStatus, error) {
	for _, in := range st.Instances {
		if DeviceName(in.Group, in.GPUIndex) == name {
			return in, nil
		}
	}
	return api.InstanceStatus{}, fmt.Errorf("%w: mpsd runs no instance of device %s", ErrNoInstance, name)
}
