package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// nonRootUID is this file's test user (emutest.User).
const nonRootUID = 64750

// An mpsd that is not root, with cgroups on (the default), refuses to
// start with one line naming the fix, before READY, instead of serving
// and then refusing every launch; with cgroups off it starts.
func TestNonRootCgroupsRefused(t *testing.T) {
	// The user first: its removal then runs after the env's cleanup has
	// stopped the MPS daemons left running as it.
	name := emutest.User(t, nonRootUID)
	e := newEnv(t, "")
	if err := os.Chown(e.dir, nonRootUID, nonRootUID); err != nil {
		t.Fatal(err)
	}
	groups := fmt.Sprintf("  inference:\n    users: [%s]\n    memory: 20G\n", name)
	mpsdAs := func() *exec.Cmd {
		cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonRootUID, Gid: nonRootUID}}
		return cmd
	}

	t.Run("cgroups on", func(t *testing.T) {
		e.writeConfig(groups)
		p := startProc(t, mpsdAs())
		if code := p.wait(t); code != 1 {
			t.Fatalf("mpsd as %s with cgroups on: exit %d, want 1; stderr:\n%s", name, code, p.errb.String())
		}
		out := p.errb.String()
		want := regexp.MustCompile(`mpsd cannot start" err="mpsd: invalid config: cgroup.enabled is true but mpsd cannot create cgroups under /sys/fs/cgroup/(unified/)?` +
			regexp.QuoteMeta(e.parent+" (permission denied): run mpsd as root, or set cgroup.enabled: false (no isolation)\""))
		if !want.MatchString(out) {
			t.Fatalf("stderr does not say\n  %s\nit says:\n%s", want, out)
		}
		if _, err := os.Stat(filepath.Join(e.dir, "run")); err == nil {
			t.Errorf("mpsd made %s/run before refusing", e.dir)
		}
	})

	t.Run("cgroups off", func(t *testing.T) {
		e.writeConfig(groups)
		cfg, err := os.ReadFile(e.cfgPath)
		if err != nil {
			t.Fatal(err)
		}
		off := strings.Replace(string(cfg), "cgroup:\n", "cgroup:\n  enabled: false\n", 1)
		if err := os.WriteFile(e.cfgPath, []byte(off), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := mpsdAs()
		cmd.Stderr = e.log
		p := startProc(t, cmd)
		deadline := time.Now().Add(waitFor)
		for {
			st, err := apiStatus(e.socket)
			if err == nil && instancesUp(st, 2) {
				break
			}
			select {
			case <-p.done:
				t.Fatalf("mpsd as %s with cgroups off ended: %v", name, p.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("mpsd as %s with cgroups off not serving after %s: %v", name, waitFor, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t); code != 0 {
			t.Fatalf("mpsd exit %d after SIGTERM", code)
		}
	})
}

// A directory mpsd's user cannot write is refused at start, naming the
// config key to change.
func TestNonRootUnwritableDirRefused(t *testing.T) {
	name := emutest.User(t, nonRootUID+1)
	e := newEnv(t, "")
	e.writeConfig(fmt.Sprintf("  inference:\n    users: [%s]\n    memory: 20G\n", name))
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfgPath, []byte(strings.Replace(string(cfg), "cgroup:\n", "cgroup:\n  enabled: false\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonRootUID + 1, Gid: nonRootUID + 1}}
	p := startProc(t, cmd)
	if code := p.wait(t); code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, p.errb.String())
	}
	want := fmt.Sprintf("run_dir %s/run: mpsd (uid %d) cannot write %s (permission denied): run mpsd as root, or set run_dir: to a directory mpsd's user may write", e.dir, nonRootUID+1, e.dir)
	if out := p.errb.String(); !strings.Contains(out, want) {
		t.Fatalf("stderr does not say\n  %s\nit says:\n%s", want, out)
	}
}
