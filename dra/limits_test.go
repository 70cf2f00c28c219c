package dra

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// LoadLimits reads the offered groups' limits from mpsd's config, and
// fails (mpsd refuses to start the driver) on a config that does not
// load, rather than publishing devices with no group maximum.
func TestLoadLimits(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "mpsd.yaml")
	if err := os.WriteFile(good, []byte(`version: 1
groups:
  inference:
    users: ["1001", "1002"]
    multiuser: true
    memory: 16G
    max_sm: 50
    default_sm: 10
    max_mem: 12G
    default_mem: 1G
  training:
    users: ["1003"]
    memory: 16G
    max_sm: 100
`), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("groups: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	got, err := LoadLimits(good, []string{"inference"}, log)
	if err != nil {
		t.Fatal(err)
	}
	want := Limits{MaxSM: 50, DefaultSM: 10, MaxMem: 12 << 30, DefaultMem: 1 << 30}
	if len(got) != 1 || got["inference"] != want {
		t.Errorf("limits %+v, want inference's %+v only", got, want)
	}
	for _, p := range []string{bad, filepath.Join(dir, "missing.yaml")} {
		if l, err := LoadLimits(p, nil, log); err == nil {
			t.Errorf("LoadLimits(%s) = %+v, want an error", filepath.Base(p), l)
		}
	}
}

// Two groups whose device names collide (a_b and a-b) are refused at
// start, naming both, whether they come from the config or the groups
// offered.
func TestGroupNameCollision(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mpsd.yaml")
	if err := os.WriteFile(p, []byte(`version: 1
groups:
  a_b:
    users: ["1001"]
    memory: 16G
  a-b:
    users: ["1002"]
    memory: 16G
  c:
    users: ["1003"]
    memory: 16G
`), 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	_, err := LoadLimits(p, nil, log)
	if err == nil || !strings.Contains(err.Error(), "a_b") || !strings.Contains(err.Error(), "a-b") {
		t.Errorf("LoadLimits: %v, want a collision of a_b and a-b", err)
	}
	if _, err := LoadLimits(p, []string{"a_b", "c"}, log); err != nil {
		t.Errorf("LoadLimits of a_b and c: %v", err)
	}
	_, err = New(Options{MPSD: newFakeMPSD(), NodeName: "node-a", CDIDir: t.TempDir(), Groups: []string{"a-b", "a_b"}})
	if err == nil || !strings.Contains(err.Error(), "a_b") || !strings.Contains(err.Error(), "a-b") {
		t.Errorf("New: %v, want a collision of a-b and a_b", err)
	}
}
