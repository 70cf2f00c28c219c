package dra

import (
	"log/slog"
	"os"
	"path/filepath"
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
