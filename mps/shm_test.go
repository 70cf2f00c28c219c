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

	"golang.org/x/sys/unix"
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

// testShmSize is the size of the test's private /dev/shm mounts.
const testShmSize = 4 << 20

// mountTestShm is m's ShmMount with the test's size, unmounted (and
// removed) when the test ends, before its directory is.
func mountTestShm(t testing.TB, dir string) ShmMount {
	t.Helper()
	t.Cleanup(func() {
		if _, err := UnmountShm(dir, ""); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return ShmMount{Dir: dir, Size: testShmSize}
}

// shmEntry is the mount on top of path in a mountinfo file, or nil.
func shmEntry(t testing.TB, mountinfo, path string) *mountEntry {
	t.Helper()
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	return topOf(parseMountinfo(string(b)), path)
}

// The control daemon started through PrivateShm, and the servers it forks,
// have the instance's private /dev/shm (a tmpfs of its own, mounted on the
// instance's directory) as /dev/shm, in a mount namespace of their own;
// the test process (mpsd) keeps its own /dev/shm, only the tmpfs itself
// appears in its namespace, and no thread of it stays in the daemon's.
func TestPrivateShmDaemonAndServers(t *testing.T) {
	needRoot(t)
	ourNS := mntNS(t, "/proc/self/ns/mnt")
	hostShm := devIno(t, DevShm)
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		shm := ShmDirFor(cfg.PipeDir)
		base := filepath.Dir(shm)
		before := shmMounts(t, "/proc/self/mountinfo", base)
		cfg.Runner = PrivateShm(nil, mountTestShm(t, shm))
		in := start(t, cfg)
		fi, err := os.Lstat(shm)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Fatalf("instance shm dir %s: %v, %v; want a directory of mode 1777", shm, fi, err)
		}
		if err := IsShm(shm); err != nil {
			t.Fatalf("instance shm dir %s is no private /dev/shm mount: %v", shm, err)
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
			if m := shmEntry(t, proc+"/mountinfo", DevShm); m == nil || !m.isShm() || len(f) < 6 {
				t.Errorf("%s %d: /dev/shm mount %q, want the instance's tmpfs (%s)", who, pid, top, ShmSource)
			} else {
				for _, opt := range []string{"nosuid", "nodev", "noexec"} {
					if !slices.Contains(strings.Split(f[5], ","), opt) {
						t.Errorf("%s %d: /dev/shm mount %q lacks %s", who, pid, top, opt)
					}
				}
			}
		}
		// What the daemon side writes there lands in the instance's tmpfs.
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
		// In mpsd's namespace: the tmpfs on the instance's directory, and
		// nothing else.
		after := shmMounts(t, "/proc/self/mountinfo", base)
		var added []string
		for _, l := range after {
			if !slices.Contains(before, l) {
				added = append(added, l)
			}
		}
		if m := shmEntry(t, "/proc/self/mountinfo", shm); len(added) != 1 || m == nil || !m.isShm() {
			t.Errorf("mounts on /dev/shm or under %s in mpsd's namespace changed other than by the instance's tmpfs on %s:\nbefore %q\nafter  %q", base, shm, before, after)
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
	r := PrivateShm(rec, mountTestShm(t, shm))
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

// MountShm mounts a bounded tmpfs (mode 1777, this uid's; nosuid, nodev,
// noexec; size and inodes from the config) on the instance's directory,
// whose own mode drops to 0755 (an earlier mpsd's plain 1777 directory
// too, so a runtime that misses the mount gives pods nothing to write);
// it reuses the one there, resizes it, reports its usage, cleans it, and
// UnmountShm removes it with the directory and what an earlier mpsd left
// below it.
func TestMountShm(t *testing.T) {
	needRoot(t)
	base := shortTempDir(t)
	dir := filepath.Join(base, "g", "GPU-1", ShmDirName)
	// An earlier mpsd's plain private /dev/shm, with a tenant's file.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "left"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	under, err := os.Open(dir) // the directory below the mount, once mounted
	if err != nil {
		t.Fatal(err)
	}
	defer under.Close()
	m := mountTestShm(t, dir)
	if reused, err := MountShm(m); err != nil || reused {
		t.Fatalf("MountShm = %v, %v; want a new mount", reused, err)
	}
	if fi, err := under.Stat(); err != nil || fi.Mode() != os.ModeDir|0o755 {
		t.Errorf("the directory below the mount: %v %v; want mode 0755", fi.Mode(), err)
	}
	fi, err := os.Lstat(dir)
	if err != nil || fi.Mode() != os.ModeDir|os.ModeSticky|0o777 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("the mount's root: %v %v; want a root-owned directory of mode 1777", fi.Mode(), err)
	}
	e := shmEntry(t, "/proc/self/mountinfo", dir)
	if e == nil || !e.isShm() {
		t.Fatalf("no %s tmpfs on %s: %+v", ShmSource, dir, e)
	}
	line := mountLine(t, dir)
	for _, opt := range []string{"nosuid", "nodev", "noexec"} {
		if !slices.Contains(strings.Split(strings.Fields(line)[5], ","), opt) {
			t.Errorf("mount %q lacks %s", line, opt)
		}
	}
	u, err := ReadShmUsage(dir)
	if err != nil || u.Size != testShmSize || u.Used != 0 || u.Inodes != uint64(ShmInodes(testShmSize)) || u.Full() {
		t.Errorf("ReadShmUsage = %+v, %v; want %d bytes, %d inodes, empty", u, err, testShmSize, ShmInodes(testShmSize))
	}
	if _, err := os.Stat(filepath.Join(dir, "left")); err == nil {
		t.Errorf("the earlier directory's file shows in the tmpfs")
	}

	// Mounted once: the second call reuses it.
	if reused, err := MountShm(m); err != nil || !reused {
		t.Errorf("MountShm again = %v, %v; want the mount reused", reused, err)
	}
	if n := strings.Count(mountinfoText(t), " "+dir+" "); n != 1 {
		t.Errorf("%d mounts on %s; want 1", n, dir)
	}

	// Filled: no more than its size, then full; cleaned: empty again.
	big := make([]byte, 2*testShmSize)
	if err := os.WriteFile(filepath.Join(dir, "fill"), big, 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("writing %d bytes into a %d-byte private /dev/shm: %v, want ENOSPC", len(big), testShmSize, err)
	}
	// Directories take an inode each, no page: CleanShm removes them too.
	_ = os.MkdirAll(filepath.Join(dir, "d", "e"), 0o755)
	if u, err := ReadShmUsage(dir); err != nil || !u.Full() || u.Used != u.Size {
		t.Errorf("ReadShmUsage of the filled tmpfs = %+v, %v; want full", u, err)
	}
	if err := ResizeShm(dir, testShmSize/2); err == nil {
		t.Errorf("ResizeShm below what it holds succeeded")
	}
	if n, err := CleanShm(dir); err != nil || n < 1 {
		t.Errorf("CleanShm = %d, %v", n, err)
	}
	if u, err := ReadShmUsage(dir); err != nil || u.Used != 0 || u.Full() || u.InodesFree != u.Inodes-1 {
		t.Errorf("ReadShmUsage after CleanShm = %+v, %v; want empty", u, err)
	}
	if err := ResizeShm(dir, 2*testShmSize); err != nil {
		t.Fatal(err)
	}
	if u, err := ReadShmUsage(dir); err != nil || u.Size != 2*testShmSize || u.Inodes != uint64(ShmInodes(2*testShmSize)) {
		t.Errorf("ReadShmUsage after ResizeShm = %+v, %v", u, err)
	}
	if got, err := ShmMountsUnder(base); err != nil || !slices.Equal(got, []string{dir}) {
		t.Errorf("ShmMountsUnder = %q, %v; want [%s]", got, err, dir)
	}

	if unmounted, err := UnmountShm(dir, ""); err != nil || !unmounted {
		t.Fatalf("UnmountShm = %v, %v", unmounted, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after UnmountShm: %v; want it gone (with what an earlier mpsd left there)", dir, err)
	}
	if strings.Contains(mountinfoText(t), " "+dir+" ") {
		t.Errorf("%s is still mounted", dir)
	}
	if _, err := ReadShmUsage(dir); !errors.Is(err, ErrShmNotMounted) {
		t.Errorf("ReadShmUsage after UnmountShm: %v, want ErrShmNotMounted", err)
	}
	if unmounted, err := UnmountShm(dir, ""); err != nil || unmounted {
		t.Errorf("UnmountShm of nothing = %v, %v; want no error", unmounted, err)
	}
	// A plain directory, even on a tmpfs, is no private /dev/shm.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadShmUsage(dir); !errors.Is(err, ErrShmNotMounted) {
		t.Errorf("ReadShmUsage of a plain directory: %v, want ErrShmNotMounted", err)
	}
	if _, err := CleanShm(dir); !errors.Is(err, ErrShmNotMounted) {
		t.Errorf("CleanShm of a plain directory: %v, want ErrShmNotMounted", err)
	}
}

func mountinfoText(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mountLine is the mountinfo line of the mount on dir.
func mountLine(t testing.TB, dir string) string {
	t.Helper()
	for line := range strings.Lines(mountinfoText(t)) {
		if f := strings.Fields(line); len(f) > 5 && f[4] == dir {
			return strings.TrimSpace(line)
		}
	}
	t.Fatalf("no mount on %s", dir)
	return ""
}

// MountShm refuses a path a tenant could have prepared (a link, a file, a
// directory of another uid) and a mount point of anything else, and
// mounts nothing there or where a link points; UnmountShm and CleanShm
// leave a foreign mount alone; PrivateShm starts no daemon on a refused
// path nor one whose directories its /dev/shm would hide.
func TestMountShmRefuses(t *testing.T) {
	needRoot(t)
	base := shortTempDir(t)
	target := filepath.Join(base, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "b", "shm")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
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
	if err := os.Chmod(other, 0o777); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(base, "e", "shm")
	if err := os.MkdirAll(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("other", foreign, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(foreign, syscall.MNT_DETACH); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for _, p := range []string{link, file, other, foreign, "relative/shm"} {
		if _, err := MountShm(ShmMount{Dir: p, Size: testShmSize}); !errors.Is(err, ErrShmDir) {
			t.Errorf("MountShm(%s) = %v, want ErrShmDir", p, err)
			_, _ = UnmountShm(p, "")
		}
		// A refused directory is never bound on a daemon's /dev/shm.
		cmd := exec.Command("/bin/sh", "-c", "exit 0", "sh", "-d")
		if err := PrivateShm(nil, ShmMount{Dir: p, Size: testShmSize}).Start(cmd); !errors.Is(err, ErrShmDir) {
			t.Errorf("PrivateShm(%s).Start = %v, want ErrShmDir", p, err)
			if err == nil {
				_ = cmd.Wait()
			}
		}
	}
	if got, err := ShmMountsUnder(base); err != nil || len(got) != 0 {
		t.Errorf("private /dev/shm mounts under %s after the refusals: %q, %v", base, got, err)
	}
	if e := shmEntry(t, "/proc/self/mountinfo", target); e != nil {
		t.Errorf("something was mounted where the link points: %+v", e)
	}
	if _, err := UnmountShm(foreign, ""); !errors.Is(err, ErrShmDir) {
		t.Errorf("UnmountShm of a foreign mount: %v, want ErrShmDir", err)
	}
	if _, err := CleanShm(foreign); !errors.Is(err, ErrShmDir) {
		t.Errorf("CleanShm of a foreign mount: %v, want ErrShmDir", err)
	}
	if e := shmEntry(t, "/proc/self/mountinfo", foreign); e == nil || e.source != "other" {
		t.Errorf("the foreign mount on %s was touched: %+v", foreign, e)
	}
	if fi, err := os.Lstat(other); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("another uid's directory was changed: %v %v", fi, err)
	}
	// Nothing the daemon needs may lie under /dev/shm, which its own
	// hides; nothing is made or mounted there.
	dir := filepath.Join(base, "a", "shm")
	for _, tc := range []struct{ dir, env string }{
		{filepath.Join(DevShm, "mpsd-test-none", "shm"), ""},
		{dir, "CUDA_MPS_PIPE_DIRECTORY=" + DevShm + "/mpsd-test-none/pipe"},
		{dir, "CUDA_MPS_LOG_DIRECTORY=" + DevShm},
	} {
		cmd := exec.Command("/bin/sh", "-c", "exit 0", "sh", "-d")
		cmd.Env = []string{tc.env}
		if err := PrivateShm(nil, ShmMount{Dir: tc.dir, Size: testShmSize}).Start(cmd); !errors.Is(err, ErrShmDir) || !strings.Contains(err.Error(), "hides") {
			t.Errorf("PrivateShm(%s) with %q: %v, want ErrShmDir", tc.dir, tc.env, err)
			if err == nil {
				_ = cmd.Wait()
			}
		}
	}
	if _, err := os.Stat(filepath.Join(DevShm, "mpsd-test-none")); err == nil {
		t.Errorf("PrivateShm made a directory under %s", DevShm)
	}
	if _, err := os.Lstat(dir); err == nil {
		t.Errorf("PrivateShm made %s for a daemon it refused", dir)
	}
	if got := ShmDirFor("/run/mpsd/a/GPU-1/pipe/"); got != "/run/mpsd/a/GPU-1/shm" {
		t.Errorf("ShmDirFor = %s", got)
	}
}

func TestParseMountinfo(t *testing.T) {
	in := `22 1 0:21 / /run rw,nosuid shared:5 - tmpfs tmpfs rw,size=1024k
30 22 0:40 / /run/mpsd/g/GPU-1/shm rw,nosuid,nodev,noexec - tmpfs mpsd-shm rw,size=4096k,mode=1777
31 30 0:41 / /run/mpsd/g/GPU-1/shm rw - tmpfs other rw
32 22 0:42 / /run/a\040b rw master:3 - tmpfs mpsd-shm rw
bad line
`
	ms := parseMountinfo(in)
	if len(ms) != 4 {
		t.Fatalf("parsed %d entries, want 4: %+v", len(ms), ms)
	}
	if top := topOf(ms, "/run/mpsd/g/GPU-1/shm"); top == nil || top.id != 31 || top.isShm() {
		t.Errorf("top of a stack = %+v, want 31 (not a private /dev/shm)", top)
	}
	if ms[3].point != "/run/a b" || !ms[3].isShm() {
		t.Errorf("escaped mount point: %+v", ms[3])
	}
	if topOf(ms, "/nowhere") != nil {
		t.Errorf("a mount on /nowhere")
	}
}

func FuzzParseMountinfo(f *testing.F) {
	f.Add("30 22 0:40 / /run/x rw - tmpfs mpsd-shm rw\n")
	f.Add("1 2 3 4 5 6 - \\0")
	f.Fuzz(func(t *testing.T, s string) {
		for _, m := range parseMountinfo(s) {
			_ = topOf([]mountEntry{m}, m.point)
		}
	})
}

// MountShm from a process whose mount namespace is not the one pods'
// host paths resolve in (mpsd under systemd with ProtectSystem=: a slave
// copy of the host's) mounts the tmpfs in the namespace it names, where
// the container runtime sees it, and the process sees it through mount
// propagation; UnmountShm removes it from both. From a namespace that
// does not receive the host's mounts it fails and leaves no mount in
// either; where the path is another directory than the one prepared, it
// mounts nothing.
func TestMountShmInHostNamespace(t *testing.T) {
	needRoot(t)
	ourNS := mntNS(t, "/proc/self/ns/mnt")
	base := shortTempDir(t)
	// The host's run_dir: a shared mount, as / is under systemd.
	run := filepath.Join(base, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("mpsd-test", run, "tmpfs", 0, "size=1m,mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(run, syscall.MNT_DETACH); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := syscall.Mount("", run, "", syscall.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	host := fmt.Sprintf("/proc/%d/ns/mnt", os.Getpid())
	dir := filepath.Join(run, "g", "GPU-1", ShmDirName)
	hostMount := func() *mountEntry { return shmEntry(t, fmt.Sprintf("/proc/%d/mountinfo", os.Getpid()), dir) }
	t.Cleanup(func() {
		if _, err := UnmountShm(dir, ""); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	// inNS runs fn on a thread of its own in a new mount namespace whose
	// mounts are made prop (MS_SLAVE or MS_PRIVATE) after setup.
	inNS := func(prop uintptr, setup func() error, fn func()) {
		t.Helper()
		err := onDiscardedThread(func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
				return err
			}
			if setup != nil {
				if err := setup(); err != nil {
					return err
				}
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|prop, ""); err != nil {
				return err
			}
			fn()
			return nil
		})
		if err != nil {
			t.Fatalf("a thread in a namespace of its own: %v", err)
		}
	}

	// A slave of the host's, like systemd's.
	inNS(unix.MS_SLAVE, nil, func() {
		if _, err := MountShm(ShmMount{Dir: dir, Size: testShmSize, NS: host}); err != nil {
			t.Errorf("MountShm from a slave namespace: %v", err)
			return
		}
		if err := IsShm(dir); err != nil {
			t.Errorf("the slave namespace does not see the tmpfs: %v", err)
		}
		if m := hostMount(); m == nil || !m.isShm() {
			t.Errorf("the host's namespace has no tmpfs on %s: %+v", dir, m)
		}
		if unmounted, err := UnmountShm(dir, host); err != nil || !unmounted {
			t.Errorf("UnmountShm from the slave namespace = %v, %v", unmounted, err)
		}
		if err := IsShm(dir); !errors.Is(err, ErrShmNotMounted) {
			t.Errorf("the slave namespace still sees a mount on %s: %v", dir, err)
		}
	})
	if m := hostMount(); m != nil {
		t.Errorf("the host's namespace still has a mount on %s: %+v", dir, m)
	}

	// A namespace the host's mounts do not reach.
	inNS(unix.MS_PRIVATE, nil, func() {
		_, err := MountShm(ShmMount{Dir: dir, Size: testShmSize, NS: host})
		if !errors.Is(err, ErrShmDir) || !strings.Contains(err.Error(), "propagation") {
			t.Errorf("MountShm from a namespace the host's mounts do not reach: %v, want ErrShmDir naming propagation", err)
		}
		if top, _ := topMountAt(dir); top != nil {
			t.Errorf("a mount on %s in the private namespace: %+v", dir, top)
		}
	})
	if m := hostMount(); m != nil {
		t.Errorf("the failed MountShm left a mount on %s in the host's namespace: %+v", dir, m)
	}

	// A namespace where the path is another directory.
	inNS(unix.MS_SLAVE, func() error {
		if err := unix.Mount("other", filepath.Join(run, "g"), "tmpfs", 0, "size=1m,mode=0755"); err != nil {
			return err
		}
		return os.MkdirAll(dir, 0o755)
	}, func() {
		if _, err := MountShm(ShmMount{Dir: dir, Size: testShmSize, NS: host}); !errors.Is(err, ErrShmDir) || !strings.Contains(err.Error(), "not the directory") {
			t.Errorf("MountShm where the host's path is another directory: %v, want ErrShmDir", err)
		}
		if top, _ := topMountAt(dir); top != nil {
			t.Errorf("a mount on %s: %+v", dir, top)
		}
	})
	if m := hostMount(); m != nil {
		t.Errorf("a mount on %s in the host's namespace: %+v", dir, m)
	}
	waitThreadsInNS(t, ourNS)
}
