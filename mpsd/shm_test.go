package mpsd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/mps"
)

// The cleaning rule: only a full private /dev/shm, only with no lease
// (no pod) and no MPS server of its instance left.
func TestShmCleanable(t *testing.T) {
	for _, tc := range []struct {
		full            bool
		leases, servers int
		want            bool
	}{
		{true, 0, 0, true},
		{true, 1, 0, false},
		{true, 0, 1, false},
		{false, 0, 0, false},
		{false, 2, 1, false},
	} {
		if got := shmCleanable(tc.full, tc.leases, tc.servers); got != tc.want {
			t.Errorf("shmCleanable(full %v, leases %d, servers %d) = %v, want %v", tc.full, tc.leases, tc.servers, got, tc.want)
		}
	}
}

type fakeInfo struct {
	fs.FileInfo
	mode fs.FileMode
	uid  uint32
}

func (f fakeInfo) Mode() fs.FileMode { return f.mode }
func (f fakeInfo) IsDir() bool       { return f.mode.IsDir() }
func (f fakeInfo) Sys() any          { return &syscall.Stat_t{Uid: f.uid} }

// An instance's shm entry is mpsd's: the tmpfs's root or an earlier plain
// private /dev/shm (1777), or the directory below a tmpfs not mounted
// (writable by mpsd alone); nothing else.
func TestOwnShmDir(t *testing.T) {
	me := uint32(os.Geteuid())
	for _, tc := range []struct {
		mode fs.FileMode
		uid  uint32
		ok   bool
	}{
		{fs.ModeDir | fs.ModeSticky | 0o777, me, true},
		{fs.ModeDir | 0o755, me, true},
		{fs.ModeDir | 0o700, me, true},
		{fs.ModeDir | 0o777, me, false},
		{fs.ModeDir | fs.ModeSticky | 0o775, me, false},
		{fs.ModeDir | fs.ModeSetgid | 0o755, me, false},
		{fs.ModeDir | fs.ModeSticky | 0o777, me + 1, false},
		{fs.ModeSymlink | 0o777, me, false},
		{0o644, me, false},
	} {
		err := ownShmDir("/run/mpsd/g/GPU-1/shm", fakeInfo{mode: tc.mode, uid: tc.uid})
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errForeignDir)) {
			t.Errorf("ownShmDir(mode %v, uid %d) = %v, want ok %v", tc.mode, tc.uid, err, tc.ok)
		}
	}
}

// shmGauge is the value of an instance's series of name as mpsd gathers
// it for /metrics; ok is false when it has none.
func (e *testEnv) shmGauge(name, group string) (float64, bool) {
	e.t.Helper()
	fams, err := e.d.metricsGatherer().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	m := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	return value(m, name, map[string]string{"group": group})
}

