package mpsd

import (
	"fmt"
	"os/user"
	"slices"
	"strconv"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/policy"
)

// Membership changes (docs/security.md, rule "membership changes take
// effect"). A config that no longer lets a uid use a group:
//   - fails that uid's queued requests in the group (not yet placed,
//     or requeued after a revocation) with api.CodeRefused, whose message
//     mps-launch prints;
//   - refuses that uid's resume of a lease in the group after mpsd
//     restarted (resume, server.go), and withdraws the lease if it was
//     queued;
//   - keeps its running leases until they end (their commands, already
//     started under the old config, are not revoked), and logs each one
//     it kept.
// Directory access follows the config at once: the group's ACL is on the
// group directories and on each instance's GPU, pipe and log directories
// themselves (prepareGroupDirs).

// memberCredentials is what the user database says of uid now: the uid
// with its primary and supplementary groups (just the uid when the
// database does not know it). It reads the database: call it outside
// Daemon.mu.
func memberCredentials(uid uint32) policy.Credentials {
	c := policy.Credentials{UID: uid}
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return c
	}
	ids, err := u.GroupIds()
	if err != nil {
		ids = []string{u.Gid}
	}
	if !slices.Contains(ids, u.Gid) {
		ids = append(ids, u.Gid)
	}
	for _, s := range ids {
		if g, err := strconv.ParseUint(s, 10, 32); err == nil {
			c.GIDs = append(c.GIDs, uint32(g))
		}
	}
	return c
}

// leaseUIDs lists the uids of every lease mpsd holds.
func (d *Daemon) leaseUIDs() []uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var uids []uint32
	for _, l := range d.leases {
		uids = append(uids, l.uid)
	}
	for _, q := range d.queues {
		for _, l := range q {
			uids = append(uids, l.uid)
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(uids)))
}

// resolveMembers looks up the credentials of every uid that holds a
// lease, outside Daemon.mu, for enforceMembershipLocked.
func (d *Daemon) resolveMembers() map[uint32]policy.Credentials {
	creds := map[uint32]policy.Credentials{}
	for _, uid := range d.leaseUIDs() {
		creds[uid] = memberCredentials(uid)
	}
	return creds
}

// notMemberText is what a uid the config no longer lets use group is
// told.
func notMemberText(uid uint32, group string) string {
	return fmt.Sprintf("uid %d is no longer a member of group %s (the config was changed); its queued request was failed", uid, group)
}

// enforceMembershipLocked applies cfg's membership to the leases: the
// queued requests of a uid that is no longer a member of their group are
// failed, its running leases are kept until they end (logged). creds are
// resolveMembers' lookups; a uid missing there (it asked after them) was
// admitted under cfg already and is a member. d.mu is held.
func (d *Daemon) enforceMembershipLocked(cfg *policy.Config, creds map[uint32]policy.Credentials) {
	member := func(l *lease) bool {
		c, ok := creds[l.uid]
		if !ok {
			return true
		}
		_, err := cfg.Access.Choose(c, l.group)
		return err == nil
	}
	failed := 0
	for group, q := range d.queues {
		if _, ok := cfg.Group(group); !ok {
			continue // the whole group is gone: onReload fails its queue
		}
		var drop []*lease
		for _, l := range q {
			if l.state == leaseQueued && !member(l) {
				drop = append(drop, l)
			}
		}
		if len(drop) == 0 {
			continue
		}
		d.queues[group] = slices.DeleteFunc(q, func(l *lease) bool { return slices.Contains(drop, l) })
		for _, l := range drop {
			msg := notMemberText(l.uid, group)
			d.log.Info("queued request failed: its uid is no longer a member of its group", l.logAttrs("group", group)...)
			d.failLocked(l, api.EndedRefused, api.CodeRefused, msg)
			failed++
		}
		d.positionsLocked(group)
	}
	for _, l := range d.leases {
		if !l.running() || member(l) {
			continue
		}
		if _, ok := cfg.Group(l.group); !ok {
			continue
		}
		l.logger().Info("running lease kept until it ends: its uid is no longer a member of its group; its command is not revoked, a resume after an mpsd restart is refused",
			l.logAttrs("group", l.group, "attempt", l.attempt)...)
	}
	if failed > 0 {
		d.store.request()
	}
}
