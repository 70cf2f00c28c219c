package cgroup

import (
	"errors"
	"path"
	"slices"
	"testing"
	"time"
)

// Two managers of different owners over one parent: each lists, opens and
// kills only its own leases, and sees the other's directory as not its
// own. A lease made before owners (straight under the parent) is opened by
// name, never listed.
func TestOwnersShareParent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		base := newManager(t, b) // no owner: cleans the whole parent up
		mk := func(owner string) *Cgroups {
			cfg := b.cfg
			cfg.Parent, cfg.Owner, cfg.Logger = base.parent, owner, discardLogger()
			m, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cleanupParent(t, m) })
			return m
		}
		a, bm := mk("aaaa0001"), mk("bbbb0002")
		id := LeaseID{"infer", "l1"}
		la := mustCreate(t, a, id, Limits{})
		p := startIn(t, la.Start, "echo ready; exec sleep 1000")
		p.readLine(t, 10*time.Second)
		if want := path.Join(base.parent, "aaaa0001", "infer", "l1"); la.Path() != want {
			t.Fatalf("Path() = %q, want %q", la.Path(), want)
		}

		if ids, err := bm.List(); err != nil || len(ids) != 0 {
			t.Fatalf("other owner's List() = %v, %v; want nothing", ids, err)
		}
		if _, err := bm.Open(id); !errors.Is(err, ErrNotExist) {
			t.Fatalf("other owner's Open(%s) = %v, want ErrNotExist", id, err)
		}
		if got, err := bm.Unowned(); err != nil || !slices.Equal(got, []string{path.Join(base.parent, "aaaa0001")}) {
			t.Fatalf("other owner's Unowned() = %v, %v", got, err)
		}
		// The same lease name under the other owner is a separate cgroup.
		lb := mustCreate(t, bm, id, Limits{})
		mustKill(t, lb)
		if err := lb.Delete(); err != nil {
			t.Fatal(err)
		}
		if pids, err := la.Pids(); err != nil || !slices.Equal(pids, []int{p.cmd.Process.Pid}) {
			t.Fatalf("after the other owner's kill, Pids() = %v, %v; want [%d]", pids, err, p.cmd.Process.Pid)
		}
		if ids, err := a.List(); err != nil || !slices.Equal(ids, []LeaseID{id}) {
			t.Fatalf("owner's List() = %v, %v", ids, err)
		}
		if got, err := base.Unowned(); err != nil || got != nil {
			t.Fatalf("Unowned() without an owner = %v, %v; want nothing", got, err)
		}

		// A lease from before owners: Open finds it, List does not.
		old := LeaseID{"train", "old1"}
		mustCreate(t, base, old, Limits{})
		if ids, _ := a.List(); slices.Contains(ids, old) {
			t.Fatalf("owner's List() = %v lists a lease outside its directory", ids)
		}
		lo := mustOpen(t, a, old)
		if want := path.Join(base.parent, "train", "old1"); lo.Path() != want {
			t.Fatalf("legacy Path() = %q, want %q", lo.Path(), want)
		}
		if err := lo.Delete(); err != nil {
			t.Fatal(err)
		}
		mustKill(t, la)
	})
}

func TestOwnerValidated(t *testing.T) {
	for _, o := range []string{"../x", "a/b", ".hidden", "-x"} {
		if _, err := New(Config{Mode: ModeV1, Owner: o}); !errors.Is(err, ErrInvalidName) {
			t.Errorf("New(Owner %q) = %v, want ErrInvalidName", o, err)
		}
	}
}
