package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run_dir, state_dir and log_dir that are one directory or one inside
// another are refused.
func TestOverlappingDirs(t *testing.T) {
	for _, tc := range []struct{ name, yaml, key, msg string }{
		{"apart", "run_dir: /run/mpsd\nstate_dir: /var/lib/mpsd\nlog_dir: /var/log/mpsd\n", "", ""},
		{"siblings with a common prefix", "run_dir: /srv/mpsd\nstate_dir: /srv/mpsd-state\nlog_dir: /srv/mpsd-log\n", "", ""},
		{"equal", "run_dir: /run/mpsd\nstate_dir: /run/mpsd\nlog_dir: /var/log/mpsd\n", "state_dir", "/run/mpsd overlaps run_dir /run/mpsd"},
		{"state inside run", "run_dir: /run/mpsd\nstate_dir: /run/mpsd/state\nlog_dir: /var/log/mpsd\n", "state_dir", "overlaps run_dir"},
		{"run inside log", "run_dir: /var/log/mpsd/run\nstate_dir: /var/lib/mpsd\nlog_dir: /var/log/mpsd\n", "log_dir", "overlaps run_dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader("version: 1\n"+tc.yaml+"groups: {inference: {users: [\"1\"], memory: 1G}}\n"), Host{})
			if tc.key == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			wantProblem(t, err, tc.key, tc.msg)
		})
	}
}

// CheckDirs refuses directories, and ancestors, that someone other than
// root could change, and accepts the usual layouts, sticky /tmp as an
// ancestor included.
func TestCheckDirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes directories owned by other uids")
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := func(t *testing.T, p string, mode os.FileMode, uid int) string {
		t.Helper()
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
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns state_dir
		msg   string                                // "" = accepted
	}{
		{"missing under a private dir", func(t *testing.T, dir string) string { return filepath.Join(dir, "state") }, ""},
		{"root 0755", func(t *testing.T, dir string) string { return mk(t, filepath.Join(dir, "state"), 0o755, 0) }, ""},
		{"root 0700", func(t *testing.T, dir string) string { return mk(t, filepath.Join(dir, "state"), 0o700, 0) }, ""},
		{"under a sticky world-writable ancestor", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "tmp"), os.ModeSticky|0o777, 0), "state")
		}, ""},
		{"/tmp itself", func(*testing.T, string) string { return "/tmp" }, "/tmp is writable by its group or by others (mode 1777)"},
		{"group-writable", func(t *testing.T, dir string) string { return mk(t, filepath.Join(dir, "state"), 0o775, 0) }, "is writable by its group or by others (mode 0775)"},
		{"owned by another uid", func(t *testing.T, dir string) string { return mk(t, filepath.Join(dir, "state"), 0o700, 64200) }, "is owned by uid 64200, not root"},
		{"ancestor owned by another uid", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "u"), 0o755, 64201), "state")
		}, "is owned by uid 64201, not root"},
		{"world-writable ancestor without sticky bit", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "ww"), 0o777, 0), "state")
		}, "without the sticky bit (mode 0777)"},
		{"symlink", func(t *testing.T, dir string) string {
			real := mk(t, filepath.Join(dir, "real"), 0o700, 0)
			link := filepath.Join(dir, "state")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			return link
		}, "is a symlink"},
		{"symlinked ancestor to a good directory", func(t *testing.T, dir string) string {
			real := mk(t, filepath.Join(dir, "real"), 0o755, 0)
			link := filepath.Join(dir, "lib")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "state")
		}, ""},
		{"symlinked ancestor to a world-writable directory", func(t *testing.T, dir string) string {
			real := mk(t, filepath.Join(dir, "real"), 0o777, 0)
			link := filepath.Join(dir, "lib")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "state")
		}, "without the sticky bit"},
		{"symlinked ancestor owned by another uid", func(t *testing.T, dir string) string {
			real := mk(t, filepath.Join(dir, "real"), 0o755, 0)
			link := filepath.Join(dir, "lib")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(link, 64202, 64202); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "state")
		}, "is owned by uid 64202"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := mk(t, filepath.Join(base, strings.ReplaceAll(tc.name, " ", "-")), 0o755, 0)
			state := tc.setup(t, dir)
			c := &Config{RunDir: filepath.Join(dir, "run"), StateDir: state, LogDir: filepath.Join(dir, "log")}
			err := CheckDirs(c, 0)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("CheckDirs: %v", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Key != "state_dir" || !strings.Contains(ce.Problems[0].Message, tc.msg) {
				t.Fatalf("CheckDirs = %v, want one state_dir problem with %q", err, tc.msg)
			}
			if strings.Contains(ce.Problems[0].Message, "\n") {
				t.Errorf("problem is more than one line: %q", ce.Problems[0].Message)
			}
		})
	}
}

