package deviceplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/mps"
)

// shmAttackerUID is the real user (emutest.User) whose pod fills its
// /dev/shm.
const shmAttackerUID = 64640

// runFSSize is the size of the test's own file system for run_dir.
const runFSSize = 32 << 20

// freeBytes is what a file system has free for unprivileged users.
func freeBytes(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail * uint64(st.Bsize)
}

// A pod (a real unprivileged user, in the mount view Allocate gives it,
// as runc builds it) writes 96 MiB into its /dev/shm: it fills only its
// instance's private tmpfs (the default shm_size, 64 MiB), and run_dir's
// file system (a 32 MiB one of the test's), where every control daemon
// keeps its pipe directory, keeps its free space; mpsd logs the tmpfs
// full, and empties it once no pod of the instance runs (the plugin's
// leases released, no MPS server). Once the instance stops (its group
// leaves the config) the tmpfs is unmounted and its directory gone.
// Before, the private /dev/shm was a plain directory on run_dir's file
// system: the pod filled run_dir, and nothing emptied it.
func TestPodFillsOnlyItsInstanceShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, mount namespaces, a real user")
	}
	attacker := emutest.User(t, shmAttackerUID)
	m := newMPSDIn(t, twoGroups, func(m *mpsdProc) {
		run := filepath.Join(m.dir, "run")
		if err := os.Mkdir(run, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("mpsd-test-run", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0755", runFSSize)); err != nil {
			t.Fatal(err)
		}
		m.unmount = append(m.unmount, func() {
			if err := unix.Unmount(run, unix.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", run, err)
			}
		})
	})
	run := filepath.Join(m.dir, "run")
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	stopPlugin := runPlugin(t, m, dir)
	pcs := k.waitRegistered("mpsd.io/a-sm", "mpsd.io/b-sm")
	pcs["mpsd.io/a-sm"].waitList(t, "a healthy", allHealthy)
	st := m.waitStatus("status", func(api.Status) bool { return true })
	in, _ := findInstance(st, "a", 0)
	shm := filepath.Join(run, "a", in.GPUUUID, "shm")

	_, resp, err := allocate(t, pcs["mpsd.io/a-sm"], ids("a", 0, seq(0, 99)...), 10)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	checkPodMounts(t, resp, resp.Envs[api.EnvPipeDirectory], shm)
	u, err := mps.ReadShmUsage(shm)
	if err != nil || u.Size != 64<<20 {
		t.Fatalf("the instance's private /dev/shm: %+v, %v; want a 64 MiB tmpfs (the default shm_size)", u, err)
	}

	free := freeBytes(t, run)
	podView(t, resp.Mounts, func(root string) {
		out, err := runAs(shmAttackerUID, nil, `head -c 100663296 /dev/zero > "$1/fill"`, filepath.Join(root, "dev/shm"))
		if err == nil || !strings.Contains(out, "No space left") {
			t.Errorf("%s wrote 96 MiB into its pod's /dev/shm: %v %s; want no space left", attacker, err, out)
		}
	})
	// The pod's writes landed in the tmpfs, as far as it goes, not in
	// run_dir.
	if fi, err := os.Stat(filepath.Join(shm, "fill")); err != nil || fi.Size() == 0 || fi.Size() > 64<<20 || fi.Sys().(*syscall.Stat_t).Uid != shmAttackerUID {
		t.Errorf("the pod's file in its instance's /dev/shm: %v %v; want up to 64 MiB, the attacker's", fi, err)
	}
	if after := freeBytes(t, run); after+(256<<10) < free {
		t.Errorf("run_dir's file system lost %d of its %d free bytes to the pod's /dev/shm (now %d free): a pod fills the host's run_dir", free-after, free, after)
	}
	if u, err := mps.ReadShmUsage(shm); err != nil || !u.Full() {
		t.Errorf("the instance's private /dev/shm after the pod filled it: %+v, %v; want full", u, err)
	}
	m.waitLog(`msg="private /dev/shm full`)
	// Kept while the pod's lease runs.
	if _, err := os.Stat(filepath.Join(shm, "fill")); err != nil {
		t.Errorf("the pod's file went while its lease runs: %v", err)
	}

	// The pod ends: its lease is released with the plugin's stream.
	stopPlugin()
	m.waitStatus("no lease", func(st api.Status) bool { return len(st.Leases) == 0 })
	m.waitLog(`msg="private /dev/shm emptied`)
	if u, err := mps.ReadShmUsage(shm); err != nil || u.Full() || u.Used != 0 {
		t.Errorf("the instance's private /dev/shm once no pod of it runs: %+v, %v; want emptied", u, err)
	}
	if _, err := os.Stat(filepath.Join(shm, "fill")); err == nil {
		t.Errorf("the pod's file is still there")
	}

	// The instances stop: group a leaves the config. It has one on each
	// GPU (gpu 0's is the one the pod filled, gpu 1's is beside group b's),
	// each stopped by its own supervisor, in no set order: every one of
	// them is waited for, not only gpu 0's (with gpu 0's alone, a loaded
	// host saw gpu 1's tmpfs still mounted, its daemon not yet stopped).
	var shmsA []string
	for _, in := range st.Instances {
		if in.Group == "a" {
			shmsA = append(shmsA, filepath.Join(run, "a", in.GPUUUID, "shm"))
		}
	}
	if len(shmsA) != 2 {
		t.Fatalf("group a's private /dev/shm directories: %q; want one per GPU, 2", shmsA)
	}
	m.writeConfig(`  b:
    users: ["UID"]
    gpus: ["1"]
    sm_percent: 50
    memory: 10G
`)
	deadline := time.Now().Add(waitFor)
	for _, dir := range shmsA {
		for {
			_, err := os.Lstat(dir)
			if os.IsNotExist(err) {
				// And so no mount on it: a directory some mount sits on
				// cannot be removed in that namespace, and its removal
				// detaches those of every other.
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still there %s after its instance left the config (lstat: %v; a private /dev/shm: %v)", dir, waitFor, err, mps.IsShm(dir))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if shms, err := mps.ShmMountsUnder(run); err != nil || len(shms) != 1 || !strings.HasPrefix(shms[0], filepath.Join(run, "b")+"/") {
		t.Errorf("private /dev/shm mounts under run_dir once group a's instances stopped: %q, %v; want group b's only", shms, err)
	}
	for _, dir := range shmsA {
		m.waitLogLine(`msg="private /dev/shm unmounted and removed: the instance stopped"`, "dir="+dir)
	}
}

// waitLog waits until mpsd's log has s.
func (m *mpsdProc) waitLog(s string) {
	m.t.Helper()
	if !waitFile(m.t, m.log.Name(), s) {
		m.t.Fatalf("mpsd did not log %q within %s", s, waitFor)
	}
}

// waitLogLine waits until a line of mpsd's log has every one of parts.
func (m *mpsdProc) waitLogLine(parts ...string) {
	m.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		b, _ := os.ReadFile(m.log.Name())
		for line := range strings.Lines(string(b)) {
			missing := slices.IndexFunc(parts, func(p string) bool { return !strings.Contains(line, p) })
			if missing < 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("mpsd logged no line with all of %q within %s", parts, waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
