package mpsd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/gpu"
)

// mpsd refuses to start on directories someone but root could change:
// state_dir /tmp, a group-writable or foreign-owned directory, and
// directories inside one another, each with one line naming the setting,
// the path, the problem and the fix. Nothing is chmodded on the way.
func TestStartRefusesUnsafeDirs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, e *testEnv) (from, to string) // config line to replace
		want  string
	}{
		{"state_dir /tmp", func(t *testing.T, e *testEnv) (string, string) {
			// The others away from /tmp, which would overlap it.
			return "run_dir: " + e.dir + "/run\nstate_dir: " + e.dir + "/state\nlog_dir: " + e.dir + "/log",
				"run_dir: /nonexistent-mpsd-test/run\nstate_dir: /tmp\nlog_dir: /nonexistent-mpsd-test/log"
		}, "state_dir: /tmp is writable by its group or by others (mode 1777)"},
		{"group-writable state_dir", func(t *testing.T, e *testEnv) (string, string) {
			mkOwned(t, filepath.Join(e.dir, "state"), 0o775, 0)
			return "", ""
		}, "state_dir: " + "DIR/state is writable by its group or by others (mode 0775)"},
		{"run_dir of another uid", func(t *testing.T, e *testEnv) (string, string) {
			mkOwned(t, filepath.Join(e.dir, "run"), 0o755, 64220)
			return "", ""
		}, "run_dir: DIR/run is owned by uid 64220, not root"},
		{"overlapping", func(t *testing.T, e *testEnv) (string, string) {
			return "state_dir: " + e.dir + "/state", "state_dir: " + e.dir + "/log/state"
		}, "log_dir: DIR/log overlaps state_dir DIR/log/state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, oneGroup, "")
			from, to := tc.setup(t, e)
			cfg := e.config(oneGroup, "")
			if from != "" {
				if !strings.Contains(cfg, from) {
					t.Fatalf("config lacks %q", from)
				}
				cfg = strings.Replace(cfg, from, to, 1)
			}
			if err := os.WriteFile(e.cfgPath, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			tmp, _ := os.Stat("/tmp")
			_, err := New(e.opts)
			want := strings.ReplaceAll(tc.want, "DIR", e.dir)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
				t.Fatalf("New = %v; want ErrConfig with %q", err, want)
			}
			if after, _ := os.Stat("/tmp"); after.Mode() != tmp.Mode() {
				t.Fatalf("/tmp's mode changed from %v to %v", tmp.Mode(), after.Mode())
			}
		})
	}
}

// A pipe directory that someone else made under run_dir before mpsd
// started (here uid 64221) is refused, not adopted: mpsd does not start,
// and the directory keeps its owner and mode.
func TestStartRefusesForeignPipeDir(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	mkOwned(t, filepath.Join(e.dir, "run"), 0o755, 0)
	mkOwned(t, filepath.Join(e.dir, "run", "inference"), 0o750, 0)
	gpuDir := mkOwned(t, filepath.Join(e.dir, "run", "inference", gpu.SimUUID(0)), 0o755, 0)
	pipe := mkOwned(t, filepath.Join(gpuDir, "pipe"), 0o777, 64221)

	ready := make(chan struct{})
	opts := e.opts
	opts.Ready = func() { close(ready) }
	d, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var runErr error
	select {
	case runErr = <-done:
	case <-ready:
		cancel()
		<-done
		t.Fatal("mpsd started on a pipe directory uid 64221 made")
	case <-time.After(waitFor):
		t.Fatalf("mpsd neither started nor failed within %s", waitFor)
	}
	if !errors.Is(runErr, errForeignDir) || !strings.Contains(runErr.Error(), pipe+" is owned by uid 64221") {
		t.Fatalf("Run = %v; want errForeignDir naming %s", runErr, pipe)
	}
	fi, err := os.Lstat(pipe)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o777 || fi.Sys().(*syscall.Stat_t).Uid != 64221 {
		t.Errorf("refused pipe directory now mode %v uid %d; want it untouched", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}
}

func mkOwned(t *testing.T, p string, mode os.FileMode, uid int) string {
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
