package mpsd

import (
	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/policy"
)

// onReload applies a config edit the Watcher accepted: only what the diff
// names changes. Budgets apply to the next admissions (running leases keep
// what they hold), new instances start, removed ones drain and stop when
// empty, and every other instance (its daemon, its servers, its clients)
// is left alone. Membership applies at once: the group directories' ACLs
// (and those of the instance directories below them) are rewritten, and
// the queued requests of a uid no longer a member of their group fail
// (membership.go).
func (d *Daemon) onReload(r policy.Reload) {
	d.mu.Lock()
	d.metrics.reloadOK, d.metrics.reloadAt = r.Err == nil, d.clock.Now()
	d.mu.Unlock()
	if r.Err != nil {
		msg, n := LogConfigProblems(d.log, r.Err)
		d.log.Error("config reload failed; the previous config stays in force", "err", msg, "problems", n)
		return
	}
	if r.Changes.Empty() {
		return
	}
	for _, k := range r.Changes.Global {
		switch k {
		case "socket", "run_dir", "state_dir", "log_dir", "cgroup.enabled", "cgroup.parent", "metrics.listen", "history.max_size", "mps.control", "mps.path", "simulate.gpus", "simulate.model", "simulate.emulator_dir":
			d.log.Warn("config key changed but applies only when mpsd restarts", "key", k)
		}
	}
	for _, g := range r.Changes.Groups {
		d.log.Info("config group changed", "group", g.Name, "change", g.Change.String(), "keys", g.Keys,
			"instances_added", g.InstancesAdded, "instances_removed", g.InstancesRemoved)
	}
	// Looked up before Daemon.mu: who of the lease holders is a member
	// under the new config (membership.go).
	creds := d.resolveMembers()
	d.mu.Lock()
	d.setConfigLocked(r.Config)
	added := d.reconcileLocked(r.Config)
	// A uid the new config removed from a group: its queued requests
	// fail now, before the schedule below could place them.
	d.enforceMembershipLocked(r.Config, creds)
	// Queued requests of a group that is gone can never be placed.
	for group, q := range d.queues {
		if _, ok := r.Config.Group(group); ok {
			continue
		}
		for _, l := range q {
			d.failLocked(l, api.EndedGroupRemoved, api.CodeUnavailable, "group "+group+" was removed from the config")
		}
		delete(d.queues, group)
	}
	for _, in := range d.instanceList() {
		d.retireIfEmptyLocked(in)
	}
	for _, g := range r.Config.Groups {
		d.scheduleLocked(g.Name)
	}
	d.mu.Unlock()
	// After reconcileLocked, so that the directories of added instances
	// are made with the group's ACL before their daemons start.
	if err := d.prepareGroupDirs(r.Config); err != nil {
		d.log.Error("update group directory access", "err", err)
	}
	for _, in := range added {
		d.spawn(func() { d.supervise(in) })
	}
	d.log.Info("config reloaded")
}