// waitShmGauge waits until an instance's series of name has want.
func (e *testEnv) waitShmGauge(name, group string, want float64) {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		v, ok := e.shmGauge(name, group)
		if ok && v == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s{group=%q} = %v (present %v) after %s, want %v", name, group, v, ok, waitFor, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// shmChecks is how often the checks of the group's one instance read its
// private /dev/shm.
func (e *testEnv) shmChecks(group string) uint64 {
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	for _, in := range e.d.instances {
		if in.group == group {
			return in.shm.checks
		}
	}
	return 0
}

// countLog counts the lines of mpsd's log holding s.
func (e *testEnv) countLog(s string) int {
	b, _ := os.ReadFile(e.log.Name())
	return strings.Count(string(b), s)
}

// unmountShmsAfter has the private /dev/shm mounts under *dir unmounted
// once the test's mpsd, its daemons and its cleanup are done: registered
// before newEnv, it runs after the env's own cleanup.
func unmountShmsAfter(t *testing.T, dir *string) {
	t.Cleanup(func() {
		if *dir == "" {
			return
		}
		shms, err := mps.ShmMountsUnder(*dir)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, shm := range shms {
			if _, err := mps.UnmountShm(shm, ""); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		_ = os.RemoveAll(*dir)
	})
}

// The private /dev/shm of an instance the kubelet device plugin serves:
// a tmpfs of the group's shm_size on <run_dir>/<group>/<gpu>/shm,
// reported (mpsd_shm_size_bytes, mpsd_shm_used_bytes, mpsd_shm_full,
// mpsd_shm_cleaned_total) and, once full, logged and emptied when no
// lease of the instance runs, never while one does; resized when
// shm_size changes; kept (the same mount) across a restart of mpsd;
// unmounted and removed when the instance stops. One mpsd finds at its
// start of an instance it does not run (a crash between a daemon's stop
// and its unmount) is removed; another mount under run_dir is left alone.
func TestPrivateShmLifecycle(t *testing.T) {
	var dir string
	unmountShmsAfter(t, &dir)
	groups := func(size string) string {
		return fmt.Sprintf(`  k8s:
    users: [root]
    gpus: ["0"]
    memory: 1G
    multiuser: true
    shm_size: %s
  host:
    users: [root]
    gpus: ["1"]
    memory: 1G
`, size)
	}
	const watchdog = "watchdog:\n  probe_interval: 100ms\n  probe_timeout: 90ms\n  backoff_initial: 50ms\n  backoff_max: 1s\n"
	e := newEnv(t, groups("2M"), watchdog)
	dir = e.dir
	e.opts.PrivateShm = func(group string) bool { return group == "k8s" }
	// What an mpsd that crashed left: the private /dev/shm of an instance
	// this one does not run, and a tmpfs of someone else's.
	stale := filepath.Join(e.dir, "run", "k8s", "GPU-gone", mps.ShmDirName)
	if _, err := mps.MountShm(mps.ShmMount{Dir: stale, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(e.dir, "run", "k8s", "GPU-other", mps.ShmDirName)
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("not-mpsd", other, "tmpfs", 0, "size=1m,mode=1777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(other, syscall.MNT_DETACH) })
	e.start()
	st := e.waitStatus("instances ready", func(st api.Status) bool {
		return len(st.Instances) == 2 && st.Instances[0].State == api.InstanceReady && st.Instances[1].State == api.InstanceReady
	})
	if _, err := os.Lstat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale private /dev/shm %s: %v; want it unmounted and removed", stale, err)
	}
	e.waitLogLine(`msg="stale private /dev/shm removed`, stale)
	if err := mps.IsShm(other); !errors.Is(err, mps.ErrShmDir) {
		t.Errorf("another tmpfs under run_dir: %v; want it left mounted", err)
	}
	var uuid, hostUUID string
	for _, in := range st.Instances {
		if in.Group == "k8s" {
			uuid = in.GPUUUID
		} else {
			hostUUID = in.GPUUUID
		}
	}
	shm := filepath.Join(e.dir, "run", "k8s", uuid, mps.ShmDirName)
	if err := mps.IsShm(shm); err != nil {
		t.Fatalf("the served instance's private /dev/shm: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(e.dir, "run", "host", hostUUID, mps.ShmDirName)); err == nil {
		t.Errorf("an instance the plugin does not serve has a private /dev/shm")
	}
	e.waitShmGauge("mpsd_shm_size_bytes", "k8s", 2<<20)
	if _, ok := e.shmGauge("mpsd_shm_size_bytes", "host"); ok {
		t.Errorf("mpsd_shm_size_bytes for an instance without a private /dev/shm")
	}

	// Filled with no lease running: reported, then emptied.
	fill := func() {
		t.Helper()
		err := os.WriteFile(filepath.Join(shm, "fill"), make([]byte, 3<<20), 0o644)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("writing 3 MiB into a 2 MiB private /dev/shm: %v, want ENOSPC", err)
		}
	}
	fill()
	e.waitShmGauge("mpsd_shm_cleaned_total", "k8s", 1)
	e.waitLogLine(`msg="private /dev/shm full`, "group=k8s", "size_bytes=2097152", "leases=0")
	e.waitLogLine(`msg="private /dev/shm emptied`, "group=k8s", "removed=1")
	e.waitShmGauge("mpsd_shm_full", "k8s", 0)
	e.waitShmGauge("mpsd_shm_used_bytes", "k8s", 0)

	// Filled while a lease runs: full, and kept so, until it ends.
	gate, open := e.gate("lease")
	p := startProc(t, e.launch(append([]string{"--group", "k8s", "--sm", "10", "--mem", "64M", "--"}, gate...)...))
	e.waitStatus("the lease running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	fills := e.countLog(`msg="private /dev/shm full`)
	fill()
	e.waitShmGauge("mpsd_shm_full", "k8s", 1)
	for n := e.shmChecks("k8s") + 3; e.shmChecks("k8s") < n; {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(shm, "fill")); err != nil {
		t.Errorf("the full private /dev/shm was emptied while a lease of its instance runs: %v", err)
	}
	if v, _ := e.shmGauge("mpsd_shm_cleaned_total", "k8s"); v != 1 || e.countLog(`msg="private /dev/shm full`) != fills+1 {
		t.Errorf("mpsd_shm_cleaned_total %v, full logged %d more times; want 1, once", v, e.countLog(`msg="private /dev/shm full`)-fills)
	}
	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitShmGauge("mpsd_shm_cleaned_total", "k8s", 2)
	e.waitShmGauge("mpsd_shm_full", "k8s", 0)

	// shm_size changed: the running instance takes it.
	e.writeConfig(groups("4M"), watchdog)
	e.waitShmGauge("mpsd_shm_size_bytes", "k8s", 4<<20)
	e.waitLogLine(`msg="private /dev/shm resized`, "shm_size=4194304")

	// mpsd restarts: the daemon is adopted with its tmpfs, which stays.
	before := devIno(t, shm)
	e.stop()
	e.start()
	e.waitStatus("the instances adopted", func(st api.Status) bool {
		return len(st.Instances) == 2 && st.Instances[0].State == api.InstanceReady && st.Instances[1].State == api.InstanceReady
	})
	if err := mps.IsShm(shm); err != nil || devIno(t, shm) != before {
		t.Errorf("the private /dev/shm after mpsd's restart: %v, %s (was %s); want the same tmpfs", err, devIno(t, shm), before)
	}
	if got, err := mps.ShmMountsUnder(filepath.Join(e.dir, "run")); err != nil || len(got) != 1 || got[0] != shm {
		t.Errorf("private /dev/shm mounts under run_dir after the restart: %q, %v; want %s alone", got, err, shm)
	}

	// The instance stops (its group leaves the config): its tmpfs goes.
	e.writeConfig(`  host:
    users: [root]
    gpus: ["1"]
    memory: 1G
`, watchdog)
	deadline := time.Now().Add(waitFor)
	for {
		if _, err := os.Lstat(shm); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there %s after its instance left the config (a private /dev/shm: %v)", shm, waitFor, mps.IsShm(shm))
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.waitLogLine(`msg="private /dev/shm unmounted and removed: the instance stopped"`, "group=k8s")
	if got, err := mps.ShmMountsUnder(filepath.Join(e.dir, "run")); err != nil || len(got) != 0 {
		t.Errorf("private /dev/shm mounts under run_dir once the instance stopped: %q, %v", got, err)
	}
}

// devIno identifies a directory: the root of a mount shows its own.
func devIno(t testing.TB, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}
