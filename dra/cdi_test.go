package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// A claim UID that would name a file outside the CDI directory is
// refused by prepare and by unprepare: no lease, and nothing written or
// removed outside CDIDir; another user's claim is prepared beside it.
func TestTraversalUIDRefused(t *testing.T) {
	f := newFakeMPSD(instance("inference", 0))
	root := t.TempDir()
	cdiDir := filepath.Join(root, "a", "b", "cdi")
	d := newTestDriver(t, f, func(o *Options) { o.CDIDir = cdiDir })
	victim := filepath.Join(root, "evil.json")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	for _, uid := range []types.UID{"x/../../../../evil", "../evil", "..", "", "a b", types.UID(strings.Repeat("a", 65))} {
		t.Run(string(uid), func(t *testing.T) {
			c := allocated("alice", "infer", string(uid), "node-a", "inference-gpu0", 30, 8<<30)
			res := prepare(t, d, c, bob)
			if res[c.UID].Err == nil || !strings.Contains(res[c.UID].Err.Error(), "is not a UID") {
				t.Errorf("prepare of claim UID %q: %v, want refused", uid, res[c.UID].Err)
			}
			if res[bob.UID].Err != nil {
				t.Errorf("bob's claim: %v", res[bob.UID].Err)
			}
			out, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: uid}})
			if err != nil {
				t.Fatal(err)
			}
			if out[uid] == nil {
				t.Errorf("unprepare of claim UID %q succeeded, want refused", uid)
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
				t.Errorf("%s: %q, %v; want it untouched", victim, b, err)
			}
			for _, l := range f.leases() {
				if l.JobID != JobID(bob.UID, 0) {
					t.Errorf("lease %+v of a refused claim", l)
				}
			}
		})
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 2 {
		t.Errorf("%s holds %d entries, want a/ and evil.json", root, len(entries))
	}
}

// A CDI directory others could change is refused at start.
func TestCDIDirChecked(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		prep func(p string) error
	}{
		{"group-writable", func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return os.Chmod(p, 0o775)
		}},
		{"other-writable", func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return os.Chmod(p, 0o757)
		}},
		{"not-root", func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return os.Chown(p, 65534, 65534)
		}},
		{"symlink", func(p string) error { return os.Symlink(dir, p) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name)
			if err := c.prep(p); err != nil {
				t.Fatal(err)
			}
			if _, err := New(Options{MPSD: newFakeMPSD(), NodeName: "node-a", CDIDir: p}); err == nil {
				t.Errorf("CDI directory %s accepted", c.name)
			}
		})
	}
	if _, err := New(Options{MPSD: newFakeMPSD(), NodeName: "node-a", CDIDir: filepath.Join(dir, "fresh")}); err != nil {
		t.Errorf("a fresh CDI directory: %v", err)
	}
}
