package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	const base = `version: 1
watchdog:
  probe_interval: 2s
groups:
  batch:
    users: [bob]
    memory: 10G
    gpus: [0, 1]
  inference:
    users: [alice]
    unix_groups: [ml]
    memory: 20G
`
	edit := func(old, new string) string {
		if !strings.Contains(base, old) {
			t.Fatalf("base lacks %q", old)
		}
		return strings.Replace(base, old, new, 1)
	}
	host := Host{GPUs: testGPUs}
	for _, tc := range []struct {
		name string
		to   string
		want Changes
	}{
		{"same", base, Changes{}},
		{"comment only", base + "# hello\n", Changes{}},
		{"global timing", edit("probe_interval: 2s", "probe_interval: 3s"), Changes{Global: []string{"watchdog.probe_interval"}}},
		{"default made explicit is no change", edit("probe_interval: 2s", "probe_interval: 2s\n  probe_timeout: 1s"), Changes{}},
		{"admins", base + "admins:\n  users: [ops]\n", Changes{Global: []string{"admins.users"}}},
		{"budget", edit("memory: 20G", "memory: 30G"), Changes{Groups: []GroupChanges{
			{Name: "inference", Change: GroupChanged, Keys: []string{"memory", "max_mem", "default_mem"}}}}},
		{"membership", edit("users: [alice]", "users: [alice, carol]"), Changes{Groups: []GroupChanges{
			{Name: "inference", Change: GroupChanged, Keys: []string{"users"}}}}},
		{"gpus added", edit("gpus: [0, 1]", "gpus: [0, 1, 3]"), Changes{Groups: []GroupChanges{
			{Name: "batch", Change: GroupChanged, Keys: []string{"gpus"}, InstancesAdded: [][]int{{3}}}}}},
		{"gpus removed", edit("gpus: [0, 1]", "gpus: [1]"), Changes{Groups: []GroupChanges{
			{Name: "batch", Change: GroupChanged, Keys: []string{"gpus"}, InstancesRemoved: [][]int{{0}}}}}},
		{"regrouped into pairs", edit("gpus: [0, 1]", "gpus: [0, 1]\n    gpus_per_instance: 2"), Changes{Groups: []GroupChanges{
			{Name: "batch", Change: GroupChanged, Keys: []string{"gpus_per_instance"}, InstancesAdded: [][]int{{0, 1}}, InstancesRemoved: [][]int{{0}, {1}}}}}},
		{"multiuser", edit("memory: 10G", "memory: 10G\n    multiuser: true"), Changes{Groups: []GroupChanges{
			{Name: "batch", Change: GroupChanged, Keys: []string{"multiuser"}}}}},
		{"group added and removed", edit("  batch:", "  train:"), Changes{Groups: []GroupChanges{
			{Name: "batch", Change: GroupRemoved, InstancesRemoved: [][]int{{0}, {1}}},
			{Name: "train", Change: GroupAdded, InstancesAdded: [][]int{{0}, {1}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from, to := mustParse(t, base, host), mustParse(t, tc.to, host)
			got := Diff(from, to)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Diff =\n%+v\nwant\n%+v", got, tc.want)
			}
			if got.Empty() != (len(tc.want.Global) == 0 && len(tc.want.Groups) == 0) {
				t.Errorf("Empty() = %v", got.Empty())
			}
		})
	}
}

func TestDiffMembershipResolvedElsewhere(t *testing.T) {
	// The same name resolving to a new uid (user database changed) is a
	// membership change although the text is the same.
	yaml := group("memory: 1G")
	from := mustParse(t, yaml, Host{})
	moved := fakeUsers{users: map[string]uint32{"alice": 4000, "root": 0}}
	to := mustParse(t, yaml, Host{Users: moved})
	got := Diff(from, to)
	if len(got.Groups) != 1 || !got.Groups[0].Membership() || got.Groups[0].Budgets() {
		t.Errorf("Diff = %+v; want a membership change of g", got)
	}
}

func TestGroupChangesClasses(t *testing.T) {
	for _, tc := range []struct {
		keys                                 []string
		budgets, limits, membership, restart bool
	}{
		{[]string{"sm_percent"}, true, false, false, false},
		{[]string{"max_clients"}, true, false, false, false},
		{[]string{"default_mem"}, false, true, false, false},
		{[]string{"unix_groups"}, false, false, true, false},
		{[]string{"multiuser"}, false, false, false, true},
		{[]string{"priority", "requeue_attempts"}, false, false, false, false},
	} {
		g := GroupChanges{Change: GroupChanged, Keys: tc.keys}
		if g.Budgets() != tc.budgets || g.Limits() != tc.limits || g.Membership() != tc.membership || g.Restart() != tc.restart {
			t.Errorf("%v: budgets %v limits %v membership %v restart %v", tc.keys, g.Budgets(), g.Limits(), g.Membership(), g.Restart())
		}
	}
	for c, want := range map[GroupChange]string{GroupAdded: "added", GroupRemoved: "removed", GroupChanged: "changed", 0: "unknown"} {
		if c.String() != want {
			t.Errorf("%d.String() = %q", c, c.String())
		}
	}
}
