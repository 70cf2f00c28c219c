package mps

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount namespaces and bind mounts")
	}
}

// devIno identifies a directory: a bind mount shows the same inode.
func devIno(t testing.TB, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

func mntNS(t testing.TB, path string) string {
	t.Helper()
	ns, err := os.Readlink(path)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// shmMounts lists the mountinfo lines of the mounts on /dev/shm, or whose
// mount point or root lies under dir.
func shmMounts(t testing.TB, mountinfo, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if f[4] == DevShm || strings.HasPrefix(f[4], dir) || strings.HasPrefix(f[3], dir) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// topShm is the mountinfo line of the mount visible at /dev/shm (the
// last one on it).
func topShm(lines []string) string {
	top := ""
	for _, l := range lines {
		if f := strings.Fields(l); f[4] == DevShm {
			top = l
		}
	}
	return top
}

// waitThreadsInNS waits until every thread of this process is in the
// mount namespace ns: a thread that made a private namespace must be gone.
func waitThreadsInNS(t *testing.T, ns string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var odd []string
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			if got, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns/mnt")); err == nil && got != ns {
				odd = append(odd, task.Name()+"="+got)
			}
		}
		if len(odd) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads of the test process still in another mount namespace: %v (want %s): a thread that made a private /dev/shm went back to the runtime", odd, ns)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The control daemon started through PrivateShm, and the servers it forks,
// have the instance's directory as /dev/shm, in a mount namespace of their
// own; the test process (mpsd) keeps its own /dev/shm, no mount appears in
// its namespace, and no thread of it stays in the daemon's namespace.
func TestPrivateShmDaemonAndServers(t *testing.T) {
	needRoot(t)
	ourNS := mntNS(t, "/proc/self/ns/mnt")
	hostShm := devIno(t, DevShm)
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		shm := ShmDirFor(cfg.PipeDir)
		base := filepath.Dir(shm)
		before := shmMounts(t, "/proc/self/mountinfo", base)
		cfg.Runner = PrivateShm(nil, shm)
		in := start(t, cfg)
		fi, err := os.Lstat(shm)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Fatalf("instance shm dir %s: %v, %v; want a directory of mode 1777", shm, fi, err)
		}
		pids := map[string]int{"daemon": in.d.PID(), "server": in.startServer(t)}
		for who, pid := range pids {
			proc := fmt.Sprintf("/proc/%d", pid)
			if ns := mntNS(t, proc+"/ns/mnt"); ns == ourNS {
				t.Errorf("%s %d shares mpsd's mount namespace %s", who, pid, ns)
			}
			if got, want := devIno(t, proc+"/root"+DevShm), devIno(t, shm); got != want {
				t.Errorf("%s %d: /dev/shm is %s, want the instance's %s (%s)", who, pid, got, shm, want)
			}
			top := topShm(shmMounts(t, proc+"/mountinfo", base))
			f := strings.Fields(top)
			if len(f) < 6 || !strings.HasSuffix(f[3], strings.TrimPrefix(shm, "/tmp")) {
				t.Errorf("%s %d: /dev/shm mount %q, want a bind of %s", who, pid, top, shm)
			} else {
				for _, opt := range []string{"nosuid", "nodev", "noexec"} {
					if !slices.Contains(strings.Split(f[5], ","), opt) {
						t.Errorf("%s %d: /dev/shm mount %q lacks %s", who, pid, top, opt)
					}
				}
			}
		}
		// What the daemon side writes there lands in the instance dir.
		if err := os.WriteFile(filepath.Join(fmt.Sprintf("/proc/%d/root", pids["server"])+DevShm, "seg"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(shm, "seg")); err != nil {
			t.Errorf("a file the server side made in its /dev/shm is not in %s: %v", shm, err)
		}
		if _, err := os.Stat(filepath.Join(DevShm, "seg")); err == nil && devIno(t, DevShm) == hostShm {
			// Only a problem if it is ours: another process may use the
			// name; the instance dir check above is the real one.
			if devIno(t, filepath.Join(DevShm, "seg")) == devIno(t, filepath.Join(shm, "seg")) {
				t.Errorf("the server's shared memory shows in mpsd's /dev/shm")
			}
		}
		if got := devIno(t, DevShm); got != hostShm {
			t.Errorf("mpsd's /dev/shm changed: %s, was %s", got, hostShm)
		}
		if after := shmMounts(t, "/proc/self/mountinfo", base); !slices.Equal(before, after) {
			t.Errorf("mounts on /dev/shm or under %s in mpsd's namespace changed:\nbefore %q\nafter  %q", base, before, after)
		}
	})
	waitThreadsInNS(t, ourNS)
}

// nsRunner records, for every command, whether the thread that starts it
// is in the test process's mount namespace, and what /dev/shm is there.
type nsRunner struct {
	mu   sync.Mutex
	seen map[string]bool // first argument → started in mpsd's namespace
	shm  map[string]string
	ns   string
	t    *testing.T
}

