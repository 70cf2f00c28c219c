// Package logrotate holds the logrotate(8) config shipped for the MPS logs
// and its test: the real logrotate accepts it and rotates an instance's
// control.log and server.log in place (same inode, truncated), which is what
// mpsd's log follower survives (mps.TestLogFollower's truncate case).
package logrotate

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// RequireEnv set to 1 (CI sets it) makes a missing logrotate a failure.
const requireEnv = "MPSD_REQUIRE_LOGROTATE"

func logrotate(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"logrotate", "/usr/sbin/logrotate", "/sbin/logrotate"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("logrotate not found and %s=1", requireEnv)
	}
	t.Skip("logrotate not installed (apt-get install logrotate); set " + requireEnv + "=1 to make this a failure")
	return ""
}

func TestShippedConfigRotatesInPlace(t *testing.T) {
	bin := logrotate(t)
	conf, err := os.ReadFile("mpsd")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(conf, []byte("\tcopytruncate\n")) {
		t.Fatal("the shipped config must rotate with copytruncate: the control daemon cannot reopen its logs")
	}
	dir := t.TempDir()
	logDir := filepath.Join(dir, "log")
	inst := filepath.Join(logDir, "inference", "GPU-0000")
	if err := os.MkdirAll(inst, 0o750); err != nil {
		t.Fatal(err)
	}
	// logrotate refuses directories that others can write; TempDir is 0700
	// below a sticky /tmp, and so is what the config names.
	const rootPath = "/var/log/mpsd/"
	if !bytes.Contains(conf, []byte(rootPath)) {
		t.Fatalf("the shipped config does not name %s", rootPath)
	}
	local := filepath.Join(dir, "mpsd.conf")
	if err := os.WriteFile(local, bytes.ReplaceAll(conf, []byte(rootPath), []byte(logDir+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	var inodes = map[string]uint64{}
	for _, name := range []string{"control.log", "server.log"} {
		p := filepath.Join(inst, name)
		if err := os.WriteFile(p, []byte(strings.Repeat("[2026-12-01 14:00:00.000 Control 100] Accepting connection...\n", 10)), 0o640); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		inodes[name] = fi.Sys().(*syscall.Stat_t).Ino
	}
	out, err := exec.Command(bin, "--verbose", "--force", "--state", filepath.Join(dir, "state"), local).CombinedOutput()
	if err != nil {
		t.Fatalf("logrotate: %v\n%s", err, out)
	}
	for name, ino := range inodes {
		p := filepath.Join(inst, name)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s after rotation: %v\n%s", name, err, out)
		}
		if got := fi.Sys().(*syscall.Stat_t).Ino; got != ino {
			t.Errorf("%s was replaced (inode %d → %d), not truncated in place: the daemon would write to the rotated file", name, ino, got)
		}
		if fi.Size() != 0 {
			t.Errorf("%s has %d bytes after rotation; want it truncated", name, fi.Size())
		}
		rotated, _ := filepath.Glob(p + "-*")
		if len(rotated) != 1 {
			t.Errorf("%s: want one rotated copy, got %v\n%s", name, rotated, out)
		}
	}
}
