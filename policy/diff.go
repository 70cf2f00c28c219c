package policy

import (
	"reflect"
	"slices"
)

// Changes is what differs between two configs, for mpsd to apply exactly
// that and leave everything else (running MPS daemons above all) alone.
type Changes struct {
	// Global lists the changed keys outside groups, e.g.
	// "watchdog.probe_interval" or "admins.users", in schema order.
	Global []string
	// Groups lists added, removed and changed groups, by name.
	Groups []GroupChanges
}

// Empty reports whether the configs are the same.
func (c Changes) Empty() bool { return len(c.Global) == 0 && len(c.Groups) == 0 }

// GroupChange says what happened to a group.
type GroupChange uint8

const (
	// GroupAdded: the group is new; start its instances.
	GroupAdded GroupChange = iota + 1
	// GroupRemoved: the group is gone; drain and stop its instances.
	GroupRemoved
	// GroupChanged: some of its keys changed; see GroupChanges.Keys.
	GroupChanged
)

func (c GroupChange) String() string {
	switch c {
	case GroupAdded:
		return "added"
	case GroupRemoved:
		return "removed"
	case GroupChanged:
		return "changed"
	}
	return "unknown"
}

// GroupChanges is what changed in one group.
type GroupChanges struct {
	Name   string
	Change GroupChange
	// Keys are the group's changed keys ("memory", "users"), in schema
	// order; empty unless Change is GroupChanged. A list of names counts
	// as changed also when a name now resolves to another id.
	Keys []string
	// InstancesAdded and InstancesRemoved are GPU index sets of instances
	// the group gains and loses: every set of an added or removed group,
	// and the difference when its gpus or gpus_per_instance changed. They
	// are empty when the configs were read without the host's GPUs.
	InstancesAdded, InstancesRemoved [][]int
}

// Changed reports whether key is among Keys.
func (g GroupChanges) Changed(key string) bool { return slices.Contains(g.Keys, key) }

// Budgets: the instances' per-GPU budgets changed (sm_percent, memory,
// max_clients); running instances take the new Budget.
func (g GroupChanges) Budgets() bool {
	return g.Changed("sm_percent") || g.Changed("memory") || g.Changed("max_clients")
}

// Limits: what one request may ask for, or gets by default, changed.
func (g GroupChanges) Limits() bool {
	return g.Changed("max_sm") || g.Changed("max_mem") || g.Changed("default_sm") || g.Changed("default_mem")
}

// Membership: who may use the group changed.
func (g GroupChanges) Membership() bool { return g.Changed("users") || g.Changed("unix_groups") }

// Restart: the group's daemons must be restarted to apply the change,
// since -multiuser-server is a server start option.
func (g GroupChanges) Restart() bool { return g.Changed("multiuser") }

// Diff lists what changed from one config to the next.
func Diff(from, to *Config) Changes {
	var ch Changes
	for _, f := range configFields {
		changed := !sameValue(f.ref(from), f.ref(to))
		switch f.key {
		case "admins.users":
			changed = changed || !slices.Equal(from.Access.admins.uids, to.Access.admins.uids)
		case "admins.unix_groups":
			changed = changed || !slices.Equal(from.Access.admins.gids, to.Access.admins.gids)
		}
		if changed {
			ch.Global = append(ch.Global, f.key)
		}
	}

	i, j := 0, 0
	for i < len(from.Groups) || j < len(to.Groups) {
		switch {
		case j == len(to.Groups) || i < len(from.Groups) && from.Groups[i].Name < to.Groups[j].Name:
			g := &from.Groups[i]
			ch.Groups = append(ch.Groups, GroupChanges{Name: g.Name, Change: GroupRemoved, InstancesRemoved: g.Instances})
			i++
		case i == len(from.Groups) || to.Groups[j].Name < from.Groups[i].Name:
			g := &to.Groups[j]
			ch.Groups = append(ch.Groups, GroupChanges{Name: g.Name, Change: GroupAdded, InstancesAdded: g.Instances})
			j++
		default:
			if gc := diffGroup(from, to, i, j); gc.Keys != nil || gc.InstancesAdded != nil || gc.InstancesRemoved != nil {
				ch.Groups = append(ch.Groups, gc)
			}
			i++
			j++
		}
	}
	return ch
}

func diffGroup(fromCfg, toCfg *Config, i, j int) GroupChanges {
	from, to := &fromCfg.Groups[i], &toCfg.Groups[j]
	gc := GroupChanges{Name: to.Name, Change: GroupChanged}
	fromIDs, toIDs := accessOf(fromCfg, from.Name), accessOf(toCfg, to.Name)
	for _, f := range groupFields {
		changed := !sameValue(f.ref(from), f.ref(to))
		switch f.key {
		case "users":
			changed = changed || !slices.Equal(fromIDs.uids, toIDs.uids)
		case "unix_groups":
			changed = changed || !slices.Equal(fromIDs.gids, toIDs.gids)
		}
		if changed {
			gc.Keys = append(gc.Keys, f.key)
		}
	}
	for _, set := range to.Instances {
		if !containsSet(from.Instances, set) {
			gc.InstancesAdded = append(gc.InstancesAdded, set)
		}
	}
	for _, set := range from.Instances {
		if !containsSet(to.Instances, set) {
			gc.InstancesRemoved = append(gc.InstancesRemoved, set)
		}
	}
	return gc
}

func accessOf(c *Config, group string) idSet {
	for _, g := range c.Access.groups {
		if g.name == group {
			return g.ids
		}
	}
	return idSet{}
}

func containsSet(sets [][]int, set []int) bool {
	return slices.ContainsFunc(sets, func(s []int) bool { return slices.Equal(s, set) })
}

// sameValue compares two values of one schema field; a missing and an
// empty list are the same.
func sameValue(a, b any) bool {
	if la, ok := a.(*[]string); ok {
		return slices.Equal(*la, *b.(*[]string))
	}
	return reflect.DeepEqual(a, b)
}