func (r *nsRunner) Start(cmd *exec.Cmd) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ns, _ := os.Readlink("/proc/thread-self/ns/mnt")
	key := strings.Join(cmd.Args[1:], " ")
	r.seen[key] = ns == r.ns
	r.shm[key] = devIno(r.t, DevShm) // stat from this thread: its namespace
	return cmd.Start()
}

// Only the daemon start (-d) gets the private namespace; control commands
// (echo CMD | nvidia-cuda-mps-control) run in mpsd's own.
func TestPrivateShmOnlyDaemonStart(t *testing.T) {
	needRoot(t)
	ourNS := mntNS(t, "/proc/self/ns/mnt")
	hostShm := devIno(t, DevShm)
	shm := filepath.Join(shortTempDir(t), "inst", ShmDirName)
	rec := &nsRunner{seen: map[string]bool{}, shm: map[string]string{}, ns: ourNS, t: t}
	r := PrivateShm(rec, shm)
	for _, args := range [][]string{{"-c", "exit 0"}, {"-c", "exit 0", "sh", "-d"}} {
		cmd := exec.Command("/bin/sh", args...)
		if err := r.Start(cmd); err != nil {
			t.Fatalf("Start %v: %v", args, err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if !rec.seen["-c exit 0"] || rec.shm["-c exit 0"] != hostShm {
		t.Errorf("a control command was started outside mpsd's namespace or /dev/shm: %v %v", rec.seen, rec.shm)
	}
	if rec.seen["-c exit 0 sh -d"] || rec.shm["-c exit 0 sh -d"] != devIno(t, shm) {
		t.Errorf("the daemon start (-d) was not started with the instance's /dev/shm %s (%s): %v %v", shm, devIno(t, shm), rec.seen, rec.shm)
	}
	waitThreadsInNS(t, ourNS)
}

// PrepareShmDir makes a root-owned 1777 directory, and refuses a path a
// tenant could have prepared: a link, a file, a directory of another uid.
func TestPrepareShmDir(t *testing.T) {
	needRoot(t)
	base := shortTempDir(t)
	dir := filepath.Join(base, "a", "shm")
	if err := PrepareShmDir(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(dir)
	if err != nil || fi.Mode() != os.ModeDir|os.ModeSticky|0o777 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("shm dir: %v %v; want a root-owned directory of mode 1777", fi.Mode(), err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := PrepareShmDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(dir); fi.Mode() != os.ModeDir|os.ModeSticky|0o777 {
		t.Errorf("mode %v not restored to 1777", fi.Mode())
	}

	link := filepath.Join(base, "b", "shm")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(DevShm, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "c", "shm")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(base, "d", "shm")
	if err := os.MkdirAll(other, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 64250, 64250); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, file, other, "relative/shm"} {
		if err := PrepareShmDir(p); !errors.Is(err, ErrShmDir) {
			t.Errorf("PrepareShmDir(%s) = %v, want ErrShmDir", p, err)
		}
		// A refused directory is never bound on a daemon's /dev/shm.
		cmd := exec.Command("/bin/sh", "-c", "exit 0", "sh", "-d")
		if err := PrivateShm(nil, p).Start(cmd); !errors.Is(err, ErrShmDir) {
			t.Errorf("PrivateShm(%s).Start = %v, want ErrShmDir", p, err)
			if err == nil {
				_ = cmd.Wait()
			}
		}
	}
	// Nothing the daemon needs may lie under /dev/shm, which its own
	// hides; nothing is made there.
	for _, tc := range []struct{ dir, env string }{
		{filepath.Join(DevShm, "mpsd-test-none", "shm"), ""},
		{dir, "CUDA_MPS_PIPE_DIRECTORY=" + DevShm + "/mpsd-test-none/pipe"},
		{dir, "CUDA_MPS_LOG_DIRECTORY=" + DevShm},
	} {
		cmd := exec.Command("/bin/sh", "-c", "exit 0", "sh", "-d")
		cmd.Env = []string{tc.env}
		if err := PrivateShm(nil, tc.dir).Start(cmd); !errors.Is(err, ErrShmDir) || !strings.Contains(err.Error(), "hides") {
			t.Errorf("PrivateShm(%s) with %q: %v, want ErrShmDir", tc.dir, tc.env, err)
			if err == nil {
				_ = cmd.Wait()
			}
		}
	}
	if _, err := os.Stat(filepath.Join(DevShm, "mpsd-test-none")); err == nil {
		t.Errorf("PrivateShm made a directory under %s", DevShm)
	}
	if got := ShmDirFor("/run/mpsd/a/GPU-1/pipe/"); got != "/run/mpsd/a/GPU-1/shm" {
		t.Errorf("ShmDirFor = %s", got)
	}
}
