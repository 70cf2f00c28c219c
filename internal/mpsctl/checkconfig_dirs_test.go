package mpsctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// check-config refuses, one line each with the path, the problem and the
// fix, directories mpsd would write as root that someone else could
// change, and directories that overlap.
func TestCheckConfigDirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes directories owned by other uids")
	}
	// Short: run_dir must leave room for MPS's socket paths.
	base, err := os.MkdirTemp("", "cc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := mk("good", 0o755, 0)
	for _, tc := range []struct {
		name, run, state, log string
		key, want             string // "" = ok
	}{
		{name: "fresh dirs", run: good + "/run", state: good + "/state", log: good + "/log"},
		{name: "state_dir /tmp", run: "/nonexistent-mpsd/run", state: "/tmp", log: "/nonexistent-mpsd/log",
			key: "state_dir", want: "/tmp is writable by its group or by others (mode 1777); give mpsd a directory of its own"},
		{name: "group-writable", run: mk("gw", 0o775, 0), state: good + "/state", log: good + "/log",
			key: "run_dir", want: "is writable by its group or by others (mode 0775)"},
		{name: "owned by another uid", run: good + "/run", state: good + "/state", log: mk("other", 0o755, 64203),
			key: "log_dir", want: "is owned by uid 64203, not root"},
		{name: "overlapping", run: good + "/run", state: good + "/run/state", log: good + "/log",
			key: "state_dir", want: "overlaps run_dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "mpsd.yaml")
			y := "version: 1\nrun_dir: " + tc.run + "\nstate_dir: " + tc.state + "\nlog_dir: " + tc.log +
				"\ncgroup: {enabled: false}\nsimulate: {gpus: 1, model: a100-40g}\ngroups: {inference: {users: [root], memory: 10G}}\n"
			if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
				t.Fatal(err)
			}
			r := mpsctl(t, Config{NVML: noNVML}, []string{"MPSD_SOCKET=/nonexistent/s.sock"}, "check-config", "--simulate", cfg)
			if tc.key == "" {
				if r.code != ExitOK || r.stdout != cfg+": ok\n" {
					t.Fatalf("exit %d, stdout %q, stderr %q; want ok", r.code, r.stdout, r.stderr)
				}
				return
			}
			if r.code != ExitFailure {
				t.Fatalf("exit %d; want %d (stdout %q, stderr %q)", r.code, ExitFailure, r.stdout, r.stderr)
			}
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], cfg+": "+tc.key+": ") || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("stderr %q; want one line %q with %q", r.stderr, cfg+": "+tc.key+": ...", tc.want)
			}
		})
	}
}
