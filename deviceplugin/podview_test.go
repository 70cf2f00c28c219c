package deviceplugin

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
	"github.com/mpsd/mpsd/mps"
)

// attackerUID is the uid the pod's processes run as in the pod-view tests.
const attackerUID = 64250

// checkPodMounts asserts a container's mounts: the pipe directory
// read-only, its log FIFO, pid file and control_lock masked read-only with
// /dev/null right after it, and
// the instance's private shared-memory directory (a root-owned 1777
// tmpfs of its own) at /dev/shm; never the host's /dev/shm, and nothing else.
func checkPodMounts(t *testing.T, resp *pluginapi.ContainerAllocateResponse, pipe, shm string) {
	t.Helper()
	var got []string
	for _, mt := range resp.Mounts {
		got = append(got, fmt.Sprintf("%s:%s ro=%v", mt.HostPath, mt.ContainerPath, mt.ReadOnly))
		if mt.HostPath == "/dev/shm" {
			t.Errorf("the host's /dev/shm is mounted into the pod (at %s)", mt.ContainerPath)
		}
	}
	want := []string{
		pipe + ":" + pipe + " ro=true",
		"/dev/null:" + filepath.Join(pipe, "log") + " ro=true",
		"/dev/null:" + filepath.Join(pipe, "nvidia-cuda-mps-control.pid") + " ro=true",
		"/dev/null:" + filepath.Join(pipe, "control_lock") + " ro=true",
		shm + ":/dev/shm ro=false",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mounts\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	fi, err := os.Lstat(shm)
	if err != nil || fi.Mode() != os.ModeDir|os.ModeSticky|0o777 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("instance shm dir %s: %v %v; want a root-owned directory of mode 1777", shm, fi, err)
	}
	if err := mps.IsShm(shm); err != nil {
		t.Errorf("instance shm dir %s is not a tmpfs of its own: %v", shm, err)
	}
}

// podView builds a pod's view of mounts, as runc would, in a mount
// namespace of its own: a fresh tmpfs at root stands for the container's
// root file system, and each mount is bound at root+ContainerPath in the
// order the CRI runtimes give runc (stably sorted by the depth of the
// destination, as containerd and CRI-O do), read-only where asked. fn runs
// on the thread that owns the namespace, and processes it starts live in
// the pod's view. Nothing of it reaches the test's namespace: the mounts
// are slaves there, and the namespace goes with the thread, which is never
// given back to the runtime.
func podView(t *testing.T, mounts []*pluginapi.Mount, fn func(root string)) {
	t.Helper()
	// Under /tmp itself: the pod's uid must reach it, as it reaches a
	// container's root.
	root, err := os.MkdirTemp("", "podview")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sorted := slices.Clone(mounts)
	slices.SortStableFunc(sorted, func(a, b *pluginapi.Mount) int {
		return strings.Count(filepath.Clean(a.ContainerPath), "/") - strings.Count(filepath.Clean(b.ContainerPath), "/")
	})
	build := func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return fmt.Errorf("make mounts slaves: %w", err)
		}
		if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("the pod's root: %w", err)
		}
		for _, mt := range sorted {
			dst := filepath.Join(root, mt.ContainerPath)
			if _, err := os.Lstat(dst); err != nil {
				fi, err := os.Stat(mt.HostPath)
				if err != nil {
					return err
				}
				if fi.IsDir() {
					err = os.MkdirAll(dst, 0o755)
				} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
					err = os.WriteFile(dst, nil, 0o644)
				}
				if err != nil {
					return err
				}
			}
			if err := unix.Mount(mt.HostPath, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("bind %s on %s: %w", mt.HostPath, dst, err)
			}
			if mt.ReadOnly {
				if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
					return fmt.Errorf("remount %s read-only: %w", dst, err)
				}
			}
		}
		fn(root)
		return nil
	}
	errc := make(chan error, 1)
	var run func()
	run = func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread cannot be discarded: hold it, use another.
			defer runtime.UnlockOSThread()
			go run()
			return
		}
		errc <- build()
	}
	go run()
	if err := <-errc; err != nil {
		t.Fatalf("pod view: %v", err)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), root) {
		t.Errorf("a mount of the pod view leaked into the test's namespace:\n%s", b)
	}
}