// The API socket's directory is checked as run_dir is (whoever may change
// it may put their own socket in mpsd's place), by CheckDirs with the
// other directories and by CheckSocketDir alone, keyed "socket"; the
// socket file itself is not judged.
func TestCheckSocketDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes directories owned by other uids")
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := func(t *testing.T, p string, mode os.FileMode, uid int) string {
		t.Helper()
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
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the socket
		msg   string                                // "" = accepted
	}{
		{"missing directory", func(t *testing.T, dir string) string { return filepath.Join(dir, "run", "mpsd.sock") }, ""},
		{"root 0755", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "run"), 0o755, 0), "mpsd.sock")
		}, ""},
		{"a stale file of another uid in a good directory", func(t *testing.T, dir string) string {
			s := filepath.Join(mk(t, filepath.Join(dir, "run"), 0o755, 0), "mpsd.sock")
			if err := os.WriteFile(s, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(s, 64204, 64204); err != nil {
				t.Fatal(err)
			}
			return s
		}, ""},
		{"missing under a sticky world-writable directory", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "tmp"), os.ModeSticky|0o777, 0), "mpsd", "mpsd.sock")
		}, ""},
		{"directly in tmp", func(*testing.T, string) string { return "/tmp/mpsd.sock" },
			"the directory of /tmp/mpsd.sock: /tmp is writable by its group or by others (mode 1777)"},
		{"owned by another uid", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "run"), 0o755, 64204), "mpsd.sock")
		}, "run is owned by uid 64204, not root, who could change it; chown root:root "},
		{"group-writable", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "run"), 0o775, 0), "mpsd.sock")
		}, "is writable by its group or by others (mode 0775)"},
		{"ancestor owned by another uid", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "u"), 0o755, 64205), "run", "mpsd.sock")
		}, "is owned by uid 64205, not root"},
		{"world-writable ancestor without sticky bit", func(t *testing.T, dir string) string {
			return filepath.Join(mk(t, filepath.Join(dir, "ww"), 0o777, 0), "run", "mpsd.sock")
		}, "without the sticky bit (mode 0777)"},
		{"symlinked directory", func(t *testing.T, dir string) string {
			real := mk(t, filepath.Join(dir, "real"), 0o755, 0)
			if err := os.Symlink(real, filepath.Join(dir, "run")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, "run", "mpsd.sock")
		}, "is a symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := mk(t, filepath.Join(base, strings.ReplaceAll(tc.name, " ", "-")), 0o755, 0)
			sock := tc.setup(t, dir)
			c := &Config{Socket: sock, RunDir: filepath.Join(dir, "r"), StateDir: filepath.Join(dir, "s"), LogDir: filepath.Join(dir, "l")}
			for name, err := range map[string]error{"CheckDirs": CheckDirs(c, 0), "CheckSocketDir": CheckSocketDir(sock, 0)} {
				if tc.msg == "" {
					if err != nil {
						t.Errorf("%s: %v", name, err)
					}
					continue
				}
				var ce *ConfigError
				if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Key != "socket" || !strings.Contains(ce.Problems[0].Message, tc.msg) {
					t.Errorf("%s = %v, want one socket problem with %q", name, err, tc.msg)
					continue
				}
				if m := ce.Problems[0].Message; strings.Contains(m, "\n") || !strings.HasPrefix(m, "the directory of "+sock+": ") {
					t.Errorf("%s: problem %q: want one line starting with the socket's path", name, m)
				}
			}
		})
	}
}
