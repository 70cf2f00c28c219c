package mpsctl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
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

// sockDirUID is the attacker of TestCheckConfigSocketDirOfATenant.
const sockDirUID = 64223

// check-config judges the API socket's directory as mpsd does: with the
// socket configured under a sticky, world-writable directory (as
// /tmp/mpsd/mpsd.sock would be) it is fine while the socket's directory
// does not exist (mpsd would make it, as root), and refused, one line
// naming the directory, its owner and the fix, once a real unprivileged
// user has made it first, as anyone may there: that user could put their
// own socket in mpsd's place.
func TestCheckConfigSocketDirOfATenant(t *testing.T) {
	attacker := emutest.User(t, sockDirUID)
	base, err := os.MkdirTemp("", "ccs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	pub := filepath.Join(base, "pub")
	if err := os.Mkdir(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pub, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(pub, "mpsd")
	sock := filepath.Join(sockDir, "mpsd.sock")
	cfg := filepath.Join(base, "mpsd.yaml")
	y := "version: 1\nsocket: " + sock + "\nrun_dir: " + base + "/run\nstate_dir: " + base + "/state\nlog_dir: " + base + "/log" +
		"\ncgroup: {enabled: false}\nsimulate: {gpus: 1, model: a100-40g}\ngroups: {inference: {users: [root], memory: 10G}}\n"
	if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	checkConfig := func() result {
		return mpsctl(t, Config{NVML: noNVML}, []string{"MPSD_SOCKET=/nonexistent/s.sock"}, "check-config", "--simulate", cfg)
	}
	if r := checkConfig(); r.code != ExitOK || r.stdout != cfg+": ok\n" {
		t.Fatalf("before the tenant made %s: exit %d, stdout %q, stderr %q; want ok", sockDir, r.code, r.stdout, r.stderr)
	}

	mkdir := exec.Command("mkdir", sockDir)
	mkdir.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: sockDirUID, Gid: sockDirUID, Groups: []uint32{}}}
	if out, err := mkdir.CombinedOutput(); err != nil {
		t.Fatalf("mkdir %s as %s: %v: %s", sockDir, attacker, err, out)
	}
	r := checkConfig()
	want := fmt.Sprintf("%s: socket: the directory of %s: %s is owned by uid %d, not root, who could change it; chown root:root %s", cfg, sock, sockDir, sockDirUID, sockDir)
	if r.code != ExitFailure || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, want) {
		t.Fatalf("after %s made %s: exit %d, stdout %q, stderr %q; want exit %d and the one line %q...", attacker, sockDir, r.code, r.stdout, r.stderr, ExitFailure, want)
	}
}