// runAs runs a shell script as uid (gid the same, no supplementary
// groups), with stdin, from the calling thread (inside a pod view, in it).
func runAs(uid uint32, stdin []byte, script string, args ...string) (string, error) {
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "sh"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func devIno(t testing.TB, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// waitFile waits until path contains s.
func waitFile(t *testing.T, path, s string) bool {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if b, _ := os.ReadFile(path); strings.Contains(string(b), s) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A pod plays the attacker (uid 64250) with exactly the mounts Allocate
// gives it, built as runc builds them: /dev/shm there is its instance's
// private directory, not the host's and not another group's; a record it
// writes into <pipe>/log never reaches the daemon's log FIFO (control.log),
// and the pid file keeps its contents. The same write through the mounts
// without the masks (what pods got before) does reach control.log.
func TestPodViewIsolatesShmAndLogFIFO(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount namespaces, bind mounts, another uid")
	}
	m := newMPSD(t, twoGroups)
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	runPlugin(t, m, dir)
	pcs := k.waitRegistered("mpsd.io/a-sm", "mpsd.io/b-sm")
	pcs["mpsd.io/a-sm"].waitList(t, "a healthy", allHealthy)
	pcs["mpsd.io/b-sm"].waitList(t, "b healthy", allHealthy)
	st := m.waitStatus("status", func(api.Status) bool { return true })
	in, _ := findInstance(st, "a", 1)
	inB, _ := findInstance(st, "b", 1)

	// Two groups' pods on the same GPU get different shm dirs.
	_, respA, err := allocate(t, pcs["mpsd.io/a-sm"], ids("a", 1, seq(0, 99)...), 10)
	if err != nil {
		t.Fatalf("Allocate a: %v", err)
	}
	_, respB, err := allocate(t, pcs["mpsd.io/b-sm"], ids("b", 1, seq(0, 49)...), 10)
	if err != nil {
		t.Fatalf("Allocate b: %v", err)
	}
	pipeA, pipeB := respA.Envs[api.EnvPipeDirectory], respB.Envs[api.EnvPipeDirectory]
	shmA := filepath.Join(m.dir, "run", "a", in.GPUUUID, "shm")
	shmB := filepath.Join(m.dir, "run", "b", inB.GPUUUID, "shm")
	checkPodMounts(t, respA, pipeA, shmA)
	checkPodMounts(t, respB, pipeB, shmB)
	if shmA == shmB || devIno(t, shmA) == devIno(t, shmB) {
		t.Fatalf("groups a and b share the shm dir %s", shmA)
	}

	// Shared memory the host and group b have; what a's pod must not see.
	hostSeg := filepath.Join("/dev/shm", fmt.Sprintf("mpsd-test-host-%d", os.Getpid()))
	if err := os.WriteFile(hostSeg, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(hostSeg) })
	if err := os.WriteFile(filepath.Join(shmB, "b-seg"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(pipeA, "nvidia-cuda-mps-control.pid")
	pidBefore, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	controlLog := filepath.Join(m.dir, "log", "a", in.GPUUUID, "control.log")
	forged := func(marker string) []byte {
		return mpslog.Record{Kind: mpslog.Control, PID: 1, Time: time.Now(), Msg: "forged by a pod " + marker}.Encode()
	}
	masked := fmt.Sprintf("masked-%d", time.Now().UnixNano())

	podView(t, respA.Mounts, func(root string) {
		if got, want := devIno(t, filepath.Join(root, "dev/shm")), devIno(t, shmA); got != want {
			t.Errorf("the pod's /dev/shm is %s, want its instance's %s (%s)", got, shmA, want)
		}
		if out, err := runAs(attackerUID, nil, `ls -a "$1"`, filepath.Join(root, "dev/shm")); err != nil || strings.Contains(out, filepath.Base(hostSeg)) || strings.Contains(out, "b-seg") {
			t.Errorf("the pod's /dev/shm lists %q (%v): the host's or group b's shared memory", out, err)
		}
		// The pod writes a record into the log FIFO, and its own pid.
		if out, err := runAs(attackerUID, forged(masked), `cat > "$1"`, filepath.Join(root, pipeA, "log")); err != nil {
			t.Errorf("writing the pod's <pipe>/log (/dev/null there): %v %s", err, out)
		}
		if out, err := runAs(attackerUID, nil, `printf 4242 > "$1"`, filepath.Join(root, pidFile)); err != nil {
			t.Errorf("writing the pod's pid file (/dev/null there): %v %s", err, out)
		}
		if fi, err := os.Stat(filepath.Join(root, pipeA, "control")); err != nil || fi.Mode().Type() != os.ModeSocket {
			t.Errorf("the pod has no control socket: %v %v", fi, err)
		}
		// A pod's root can neither remove nor replace what is in the
		// pipe directory, nor take the daemon's lock.
		for _, name := range []string{"control", "control_lock"} {
			if out, err := runAs(0, nil, `rm -f "$1" 2>&1`, filepath.Join(root, pipeA, name)); err == nil {
				t.Errorf("the pod's root removed <pipe>/%s: %s", name, out)
			}
		}
		if out, err := runAs(0, nil, `: > "$1" 2>&1`, filepath.Join(root, pipeA, "planted")); err == nil {
			t.Errorf("the pod's root created a file in the pipe directory: %s", out)
		}
		// Connecting needs no write access to the mount: a client gets
		// through (this thread is in the pod's view).
		if c, err := net.Dial("unixpacket", filepath.Join(root, pipeA, "control")); err != nil {
			t.Errorf("the pod cannot connect to the control socket on its read-only mount: %v", err)
		} else {
			c.Close()
		}
	})
	if fi, err := os.Lstat(filepath.Join(pipeA, "control")); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("the daemon's control socket after the pod's tries: %v %v", fi, err)
	}
	if holder, err := os.Stat(filepath.Join(pipeA, "control_lock")); err != nil || !holder.Mode().IsRegular() {
		t.Errorf("the daemon's control_lock after the pod's tries: %v %v", holder, err)
	}
	if _, err := os.Lstat(filepath.Join(pipeA, "planted")); err == nil {
		t.Errorf("a file the pod planted is in the pipe directory")
	}
	// A record written after the pod's through the daemon's real FIFO
	// reaches control.log; the FIFO keeps order, so had the pod's reached
	// it, it would be there first.
	after := fmt.Sprintf("after-%d", time.Now().UnixNano())
	if err := mpslog.SendFIFO(filepath.Join(pipeA, "log"), mpslog.Record{Kind: mpslog.Control, PID: 1, Time: time.Now(), Msg: "test record " + after}); err != nil {
		t.Fatal(err)
	}
	if !waitFile(t, controlLog, after) {
		t.Fatalf("the daemon did not copy a record from its FIFO into %s", controlLog)
	}
	if b, _ := os.ReadFile(controlLog); strings.Contains(string(b), masked) {
		t.Errorf("a record the pod wrote into <pipe>/log reached control.log:\n%s", b)
	}
	if b, _ := os.ReadFile(pidFile); !bytes.Equal(b, pidBefore) {
		t.Errorf("the pod rewrote the daemon's pid file: %q, was %q", b, pidBefore)
	}

	// Without the masks the same write goes through: the test plays a
	// real attack.
	var unmasked []*pluginapi.Mount
	for _, mt := range respA.Mounts {
		if mt.HostPath != maskSource {
			unmasked = append(unmasked, mt)
		}
	}
	open := fmt.Sprintf("unmasked-%d", time.Now().UnixNano())
	podView(t, unmasked, func(root string) {
		if out, err := runAs(attackerUID, forged(open), `cat > "$1"`, filepath.Join(root, pipeA, "log")); err != nil {
			t.Errorf("writing <pipe>/log without the masks: %v %s", err, out)
		}
	})
	if !waitFile(t, controlLog, open) {
		t.Errorf("without the masks the pod's record did not reach control.log either: the test does not play the attack")
	}
}

// An instance whose daemon does not have its private /dev/shm (a group
// mpsd does not serve to the kubelet, or a daemon adopted from an mpsd
// that did not) is refused, never given the host's /dev/shm: without
// the directory, with a plain directory (unbounded, on run_dir's file
// system), and with a tmpfs its daemon does not use.
func TestAllocateRefusesInstanceWithoutPrivateShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the daemons' private /dev/shm")
	}
	m := newMPSD(t, twoGroups, "--kubelet-groups", "a")
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	runPlugin(t, m, dir)
	pcs := k.waitRegistered("mpsd.io/a-sm", "mpsd.io/b-sm")
	pcs["mpsd.io/b-sm"].waitList(t, "b healthy", allHealthy)
	st := m.waitStatus("status", func(api.Status) bool { return true })
	inB, _ := findInstance(st, "b", 1)
	shmB := filepath.Join(m.dir, "run", "b", inB.GPUUUID, "shm")

	_, _, err := allocate(t, pcs["mpsd.io/b-sm"], ids("b", 1, seq(0, 49)...), 10)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "has no private /dev/shm") {
		t.Errorf("Allocate on an instance without its shm dir: %v, want FailedPrecondition", err)
	}
	// A plain 1777 directory (what an earlier mpsd made): unbounded, so
	// refused.
	if err := os.Mkdir(shmB, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shmB, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	_, _, err = allocate(t, pcs["mpsd.io/b-sm"], ids("b", 1, seq(0, 49)...), 10)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not a tmpfs of its own") {
		t.Errorf("Allocate on an instance whose private /dev/shm is a plain directory: %v, want FailedPrecondition", err)
	}
	// A tmpfs the daemon does not have as its /dev/shm.
	if _, err := mps.MountShm(mps.ShmMount{Dir: shmB, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	_, _, err = allocate(t, pcs["mpsd.io/b-sm"], ids("b", 1, seq(0, 49)...), 10)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not have") {
		t.Errorf("Allocate on an instance whose daemon has the host's /dev/shm: %v, want FailedPrecondition", err)
	}
	// A refused Allocate releases the lease it took (mpsd does so once
	// the plugin closes it): none may stay.
	m.waitStatus("the refused Allocates' leases released", func(st api.Status) bool { return len(st.Leases) == 0 })
	if _, _, err := allocate(t, pcs["mpsd.io/a-sm"], ids("a", 1, seq(0, 99)...), 10); err != nil {
		t.Errorf("Allocate on a served group: %v", err)
	}
}
