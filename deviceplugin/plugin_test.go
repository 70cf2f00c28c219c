package deviceplugin

import (
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
)

// A unit is allocatable only while its instance is ready; running pods
// on the others go on, which is what Unhealthy means to the kubelet.
func TestDeviceListsHealth(t *testing.T) {
	for _, tc := range []struct {
		state string
		want  string
	}{
		{api.InstanceReady, pluginapi.Healthy},
		{api.InstanceStarting, pluginapi.Unhealthy},
		{api.InstanceRecovering, pluginapi.Unhealthy},
		{api.InstanceQuarantined, pluginapi.Unhealthy},
		{api.InstanceDraining, pluginapi.Unhealthy},
		{api.InstanceDrained, pluginapi.Unhealthy},
		{api.InstanceRetiring, pluginapi.Unhealthy},
	} {
		t.Run(tc.state, func(t *testing.T) {
			st := api.Status{Instances: []api.InstanceStatus{
				{Group: "a", GPUIndex: 3, State: tc.state, SMBudget: 50},
				{Group: "a", GPUIndex: 1, State: api.InstanceReady, SMBudget: 2},
				{Group: "b", GPUIndex: 3, State: api.InstanceReady, SMBudget: 1},
			}}
			lists := deviceLists(st)
			a := lists["a"]
			if len(a) != 52 || len(lists["b"]) != 1 || len(lists) != 2 {
				t.Fatalf("lists %v", health(a))
			}
			// GPU order, then unit order.
			if a[0].ID != "a-gpu1-sm0" || a[1].ID != "a-gpu1-sm1" || a[2].ID != "a-gpu3-sm0" || a[51].ID != "a-gpu3-sm49" {
				t.Errorf("IDs %s %s %s … %s", a[0].ID, a[1].ID, a[2].ID, a[51].ID)
			}
			if got := health(a); got["gpu3 "+tc.want] != 50 || got["gpu1 Healthy"] != 2 {
				t.Errorf("health %v, want GPU 3's 50 units %s and GPU 1's healthy", got, tc.want)
			}
		})
	}
}

func TestMemFor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    api.InstanceStatus
		units int
		want  int64
	}{
		{"30% of 20G", api.InstanceStatus{SMBudget: 100, MemBudgetBytes: 20 << 30}, 30, 6 << 30},
		{"rounded down to MiB", api.InstanceStatus{SMBudget: 100, MemBudgetBytes: 1000 << 20}, 3, 30 << 20},
		{"half budget", api.InstanceStatus{SMBudget: 50, MemBudgetBytes: 10 << 30}, 25, 5 << 30},
		{"at least 1 MiB", api.InstanceStatus{SMBudget: 100, MemBudgetBytes: 10 << 20}, 1, 1 << 20},
		{"no budget: the group's default", api.InstanceStatus{}, 10, 0},
	} {
		if got := memFor(tc.in, tc.units); got != tc.want {
			t.Errorf("%s: memFor = %d, want %d", tc.name, got, tc.want)
		}
	}
}
