package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestAccess(t *testing.T) {
	cfg := mustParse(t, `version: 1
admins:
  users: [ops, "7"]
  unix_groups: [wheel]
groups:
  batch:
    users: [bob, "2000"]
    unix_groups: [batch, ml]
    memory: 8G
  inference:
    users: [alice, "1001", "2000"]
    unix_groups: [ml]
    default_for: ["2000"]
    memory: 8G
  solo:
    users: [carol]
    memory: 8G
`, Host{})
	a := &cfg.Access
	for _, tc := range []struct {
		name   string
		c      Credentials
		admin  bool
		groups []string
	}{
		{"admin by name", Credentials{UID: 900}, true, nil},
		{"admin by number", Credentials{UID: 7}, true, nil},
		{"admin by unix group", Credentials{UID: 5000, GIDs: []uint32{5000, 10}}, true, nil},
		{"root is not listed", Credentials{UID: 0, GIDs: []uint32{0}}, false, nil},
		{"name and duplicate number resolve once", Credentials{UID: 1001}, false, []string{"inference"}},
		{"numeric uid", Credentials{UID: 2000}, false, []string{"batch", "inference"}},
		{"by supplementary group", Credentials{UID: 5000, GIDs: []uint32{5000, 3000}}, false, []string{"batch", "inference"}},
		{"user and group", Credentials{UID: 1002, GIDs: []uint32{3001}}, false, []string{"batch"}},
		{"stranger", Credentials{UID: 5000, GIDs: []uint32{5000}}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.Admin(tc.c); got != tc.admin {
				t.Errorf("Admin = %v, want %v", got, tc.admin)
			}
			if got := a.Groups(tc.c); !slices.Equal(got, tc.groups) {
				t.Errorf("Groups = %v, want %v", got, tc.groups)
			}
		})
	}

	for _, tc := range []struct {
		name  string
		c     Credentials
		group string
		want  string
		err   error
		msg   string
	}{
		{"named and allowed", Credentials{UID: 1001}, "inference", "inference", nil, ""},
		{"only group", Credentials{UID: 1003}, "", "solo", nil, ""},
		{"several, no default", Credentials{UID: 1, GIDs: []uint32{3000}}, "", "", ErrGroupNeeded,
			"uid 1 may use groups batch, inference and has no default group; choose one with --group NAME"},
		{"several, the default", Credentials{UID: 2000}, "", "inference", nil, ""},
		{"several, another named", Credentials{UID: 2000}, "batch", "batch", nil, ""},
		{"named, not a member", Credentials{UID: 1003}, "batch", "", ErrNotAllowed, `uid 1003 is not a member of group "batch"`},
		{"unknown group", Credentials{UID: 1003}, "nope", "", ErrUnknownGroup, `unknown group "nope"`},
		{"member of none", Credentials{UID: 4242}, "", "", ErrNoGroup, "uid 4242 is not a member of any group"},
	} {
		t.Run("Choose "+tc.name, func(t *testing.T) {
			got, err := a.Choose(tc.c, tc.group)
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("Choose = %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q lacks %q", err, tc.msg)
			}
		})
	}

	t.Run("Members", func(t *testing.T) {
		uids, gids, ok := a.Members("batch")
		if !ok || !slices.Equal(uids, []uint32{1002, 2000}) || !slices.Equal(gids, []uint32{3000, 3001}) {
			t.Errorf("Members(batch) = %v, %v, %v", uids, gids, ok)
		}
		uids[0] = 1 // a copy: the Access must not change
		if again, _, _ := a.Members("batch"); again[0] != 1002 {
			t.Errorf("Members returned the Access's own slice")
		}
		if _, _, ok := a.Members("nope"); ok {
			t.Errorf("Members(nope) ok")
		}
	})
}
