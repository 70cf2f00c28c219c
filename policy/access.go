package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Credentials identify a caller: the uid and gid from SO_PEERCRED and the
// process's supplementary groups.
type Credentials struct {
	UID  uint32
	GIDs []uint32
}

// Access is who may do what under one config: its admins and each
// group's members, resolved to ids when the config was parsed. A caller
// is a member when its uid is listed, or one of its gids.
type Access struct {
	admins idSet
	groups []groupIDs // in Config.Groups order, by name
	// defaults is each uid's default group (default_for).
	defaults map[uint32]string
}

type groupIDs struct {
	name string
	ids  idSet
}

// idSet holds sorted, unique uids and gids.
type idSet struct {
	uids, gids []uint32
}

func (s *idSet) has(c Credentials) bool {
	if _, ok := slices.BinarySearch(s.uids, c.UID); ok {
		return true
	}
	for _, g := range c.GIDs {
		if _, ok := slices.BinarySearch(s.gids, g); ok {
			return true
		}
	}
	return false
}

// Members returns the uids and gids of a group's members, sorted, for
// mpsd to grant them (and nobody else) access to the group's pipe
// directories; ok is false for an unknown group. The slices are copies.
func (a *Access) Members(group string) (uids, gids []uint32, ok bool) {
	i, found := slices.BinarySearchFunc(a.groups, group, func(g groupIDs, name string) int { return strings.Compare(g.name, name) })
	if !found {
		return nil, nil, false
	}
	ids := a.groups[i].ids
	return slices.Clone(ids.uids), slices.Clone(ids.gids), true
}

// Admin reports whether c may use the privileged commands.
func (a *Access) Admin(c Credentials) bool { return a.admins.has(c) }

// Groups returns the groups c may use, by name.
func (a *Access) Groups(c Credentials) []string {
	var out []string
	for i := range a.groups {
		if a.groups[i].ids.has(c) {
			out = append(out, a.groups[i].name)
		}
	}
	return out
}

// Choose returns the group a request of c runs in: the group it named, if
// c is a member; with no name its only group, or the group whose
// default_for names it. A caller of several groups with no default must
// name one: mpsd does not guess. Errors wrap ErrUnknownGroup,
// ErrNotAllowed, ErrNoGroup or ErrGroupNeeded and say so in words a user
// can act on.
func (a *Access) Choose(c Credentials, group string) (string, error) {
	if group == "" {
		mine := a.Groups(c)
		switch {
		case len(mine) == 1:
			return mine[0], nil
		case len(mine) == 0:
			return "", fmt.Errorf("%w: uid %d is not a member of any group; ask an administrator to add it to one", ErrNoGroup, c.UID)
		}
		if def, ok := a.defaults[c.UID]; ok && slices.Contains(mine, def) {
			return def, nil
		}
		return "", fmt.Errorf("%w: uid %d may use groups %s and has no default group; choose one with --group NAME (an administrator can name a default with the group's default_for)",
			ErrGroupNeeded, c.UID, strings.Join(mine, ", "))
	}
	i, found := slices.BinarySearchFunc(a.groups, group, func(g groupIDs, name string) int { return strings.Compare(g.name, name) })
	if !found {
		return "", fmt.Errorf("%w %q", ErrUnknownGroup, group)
	}
	if !a.groups[i].ids.has(c) {
		return "", fmt.Errorf("%w: uid %d is not a member of group %q (its users or unix_groups)", ErrNotAllowed, c.UID, group)
	}
	return group, nil
}

// resolveAccess resolves the config's member lists, reporting names the
// user database does not know.
func (d *decoder) resolveAccess(c *Config, u Users) Access {
	a := Access{admins: d.resolveMembers("admins", c.Admins, u)}
	for i := range c.Groups {
		g := &c.Groups[i]
		a.groups = append(a.groups, groupIDs{name: g.Name, ids: d.resolveMembers(groupsKey+"."+g.Name, g.Members, u)})
	}
	a.defaults = d.resolveDefaults(c, a.groups, u)
	return a
}

// resolveDefaults resolves each group's default_for to uids: each must be
// one of the group's users (membership through a unix group changes
// without mpsd knowing, so a default given through one could not be
// checked), and the default of one group only.
func (d *decoder) resolveDefaults(c *Config, ids []groupIDs, u Users) map[uint32]string {
	var defaults map[uint32]string
	for gi := range c.Groups {
		g := &c.Groups[gi]
		key := groupsKey + "." + g.Name + ".default_for"
		if !d.ok(key) {
			continue
		}
		for i, name := range g.DefaultFor {
			ekey := fmt.Sprintf("%s[%d]", key, i)
			if !d.ok(ekey) || memberProblem(name) != "" {
				continue
			}
			var uid uint32
			if isDigits(name) {
				n, _ := strconv.ParseUint(name, 10, 32) // checked by memberProblem
				uid = uint32(n)
			} else {
				id, err := u.UserID(name)
				if err != nil {
					if !slices.Contains(g.Users, name) { // else reported under users
						d.problem(ekey, "%s", strings.TrimPrefix(err.Error(), "policy: "))
					}
					continue
				}
				uid = id
			}
			if _, member := slices.BinarySearch(ids[gi].ids.uids, uid); !member {
				d.problem(ekey, "%q is not one of the group's users: a user's default group must be one of its groups, listed in its users", name)
				continue
			}
			if other, dup := defaults[uid]; dup && other == g.Name {
				continue // a repeat, reported as one
			} else if dup {
				d.problem(ekey, "%q is already in the default_for of group %s: a user has one default group", name, other)
				continue
			}
			if defaults == nil {
				defaults = map[uint32]string{}
			}
			defaults[uid] = g.Name
		}
	}
	return defaults
}

func (d *decoder) resolveMembers(prefix string, m Members, u Users) idSet {
	var s idSet
	resolve := func(key string, names []string, lookup func(string) (uint32, error)) []uint32 {
		var ids []uint32
		for i, name := range names {
			ekey := fmt.Sprintf("%s[%d]", key, i)
			if !d.ok(ekey) || memberProblem(name) != "" {
				continue
			}
			if isDigits(name) {
				n, _ := strconv.ParseUint(name, 10, 32) // checked by memberProblem
				ids = append(ids, uint32(n))
				continue
			}
			id, err := lookup(name)
			if err != nil {
				d.problem(ekey, "%s", strings.TrimPrefix(err.Error(), "policy: "))
				continue
			}
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return slices.Compact(ids)
	}
	s.uids = resolve(prefix+".users", m.Users, u.UserID)
	s.gids = resolve(prefix+".unix_groups", m.UnixGroups, u.GroupID)
	return s
}
