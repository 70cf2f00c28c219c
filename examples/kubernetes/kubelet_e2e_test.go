package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/mps"
)

// The kubelet end-to-end test runs a real kubelet (built by
// hack/build-kubelet.sh) in standalone mode on Debian's containerd and
// runc, with mpsd --simulate --kubelet-device-plugin on the example's
// config, run from its image (make package-image) as a static pod
// (mpsdpod_test.go), and pods of locally built images.
//
// The host is left as it was: the test re-executes its binary as PID 1 of
// a new PID namespace (every process it starts dies with it, containers
// too) in a private mount namespace, where the paths the kubelet and
// containerd write whatever their config says (/var/lib/kubelet/
// device-plugins, /var/log/pods, /run/containerd) are overlays whose
// upper layer is in the test's directory, and /proc/sys is read-only with
// the kubelet's kernel tunables shown at the values it wants (it would
// otherwise set vm.overcommit_memory, kernel.panic and
// kernel.panic_on_oops host-wide). Its cgroups live under a cgroup root of
// its own, removed at the end; its ports are free ones on 127.0.0.1.
const (
	// kubeletRequireEnv=1 (CI) makes a missing kubelet, containerd, runc,
	// static busybox or image archive a failure instead of a skip.
	kubeletRequireEnv = "MPSD_REQUIRE_KUBELET"
	// kubeletCacheEnv is hack/build-kubelet.sh's cache (the Makefile
	// exports it).
	kubeletCacheEnv = "MPSD_KUBELET_CACHE"
	// kubeletInitEnv and kubeletWorkEnv mark the re-executed test binary:
	// PID 1 of the namespace (init) and the test inside it (work dir).
	kubeletInitEnv = "MPSD_KUBELET_E2E_INIT"
	kubeletWorkEnv = "MPSD_KUBELET_E2E_WORK"
	// podUID runs the pods' processes (this test's uid range).
	podUID = 64600
	// nodeName is the kubelet's --hostname-override: static pods are
	// named <manifest name>-<nodeName>.
	nodeName = "mpsd-e2e"
	// Locally built images; nothing is ever pulled.
	busyboxImage = "mpsd-e2e.invalid/busybox:1"
	pauseImage   = "mpsd-e2e.invalid/pause:1"
)

// TestMain lets the re-executed binary be the namespace's init.
func TestMain(m *testing.M) {
	if os.Getenv(kubeletInitEnv) == "1" {
		os.Exit(kubeletInit())
	}
	os.Exit(m.Run())
}

// kubeletInit is PID 1 of the test's PID namespace: it runs the test
// (this binary again, same arguments) and reaps every process reparented
// to it until that test exits, with its status. When it returns the kernel
// kills whatever is left in the namespace.
func kubeletInit() int {
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, kubeletInitEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet e2e init: %v\n", err)
		return 1
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kubelet e2e init: wait: %v\n", err)
			return 1
		}
		if pid == cmd.Process.Pid {
			if ws.Exited() {
				return ws.ExitStatus()
			}
			fmt.Fprintf(os.Stderr, "kubelet e2e init: the test ended by %v\n", ws.Signal())
			return 1
		}
	}
}

// engines are the programs the test runs.
type engines struct {
	Kubelet, Containerd, Ctr, Runc, Busybox string
	MPSDBin, Emu                            string
	// Image is mpsd's image archive (make package-image).
	Image string
	// HostMPSD runs bin/mpsd as a process of the host instead of the
	// image's as a static pod.
	HostMPSD   bool
	CgroupRoot string // under every cgroup hierarchy
	// PodEmu holds a static mpsemu-client, which a pod's busybox image
	// can run.
	PodEmu string
	// The control plane's (controlplane_e2e_test.go): kube-apiserver and
	// etcd, kube-scheduler, kube-controller-manager, and containerd's
	// runc shim (a directory, put first in the PATH containerd gets).
	APIServer, Etcd, Scheduler, ControllerManager string
	ShimDir                                       string
	// CDI enables CDI in containerd's CRI with one spec directory,
	// cdiDir(work).
	CDI bool
}

// findEngines looks for the kubelet (in hack/build-kubelet.sh's cache),
// containerd, ctr and runc (Debian's packages), a static busybox
// (busybox-static) and mpsd's image archive ($MPSD_DIST_DIR, make
// package-image); without one the test skips, or fails when
// MPSD_REQUIRE_KUBELET=1.
func findEngines(t *testing.T) engines {
	t.Helper()
	missing := missingEngine(t, kubeletRequireEnv)
	e := findNode(t, missing)
	var err error
	if e.Image, err = findImage(); err != nil {
		missing("%v", err)
	}
	// An archive there is this checkout's, or the test would run an
	// older mpsd than it describes.
	img, err := readImageArchive(e.Image)
	if err != nil {
		t.Fatal(err)
	}
	now, err := stampNow()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkImageFresh(e.Image, img, now); err != nil {
		t.Fatal(err)
	}
	e.MPSDBin, e.Emu = emutest.CmdDir(t), emutest.BinDir(t)
	e.CgroupRoot = fmt.Sprintf("mpsd-kubelet-e2e-%d", os.Getpid())
	return e
}

// missingEngine is what a test does without one of its engines: skip,
// or fail when the environment variable require is 1 (CI).
func missingEngine(t *testing.T, require string) func(format string, args ...any) {
	return func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv(require) == "1" {
			t.Fatalf("%s (%s=1)", msg, require)
		}
		t.Skip(msg)
	}
}

// engineCache is the cache directory a hack/build-*.sh script uses: env
// when set (the Makefile exports it), else
// ${XDG_CACHE_HOME:-$HOME/.cache}/mpsd/name.
func engineCache(env, name string) string {
	if cache := os.Getenv(env); cache != "" {
		return cache
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "mpsd", name)
}

// findNode looks for what a node runs: root, the kubelet (in
// hack/build-kubelet.sh's cache), containerd, ctr and runc (Debian's
// packages), a static busybox (busybox-static) and the kernel's overlay
// filesystem, calling missing for the first it lacks.
func findNode(t *testing.T, missing func(format string, args ...any)) engines {
	t.Helper()
	if os.Geteuid() != 0 {
		missing("the kubelet end-to-end tests need root (namespaces, mounts, cgroups)")
	}
	var e engines
	e.Kubelet = filepath.Join(engineCache(kubeletCacheEnv, "kubelet"), "kubelet")
	if st, err := os.Stat(e.Kubelet); err != nil || st.Mode()&0o111 == 0 {
		missing("no kubelet at %s (run hack/build-kubelet.sh; make test does): %v", e.Kubelet, err)
	}
	look := func(name, pkg string) string {
		t.Helper()
		for _, dir := range append(filepath.SplitList(os.Getenv("PATH")), "/usr/sbin", "/usr/bin", "/sbin", "/bin") {
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return p
			}
		}
		missing("no %s (apt-get install %s)", name, pkg)
		return ""
	}
	e.Containerd = look("containerd", "containerd")
	e.Ctr = look("ctr", "containerd")
	e.Runc = look("runc", "runc")
	e.Busybox = look("busybox", "busybox-static")
	if !isStatic(e.Busybox) {
		missing("%s is not statically linked (apt-get install busybox-static)", e.Busybox)
	}
	if !hasFilesystem("overlay") {
		missing("the kernel has no overlay filesystem")
	}
	return e
}

func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

func hasFilesystem(name string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

// cgroupMounts are the mount points of the cgroup hierarchies.
func cgroupMounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(g) >= 1 && (g[0] == "cgroup" || g[0] == "cgroup2") {
			out = append(out, f[4])
		}
	}
	return out
}

// removeCgroupTree removes dir and the cgroups below it, deepest first,
// retrying while the killed processes leave them.
func removeCgroupTree(dir string) error {
	deadline := time.Now().Add(engineWait)
	for {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		var last error
		for _, d := range slices.Backward(dirs) {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				last = fmt.Errorf("rmdir %s: %w", d, err)
			}
		}
		if last == nil || time.Now().After(deadline) {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKubeletE2E: a real kubelet runs mpsd from its image as a static
// pod, offers mpsd's groups, admits a pod that fits (its container sees
// the lease's environment and mounts), refuses one that does not, keeps
// the allocation across a kubelet restart, and frees it when the pod is
// gone; a pod filling its /dev/shm fills only its instance's private
// tmpfs, which is gone once the instance stops. A restart of mpsd's
// container ends its MPS daemons (its children, in its cgroup: the
// runtime kills a hostPID container's every process with its first), so
// the new mpsd revokes the leases; an mpsd run on the host (systemd)
// keeps them across its restart, which the host run checks: the same
// test with bin/mpsd a process of the host, up to the kubelet's restart.
func TestKubeletE2E(t *testing.T) {
	if work := os.Getenv(kubeletWorkEnv); work != "" {
		kubeletInside(t, work, readEngines(t, work))
		return
	}
	e := findEngines(t)
	for _, host := range []bool{false, true} {
		name := map[bool]string{false: "pod", true: "host"}[host]
		t.Run(name, func(t *testing.T) {
			e := e
			e.HostMPSD, e.CgroupRoot = host, e.CgroupRoot+"-"+name
			kubeletOutside(t, e)
		})
	}
}

// kubeletOutside runs kubeletInside in its namespaces, with its own work
// directory and cgroup root, and removes them.
func kubeletOutside(t *testing.T, e engines) {
	work := workDir(t, "k8se") // short: MPS socket paths under it must fit a sockaddr_un
	cgroupRoot(t, e.CgroupRoot)
	e.PodEmu = staticClient(t, work)
	inNamespaces(t, "TestKubeletE2E", kubeletWorkEnv, work, e)
}

// workDir makes a test's work directory under the temp dir, named from
// prefix, and removes it when the test ends. The pods' uid reaches its
// own output directories through it.
func workDir(t *testing.T, prefix string) string {
	t.Helper()
	work, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(work); err != nil {
			t.Errorf("removing %s: %v", work, err)
		}
	})
	return work
}

// cgroupRoot makes the cgroup root name under every v1 hierarchy (the
// kubelet wants its cgroup root to exist) and removes it, with whatever
// is below it, in every hierarchy once the namespace (and so every
// process in those cgroups) is gone.
func cgroupRoot(t *testing.T, name string) {
	t.Helper()
	hierarchies := cgroupMounts()
	t.Cleanup(func() {
		for _, h := range hierarchies {
			if err := removeCgroupTree(filepath.Join(h, name)); err != nil {
				t.Errorf("cgroups left behind: %v", err)
			}
		}
	})
	for _, h := range hierarchies {
		if filepath.Base(h) == "unified" {
			continue // hybrid: the v1 controllers are the kubelet's
		}
		if err := os.Mkdir(filepath.Join(h, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// inNamespaces runs the test named test again, as the child of this
// binary as PID 1 (kubeletInit) of a new PID namespace, in a private
// mount namespace, with workEnv=work in its environment and e in
// work/engines.json, and fails t with its output if it fails. Every
// process it starts dies with it.
func inNamespaces(t *testing.T, test, workEnv, work string, e engines) {
	t.Helper()
	b, _ := json.Marshal(e)
	if err := os.WriteFile(filepath.Join(work, "engines.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1", "-test.timeout=7m")
	cmd.Env = append(os.Environ(), kubeletInitEnv+"=1", workEnv+"="+work)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:   syscall.CLONE_NEWPID,
		Unshareflags: syscall.CLONE_NEWNS, // and / made private (os/exec does it)
		Pdeathsig:    syscall.SIGKILL,
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	// Its own log with -v, everything on failure.
	if testing.Verbose() && err == nil {
		t.Logf("the test in its namespaces:\n%s", out.String())
	}
	if err != nil {
		t.Errorf("the test in its namespaces failed: %v\n%s", err, out.String())
	}
}

// readEngines is inNamespaces' e, read back in the namespaces.
func readEngines(t *testing.T, work string) engines {
	t.Helper()
	var e engines
	b, err := os.ReadFile(filepath.Join(work, "engines.json"))
	if err == nil {
		err = json.Unmarshal(b, &e)
	}
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// staticClient builds the emulator's CUDA client without cgo into a
// directory of work the pods' uid reaches: a pod's busybox image has no C
// library.
func staticClient(t *testing.T, work string) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	dir := filepath.Join(work, "emu")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "./internal/mpsemu/cmd/mpsemu-client")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build mpsemu-client: %v\n%s", err, b)
	}
	return dir
}

// kubeletInside is the test proper, in the namespaces.
func kubeletInside(t *testing.T, work string, e engines) {
	if os.Getpid() == 1 {
		t.Fatal("the test runs under the namespace's init, not as it")
	}
	isolateHost(t, work)
	began := time.Now()
	step := func(format string, args ...any) {
		t.Helper()
		t.Logf("%5.1fs "+format, append([]any{time.Since(began).Seconds()}, args...)...)
	}

	cfgDir := filepath.Join(work, "m")
	for _, d := range []string{cfgDir, filepath.Join(work, "manifests"), filepath.Join(work, "staging")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// run_dir is a tmpfs of its own, as /run is on a node: what the
	// instances' private /dev/shm take from it, or do not, is counted.
	runDir := filepath.Join(cfgDir, "run")
	if err := os.Mkdir(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("mpsd-e2e-run", runDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0755", runDirSize)); err != nil {
		t.Fatalf("mount a tmpfs on run_dir: %v", err)
	}

	ctrd := startContainerd(t, work, e)
	importImages(t, work, e, ctrd)
	image := importMPSDImage(t, e, ctrd)
	step("containerd up, images imported, mpsd's %s at %s", image.Name, image.Manifest)

	// The example's config on one simulated GPU, plus a second group on
	// it with half the SMs and a third with a tenth of them and a small
	// private /dev/shm (shm_size): three resources, 100, 50 and 10 units.
	// Their memory adds up to the simulated GPU's 40G.
	// Before each container holding units starts, mpsd's plugin finds it
	// through the kubelet's PodResources API and reads its pod's spec
	// from the API server: here a stand-in serving the kubelet's own view
	// of its static pods.
	var k *kubelet
	kubeconfig := podSpecServer(t, cfgDir, "node-token", func() ([]corev1.Pod, error) {
		if k == nil {
			return nil, errors.New("no kubelet yet")
		}
		return k.pods()
	})
	k = newKubelet(t, work, e, ctrd)
	// mpsd runs in a static pod of the kubelet, from its image; mpsctl
	// (bin/) reaches it on the host through the socket under cfgDir.
	m := &mpsdProc{t: t, bin: e.MPSDBin, pod: &mpsdPod{k: k, image: image,
		mounts: []string{work, "/var/lib/kubelet/device-plugins", "/sys/fs/cgroup", e.Emu}, propagate: work}, socket: filepath.Join(cfgDir, "mpsd.sock"), cfg: filepath.Join(cfgDir, "mpsd.yaml"), log: filepath.Join(work, "mpsd.log"),
		args: []string{"--kubelet-device-plugin", "--kubelet-dir", "/var/lib/kubelet/device-plugins",
			"--kubelet-kubeconfig", kubeconfig, "--kubelet-pod-resources", filepath.Join(work, "kubelet", "pod-resources", "kubelet.sock"),
			"--kubelet-cri", ctrd.socket}}
	cfg := exampleMPSDConfig(t, cfgDir, e.Emu, 1, `  training:
    users: [root]
    gpus: ["0"]
    sm_percent: 50
    memory: 7G
    multiuser: true
    memory_grace: 2s
  scratch:
    users: [root]
    gpus: ["0"]
    sm_percent: 10
    memory: 1G
    multiuser: true
    shm_size: `+strconv.Itoa(scratchShm>>20)+`M
`)
	// mpsd's metrics, for the count of pods ended over their memory.
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	if !strings.Contains(cfg, "  listen: \"\"\n") {
		t.Fatal("the test's mpsd.yaml has no metrics listen line")
	}
	cfg = strings.Replace(cfg, "  listen: \"\"\n", "  listen: "+metricsAddr+"\n", 1)
	m.pod.metrics = metricsAddr
	if err := os.WriteFile(m.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if e.HostMPSD {
		m.pod = nil
	}
	// The kubelet first: it runs mpsd's static pod.
	k.start()
	defer k.stop()
	step("kubelet up; mpsd (from its image: %v)", m.pod != nil)
	m.start()
	defer m.stop()
	step("mpsd ready")

	// Registration: one resource per group, a unit per SM percent.
	step("waiting for the plugin's registration")
	k.waitAllocatable(map[string]int{"mpsd.io/inference-sm": 100, "mpsd.io/training-sm": 50, "mpsd.io/scratch-sm": 10})

	// The example pod's 30 units are admitted; the container has the
	// lease's environment and mounts.
	resource, units := examplePodRequest(t)
	step("registered; pod asking %d %s", units, resource)
	podA := k.writePod("sm30", resource, units)
	k.waitRunning(podA)
	env, mounts := k.podOutput(podA)
	st := m.waitStatus("the pod's lease", func(st api.Status) bool { return len(st.Leases) == 1 })
	lease := st.Leases[0]
	if lease.Group != "inference" || lease.SM != units || lease.State != api.LeaseRunning || lease.UID != 0 {
		t.Errorf("lease %+v; want inference, %d SM, running, the plugin's (root)", lease, units)
	}
	pipe := filepath.Join(cfgDir, "run", lease.Group, gpu.SimUUID(0), "pipe")
	checkLeaseEnv(t, env, lease, pipe)
	checkLeaseMounts(t, mounts, pipe)
	// The plugin binds the lease to the pod's container (PodResources,
	// then containerd's CRI): its processes are the lease's.
	st = m.waitStatus("the pod's lease bound to its container", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].Pod != nil && len(st.Leases[0].PIDs) > 0
	})
	bound := st.Leases[0].Pod
	if bound.Namespace != "default" || bound.Pod != podA || bound.Container != "main" || len(bound.ContainerID) != 64 {
		t.Errorf("the pod's lease is bound to %+v; want default/%s container main", bound, podA)
	}
	// The check lets a container start that runs as a non-root uid and
	// cannot gain root (allowPrivilegeEscalation: false): on this runtime
	// its process has no capabilities (a non-root execve drops them), so it
	// cannot setuid(0) either.
	k.checkNonRoot(podA)

	// More than is free (100 - 30): the kubelet refuses it.
	step("pod running with lease %s; pod asking 80", lease.ID)
	podB := k.writePod("sm80", resource, 80)
	p := k.waitPod(podB, "refused", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	// The kubelet's own count refuses it, before any Allocate.
	refusal := fmt.Sprintf("requested number of devices unavailable for %s. Requested: 80, Available: %d", resource, 100-units)
	if p.Status.Reason != "UnexpectedAdmissionError" || !strings.Contains(p.Status.Message, refusal) {
		t.Errorf("pod asking 80 of %d free units: %s %q; want UnexpectedAdmissionError with %q", 100-units, p.Status.Reason, p.Status.Message, refusal)
	}
	if st, err := m.status(); err != nil || len(st.Leases) != 1 {
		t.Errorf("after the refused pod: leases %+v, %v; want the first pod's only", st.Leases, err)
	}
	k.deletePod(podB)

	// Deleting the pod frees its units: the plugin releases its lease
	// (the pod has ended, or the next allocation hands its units out
	// again), so 80 units fit now. Both runs check it before mpsd
	// restarts, which in the pod run revokes every lease.
	step("refused; deleting the pod, then asking 80")
	k.deletePod(podA)
	podC := k.writePod("sm80b", resource, 80)
	k.waitRunning(podC)
	step("second pod running")
	// Both logs say so: the plugin's release and mpsd's end of the lease.
	st = m.waitStatus("the deleted pod's lease released by the plugin, the new pod's running and bound to its container", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].ID != lease.ID && st.Leases[0].SM == 80 &&
			st.Leases[0].Pod != nil && st.Leases[0].Pod.Pod == podC && len(st.Leases[0].PIDs) > 0 &&
			m.logLine(`msg="releasing lease: `, "component=deviceplugin", "lease="+lease.ID) &&
			m.logLine(`msg="lease released"`, "lease="+lease.ID)
	})
	envC, _ := k.podOutput(podC)
	if envC[api.EnvLeaseID] != st.Leases[0].ID || envC[api.EnvThreadPercentage] != "80" {
		t.Errorf("second pod's environment %v; want lease %s at 80%%", envC, st.Leases[0].ID)
	}
	// The restarts below keep this pod and its lease.
	lease, bound = st.Leases[0], st.Leases[0].Pod

	// An mpsd restart on the host keeps the allocation's lease (the
	// plugin adopts it).
	step("released; restarting mpsd")
	m.restart()
	leases := 1
	if m.pod == nil {
		// Kept by mpsd, and held again by the new plugin (else mpsd would
		// release it once its reconnect grace ran out).
		// The new mpsd knows no binding until the plugin makes it again.
		m.waitStatus("the pod's lease kept across mpsd's restart, resumed by its plugin and bound to its container again", func(st api.Status) bool {
			return len(st.Leases) == 1 && st.Leases[0].ID == lease.ID && st.Leases[0].State == api.LeaseRunning &&
				m.logLine(`msg="lease resumed"`, "component=deviceplugin", "lease="+lease.ID) &&
				st.Leases[0].Pod != nil && *st.Leases[0].Pod == *bound
		})
	} else {
		// mpsd's container restarted (SIGTERM, then the kubelet's
		// restartPolicy): its MPS daemons ended with it, as the
		// DaemonSet's comment says, so the new mpsd starts new ones and
		// revokes the lease, saying why; the pod runs on (its CUDA
		// clients, had it any, would have failed).
		m.waitStatus("the pod's lease revoked by the restarted mpsd, its instance ready again", func(st api.Status) bool {
			return len(st.Leases) == 0 && allReady(st)
		})
		if !m.logLine(`msg="lease revoked"`, "lease="+lease.ID, "was gone or hung when mpsd started") {
			t.Errorf("the restarted mpsd's log does not say why it revoked lease %s", lease.ID)
		}
		leases = 0
	}
	k.waitAllocatable(map[string]int{"mpsd.io/inference-sm": 100, "mpsd.io/training-sm": 50, "mpsd.io/scratch-sm": 10})

	// A kubelet restart: the plugin registers again; the pod runs on.
	step("mpsd restarted; restarting the kubelet")
	k.stop()
	k.start()
	k.waitAllocatable(map[string]int{"mpsd.io/inference-sm": 100, "mpsd.io/training-sm": 50, "mpsd.io/scratch-sm": 10})
	for _, r := range []string{"mpsd.io/inference-sm", "mpsd.io/training-sm", "mpsd.io/scratch-sm"} {
		if k.logCount(`"Got registration request from device plugin with resource" resourceName="`+r+`"`) == 0 {
			t.Errorf("the restarted kubelet's log has no registration of %s", r)
		}
	}
	if p := k.waitRunning(podC); p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod's container restarted: %+v", p.Status.ContainerStatuses[0])
	}
	// mpsd's container runs on across the kubelet's restart.
	if m.pod != nil {
		if p := k.waitPod(m.pod.podName(), "running", func(p *corev1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
		}); p.Status.ContainerStatuses[0].RestartCount != m.pod.restarts {
			t.Errorf("mpsd's container restarted with the kubelet: %+v", p.Status.ContainerStatuses[0])
		}
	}
	if st, err := m.status(); err != nil || len(st.Leases) != leases || (leases == 1 && st.Leases[0].ID != lease.ID) {
		t.Errorf("after the kubelet's restart: leases %+v, %v; want %d (%s)", st.Leases, err, leases, lease.ID)
	}
	if m.pod == nil {
		step("the kubelet restarted; the rest runs with mpsd in its static pod only")
		return
	}

	step("registered again; deleting the pod")
	k.deletePod(podC)

	// A pod whose container would run as uid 0 without a user namespace
	// (host root, to the shared daemon) is admitted and allocated, but
	// its container is never created: the kubelet's PreStartContainer
	// call fails with the plugin's reason, which the pod's status shows.
	step("pod deleted; a root pod")
	podR := k.writePodAs("root", "mpsd.io/training-sm", 10, "  securityContext:\n    runAsUser: 0\n")
	p = k.waitPod(podR, "refused before its container starts", func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return false
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w.Reason == "CreateContainerConfigError" && strings.Contains(w.Message, "refused")
	})
	if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, "PermissionDenied") || !strings.Contains(msg, "default/"+podR+" container main refused") || !strings.Contains(msg, "runAsUser: 0") {
		t.Errorf("the root pod's container is waiting with %q; want the plugin's refusal naming the pod, the container and why", msg)
	}
	if !m.logLine("container refused: it would run as host root", "pod="+podR, "container=main") {
		t.Errorf("mpsd's log does not report the refused container of %s", podR)
	}
	if _, err := os.Stat(filepath.Join(k.work, "out", "root", "env")); err == nil {
		t.Errorf("the root pod's container ran")
	}
	if st, err := m.status(); err != nil || !allReady(st) {
		t.Errorf("after the root pod: %+v, %v; want every instance ready (its daemon untouched)", st.Instances, err)
	}
	k.deletePod(podR)

	// A pod over its lease's memory: 1 unit of training (1 of 50: 143
	// MiB), whose CUDA process raises its own MPS limits (100 %, 12G)
	// and takes 2 GiB. The plugin binds the lease to the pod's container
	// (PodResources, then containerd's CRI), mpsd ends the container's
	// CUDA process past memory_grace, both logs name the pod and the
	// container, the metric counts it, and the kubelet restarts the
	// container (restartPolicy: Always); the plugin leases the units
	// again for it.
	step("root pod deleted; a pod over its lease's memory")
	podG := k.writeGreedyPod("greedy", "mpsd.io/training-sm", 1)
	st = m.waitStatus("the greedy pod's lease bound to its container", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.Group == "training" && l.Pod != nil && l.Pod.Pod == podG && l.Pod.Container == "main" && len(l.PIDs) > 0 {
				return true
			}
		}
		return false
	})
	var greedy api.LeaseStatus
	for _, l := range st.Leases {
		if l.Group == "training" {
			greedy = l
		}
	}
	if greedy.SM != 1 || greedy.MemBytes != 143<<20 {
		t.Errorf("the greedy pod's lease %+v; want 1 %% SM and 143 MiB", greedy)
	}
	step("lease %s bound to container %s; waiting for its end", greedy.ID, greedy.Pod.ContainerID)
	k.waitPod(podG, "restarted by the kubelet after mpsd ended its CUDA process", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
	})
	if !m.logLine(`msg="pod over its lease's memory: its container's CUDA processes are ended"`, "lease="+greedy.ID, "pod="+podG, "container=main", "container_id="+greedy.Pod.ContainerID) {
		t.Errorf("mpsd's log does not report the greedy pod's container ended")
	}
	if !m.logLine("pod over its lease's limits", "component=deviceplugin", "pod="+podG, "container=main", "memory limit exceeded") {
		t.Errorf("the plugin's log does not report the greedy pod's lease ended")
	}
	if v := metricValue(t, metricsAddr, `mpsd_pod_memory_exceeded_total{group="training"}`); v < 1 {
		t.Errorf("mpsd_pod_memory_exceeded_total{group=\"training\"} = %v, want 1 or more", v)
	}
	m.waitStatus("a new lease for the greedy pod's units, bound to its restarted container", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.Group == "training" && l.ID != greedy.ID && l.Pod != nil && l.Pod.Pod == podG && l.Pod.ContainerID != greedy.Pod.ContainerID {
				return true
			}
		}
		return false
	})
	if st, err := m.status(); err != nil || !allReady(st) {
		t.Errorf("after the greedy pod: %+v, %v; want every instance ready", st.Instances, err)
	}
	k.deletePod(podG)

	step("greedy pod deleted; a pod filling its /dev/shm")
	shmFull(t, step, m, k, metricsAddr, runDir)
	step("done")
}

const (
	// scratchShm is the scratch group's shm_size, and shmFill what its
	// pod writes into its /dev/shm: four times as much.
	scratchShm = 4 << 20
	shmFill    = 4 * scratchShm
	// runDirSize is the size of run_dir's tmpfs: room for the whole fill.
	runDirSize = 64 << 20
)

// shmFull: a pod filling its /dev/shm fills only its instance's private
// tmpfs, of the group's shm_size: its write fails with no space left, the
// tmpfs is full, run_dir's file system and the host's /dev/shm keep their
// space, and mpsd reports it full. mpsctl shutdown, which stops the
// instances for good (SIGTERM leaves them and their tmpfs to the next
// mpsd), unmounts it and removes its directory. It ends mpsd.
func shmFull(t *testing.T, step func(string, ...any), m *mpsdProc, k *kubelet, metricsAddr, runDir string) {
	t.Helper()
	shm := filepath.Join(runDir, "scratch", gpu.SimUUID(0), mps.ShmDirName)
	if u, err := mps.ReadShmUsage(shm); err != nil || u.Size != scratchShm || u.Used != 0 {
		t.Errorf("the scratch instance's private /dev/shm: %+v, %v; want an empty %d MiB tmpfs (the group's shm_size)", u, err, scratchShm>>20)
	}
	runFree, hostShmFree := freeBytes(t, runDir), freeBytes(t, mps.DevShm)
	pod := k.writePodRunning("shmfill", "mpsd.io/scratch-sm", 1, nonRootPod,
		fmt.Sprintf("dd if=/dev/zero of=/dev/shm/fill bs=1M count=%d 2> /out/dd.err; echo $? > /out/rc.tmp && mv /out/rc.tmp /out/rc && exec sleep 2147483647", shmFill>>20))
	out := filepath.Join(k.work, "out", "shmfill")
	k.d.wait("pod "+pod+"'s dd", func() (bool, string) {
		_, err := os.Stat(filepath.Join(out, "rc"))
		return err == nil, fmt.Sprint(err)
	})
	// (a) The write stopped at the tmpfs's size.
	rc, _ := os.ReadFile(filepath.Join(out, "rc"))
	ddErr, _ := os.ReadFile(filepath.Join(out, "dd.err"))
	if strings.TrimSpace(string(rc)) == "0" || !strings.Contains(string(ddErr), "No space left on device") {
		t.Errorf("the pod wrote %d MiB into its %d MiB /dev/shm: dd exited %q: %s; want no space left", shmFill>>20, scratchShm>>20, strings.TrimSpace(string(rc)), ddErr)
	}
	if fi, err := os.Stat(filepath.Join(shm, "fill")); err != nil || fi.Size() == 0 || fi.Size() > scratchShm || fi.Sys().(*syscall.Stat_t).Uid != podUID {
		t.Errorf("the pod's file in its instance's private /dev/shm: %v, %v; want up to %d MiB, of uid %d", fi, err, scratchShm>>20, podUID)
	}
	if u, err := mps.ReadShmUsage(shm); err != nil || !u.Full() || u.Size != scratchShm {
		t.Errorf("the instance's private /dev/shm after the pod filled it: %+v, %v; want its %d MiB full", u, err, scratchShm>>20)
	}
	// (b) Nothing of it went to run_dir's file system or the host's
	// /dev/shm (shared with the host: only a loss of half the fill counts).
	if after := freeBytes(t, runDir); after+(1<<20) < runFree {
		t.Errorf("run_dir's file system lost %d of its %d free bytes to the pod's /dev/shm", runFree-after, runFree)
	}
	if after := freeBytes(t, mps.DevShm); after+shmFill/2 < hostShmFree {
		t.Errorf("the host's /dev/shm lost %d of its %d free bytes while the pod filled its own", hostShmFree-after, hostShmFree)
	}
	first, _, _ := strings.Cut(string(ddErr), "\n")
	step("pod %s's dd stopped: %s; waiting for mpsd to report the instance's /dev/shm full", pod, first)
	// (c) mpsd reports it full (at its next check, a probe interval).
	labels := fmt.Sprintf(`{gpu=%q,gpu_index="0",group="scratch"}`, gpu.SimUUID(0))
	waitMetric(t, metricsAddr, "mpsd_shm_full"+labels, 1)
	if used, size := metricValue(t, metricsAddr, "mpsd_shm_used_bytes"+labels), metricValue(t, metricsAddr, "mpsd_shm_size_bytes"+labels); used != scratchShm || size != scratchShm {
		t.Errorf("mpsd_shm_used_bytes%s = %v, mpsd_shm_size_bytes = %v; want both %d", labels, used, size, scratchShm)
	}
	if !m.logLine(`msg="private /dev/shm full`, "dir="+shm) {
		t.Errorf("mpsd's log does not report %s full", shm)
	}
	// The pod ends; its lease lives on until the plugin takes the pod for
	// gone, and the tmpfs stays full with it.
	step("reported full; deleting the pod")
	k.deletePod(pod)
	if err := mps.IsShm(shm); err != nil {
		t.Errorf("the instance's private /dev/shm once its pod ended, its instance still running: %v; want it mounted", err)
	}

	// (d) The instances stop for good: the tmpfs is unmounted and its
	// directory removed.
	step("pod deleted; mpsctl shutdown")
	m.shutdown()
	if _, err := os.Lstat(shm); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after its instance stopped: lstat: %v; want it removed", shm, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], runDir+"/") {
			t.Errorf("still mounted under run_dir after mpsctl shutdown: %s", line)
		}
	}
	if !m.logLine(`msg="private /dev/shm unmounted and removed: the instance stopped"`, "dir="+shm) {
		t.Errorf("mpsd's log does not report %s unmounted and removed", shm)
	}
}

// freeBytes is what an unprivileged user may still write on the file
// system holding path.
func freeBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// waitMetric polls one series of mpsd's /metrics at addr until it is want.
func waitMetric(t *testing.T, addr, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(engineWait)
	for {
		v := metricValue(t, addr, series)
		if v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after %s; want %v", series, v, engineWait, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metricValue reads one series of mpsd's /metrics at addr; -1 when it is
// not there.
func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Errorf("mpsd's metrics: %v", err)
		return -1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("mpsd's metrics: %v", err)
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func allReady(st api.Status) bool {
	for _, in := range st.Instances {
		if in.State != api.InstanceReady {
			return false
		}
	}
	return len(st.Instances) > 0
}

// isolateHost makes the mount namespace the test's own: a fresh /proc for
// the PID namespace, /proc/sys read-only with the kubelet's tunables at
// the values it wants, and overlays over the directories the kubelet and
// containerd write whatever they are told.
func isolateHost(t *testing.T, work string) {
	t.Helper()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("mount /proc", unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""))
	must("bind /proc/sys", unix.Mount("/proc/sys", "/proc/sys", "", unix.MS_BIND|unix.MS_REC, ""))
	must("remount /proc/sys read-only", unix.Mount("", "/proc/sys", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""))
	// k8s.io/component-helpers/node/util/sysctl's values, which the
	// kubelet's container manager sets unless they are already so.
	fake := filepath.Join(work, "sysctl")
	must("mkdir", os.Mkdir(fake, 0o755))
	for name, val := range map[string]string{
		"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
		"kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000",
	} {
		f := filepath.Join(fake, strings.ReplaceAll(name, "/", "."))
		must("write "+f, os.WriteFile(f, []byte(val+"\n"), 0o444))
		target := filepath.Join("/proc/sys", name)
		must("bind "+target, unix.Mount(f, target, "", unix.MS_BIND, ""))
		must("remount "+target, unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""))
	}
	for i, dir := range []string{"/var/lib", "/var/log", "/run"} {
		base := filepath.Join(work, "overlay", strconv.Itoa(i))
		upper, wk := filepath.Join(base, "upper"), filepath.Join(base, "work")
		must("mkdir", os.MkdirAll(upper, 0o755))
		must("mkdir", os.MkdirAll(wk, 0o755))
		must("overlay "+dir, unix.Mount("overlay", dir, "overlay", 0, "lowerdir="+dir+",upperdir="+upper+",workdir="+wk))
	}
	must("mkdir device-plugins", os.MkdirAll("/var/lib/kubelet/device-plugins", 0o755))
	// The work dir is a shared mount, as a node's / is under systemd: the
	// runtime binds it into mpsd's container with HostToContainer
	// propagation (it refuses a private source), so the private /dev/shm
	// mpsd mounts under run_dir in this namespace show there too.
	must("bind the work dir", unix.Mount(work, work, "", unix.MS_BIND|unix.MS_REC, ""))
	must("share the work dir", unix.Mount("", work, "", unix.MS_SHARED|unix.MS_REC, ""))
}

// daemon is an engine process with its log.
type daemon struct {
	t    *testing.T
	name string
	log  string
	cmd  *exec.Cmd
	done chan error
}

func startDaemon(t *testing.T, name, log string, argv ...string) *daemon {
	t.Helper()
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := &daemon{t: t, name: name, log: log, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan error, 1)}
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func(c *exec.Cmd, done chan<- error) { done <- c.Wait() }(d.cmd, d.done)
	return d
}

// wait polls cond until it holds; the daemon exiting or the deadline
// fails the test with the daemon's log.
func (d *daemon) wait(what string, cond func() (bool, string)) {
	d.t.Helper()
	deadline := time.Now().Add(engineWait)
	for {
		ok, last := cond()
		if ok {
			return
		}
		select {
		case err := <-d.done:
			d.done <- err
			d.t.Fatalf("waiting for %s: %s exited: %v\n%s", what, d.name, err, tail(d.log, 6000))
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("waiting for %s: %s\n%s log:\n%s", what, last, d.name, tail(d.log, 6000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (d *daemon) stop() {
	d.t.Helper()
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(engineWait):
		_ = d.cmd.Process.Kill()
		<-d.done
		d.t.Errorf("%s did not stop within %s of SIGTERM", d.name, engineWait)
	}
	d.cmd = nil
}

type containerd struct {
	*daemon
	socket string
}

// cdiDir is the CDI spec directory of containerd's CRI with CDI enabled.
func cdiDir(work string) string { return filepath.Join(work, "cdi") }

// startContainerd runs containerd with the CRI plugin as ENGINES needs it
// here: oom_score_adj restricted (no CAP_SYS_RESOURCE), the local pause
// image, runc v2 with cgroupfs, everything under work; with e.CDI, CDI
// enabled with cdiDir(work) its one spec directory (containerd 1.7 and
// later). Its shim is the first containerd-shim-runc-v2 in the PATH.
func startContainerd(t *testing.T, work string, e engines) *containerd {
	t.Helper()
	dir := filepath.Join(work, "containerd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	cdi := ""
	if e.CDI {
		cdi = fmt.Sprintf("  enable_cdi = true\n  cdi_spec_dirs = [%q]\n", cdiDir(work))
	}
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
%[10]s
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %[9]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"),
		pauseImage, filepath.Join(dir, "cni-bin"), filepath.Join(dir, "cni-conf"), e.Runc, cdi)
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &containerd{daemon: startDaemon(t, "containerd", filepath.Join(work, "containerd.log"), e.Containerd, "--config", cfg), socket: sock}
	t.Cleanup(c.stop)
	c.wait("containerd's socket", func() (bool, string) {
		out, err := exec.Command(e.Ctr, "--address", sock, "version").CombinedOutput()
		return err == nil, fmt.Sprintf("ctr version: %v: %s", err, out)
	})
	return c
}

// importImages builds the busybox and pause images (one layer: a static
// busybox and its applets' links) as a `docker save` archive and imports
// it into the CRI's namespace.
func importImages(t *testing.T, work string, e engines, c *containerd) {
	t.Helper()
	bb, err := os.ReadFile(e.Busybox)
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	now := time.Unix(0, 0)
	add := func(h *tar.Header, body []byte) {
		h.ModTime = now
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))}, bb)
	for _, applet := range []string{"sh", "sleep", "cat", "env", "ls", "mv", "id", "dd"} {
		add(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
	}
	add(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerSum := sha256.Sum256(layer.Bytes())
	diffID := "sha256:" + hex.EncodeToString(layerSum[:])

	var archive bytes.Buffer
	aw := tar.NewWriter(&archive)
	file := func(name string, body []byte) {
		if err := aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := aw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	layerName := hex.EncodeToString(layerSum[:]) + "/layer.tar"
	file(layerName, layer.Bytes())
	type manifest struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var manifests []manifest
	for _, img := range []struct {
		tag string
		cmd []string
	}{
		{busyboxImage, []string{"/bin/sh"}},
		{pauseImage, []string{"/bin/busybox", "sleep", "2147483647"}},
	} {
		config, _ := json.Marshal(map[string]any{
			"architecture": "amd64", "os": "linux",
			"config": map[string]any{"Env": []string{"PATH=/bin"}, "Cmd": img.cmd},
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		})
		sum := sha256.Sum256(config)
		name := hex.EncodeToString(sum[:]) + ".json"
		file(name, config)
		manifests = append(manifests, manifest{Config: name, RepoTags: []string{img.tag}, Layers: []string{layerName}})
	}
	mj, _ := json.Marshal(manifests)
	file("manifest.json", mj)
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(work, "images.tar")
	if err := os.WriteFile(path, archive.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(e.Ctr, "--address", c.socket, "-n", "k8s.io", "images", "import", path).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	out, err := exec.Command(e.Ctr, "--address", c.socket, "-n", "k8s.io", "images", "ls", "-q").CombinedOutput()
	for _, img := range []string{busyboxImage, pauseImage} {
		if !strings.Contains(string(out), img) {
			t.Fatalf("image %s not imported: %v\n%s", img, err, out)
		}
	}
}

// kubelet is the kubelet in standalone mode (no API server: pods come
// from its static pod directory).
type kubelet struct {
	t        *testing.T
	e        engines
	work     string
	root     string
	config   string
	log      string
	manifest string
	roPort   int
	healthz  int
	ctrd     string // containerd's socket
	d        *daemon
	logStart int64 // where the current run's log begins
	// kubeconfig, when set, registers the kubelet as a node of that API
	// server; args are more of its flags.
	kubeconfig string
	args       []string
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newKubelet(t *testing.T, work string, e engines, c *containerd) *kubelet {
	t.Helper()
	k := &kubelet{t: t, e: e, work: work, root: filepath.Join(work, "kubelet"), log: filepath.Join(work, "kubelet.log"),
		manifest: filepath.Join(work, "manifests"), ctrd: c.socket, roPort: freePort(t), healthz: freePort(t)}
	if err := os.MkdirAll(k.root, 0o755); err != nil {
		t.Fatal(err)
	}
	k.config = filepath.Join(work, "kubelet.yaml")
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %s
fileCheckFrequency: 1s
syncFrequency: 5s
address: 127.0.0.1
port: %d
readOnlyPort: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupRoot: /%s
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
resolvConf: ""
podLogsDir: %s
volumePluginDir: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
`, k.manifest, freePort(t), k.roPort, k.healthz, c.socket, e.CgroupRoot, filepath.Join(work, "pod-logs"), filepath.Join(work, "volume-plugins"))
	if err := os.WriteFile(k.config, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *kubelet) start() {
	k.t.Helper()
	if fi, err := os.Stat(k.log); err == nil {
		k.logStart = fi.Size()
	}
	argv := []string{k.e.Kubelet, "--config", k.config, "--root-dir", k.root,
		"--cert-dir", filepath.Join(k.root, "pki"), "--hostname-override", nodeName, "--v", "2"}
	if k.kubeconfig != "" {
		argv = append(argv, "--kubeconfig", k.kubeconfig)
	}
	k.d = startDaemon(k.t, "kubelet", k.log, append(argv, k.args...)...)
	k.d.wait("the kubelet's healthz", func() (bool, string) {
		b, err := k.get(k.healthz, "/healthz")
		return err == nil && string(b) == "ok", fmt.Sprintf("healthz: %q, %v", b, err)
	})
}

func (k *kubelet) stop() {
	if k.d != nil {
		k.d.stop()
	}
}

// logCount counts the lines of the current run's log containing s.
func (k *kubelet) logCount(s string) int {
	b, err := os.ReadFile(k.log)
	if err != nil || int64(len(b)) < k.logStart {
		return 0
	}
	return strings.Count(string(b[k.logStart:]), s)
}

func (k *kubelet) get(port int, path string) ([]byte, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", path, resp.Status)
	}
	return b, err
}

// allocatable is what the kubelet's pod-resources API says it can hand
// out: devices per resource.
func (k *kubelet) allocatable() (map[string]int, error) {
	sock := filepath.Join(k.root, "pod-resources", "kubelet.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	if err != nil {
		return nil, err
	}
	got := map[string]int{}
	for _, d := range resp.GetDevices() {
		got[d.GetResourceName()] += len(d.GetDeviceIds())
	}
	return got, nil
}

// waitAllocatable waits until the plugin's resources are registered with
// want units each. The kubelet counts a resource only once its plugin has
// registered and listed its devices (a checkpointed one stays at zero
// until then).
func (k *kubelet) waitAllocatable(want map[string]int) {
	k.t.Helper()
	k.d.wait(fmt.Sprintf("the kubelet to offer %v", want), func() (bool, string) {
		got, err := k.allocatable()
		if err != nil {
			return false, err.Error()
		}
		for r, n := range want {
			if got[r] != n {
				return false, fmt.Sprintf("allocatable %v", got)
			}
		}
		return true, ""
	})
}

// examplePodRequest is the example pod's request: its resource and units.
func examplePodRequest(t *testing.T) (string, int) {
	t.Helper()
	o, problems := decode(readExamples(t))
	if len(problems) > 0 || len(o.pods) != 1 {
		t.Fatalf("examples: %v", problems)
	}
	for name, q := range o.pods[0].Spec.Containers[0].Resources.Limits {
		if strings.HasPrefix(string(name), "mpsd.io/") {
			return string(name), int(q.Value())
		}
	}
	t.Fatal("the example pod asks for no mpsd.io resource")
	return "", 0
}

// writePod writes a static pod asking units of resource, whose container
// records its environment and mounts in a directory of the work dir, and
// returns the pod's name as the kubelet names it. The file is renamed into
// place, so the kubelet never reads half of it.
func (k *kubelet) writePod(name, resource string, units int) string {
	k.t.Helper()
	return k.writePodAs(name, resource, units, nonRootPod)
}

// nonRootPod is the pods' securityContext (indented as under spec:): the
// pods' uid and group.
var nonRootPod = fmt.Sprintf("  securityContext:\n    runAsNonRoot: true\n    runAsUser: %[1]d\n    runAsGroup: %[1]d\n", podUID)

// writePodAs is writePod with the pod's securityContext (YAML indented as
// under spec:).
func (k *kubelet) writePodAs(name, resource string, units int, securityContext string) string {
	k.t.Helper()
	return k.writePodRunning(name, resource, units, securityContext,
		"env > /out/env.tmp && cat /proc/self/mountinfo > /out/mountinfo && grep ^Cap /proc/self/status > /out/caps && id -u > /out/uid && mv /out/env.tmp /out/env && exec sleep 2147483647")
}

// writePodRunning is writePodAs with the container's shell script, which
// has the pod's output directory as /out.
func (k *kubelet) writePodRunning(name, resource string, units int, securityContext, script string) string {
	k.t.Helper()
	cmd, err := json.Marshal([]string{"/bin/sh", "-c", script})
	if err != nil {
		k.t.Fatal(err)
	}
	out := filepath.Join(k.work, "out", name)
	if err := os.MkdirAll(out, 0o755); err != nil {
		k.t.Fatal(err)
	}
	if err := os.Chown(out, podUID, podUID); err != nil {
		k.t.Fatal(err)
	}
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
spec:
  hostNetwork: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
%[7]s  containers:
    - name: main
      image: %[3]s
      imagePullPolicy: Never
      securityContext:
        allowPrivilegeEscalation: false
      command: %[8]s
      resources:
        limits:
          %[4]s: %[5]d
      volumeMounts:
        - name: out
          mountPath: /out
  volumes:
    - name: out
      hostPath:
        path: %[6]s
        type: Directory
`, name, podUID, busyboxImage, resource, units, out, securityContext, cmd)
	staged := filepath.Join(k.work, "staging", name+".yaml")
	if err := os.WriteFile(staged, []byte(manifest), 0o644); err != nil {
		k.t.Fatal(err)
	}
	if err := os.Rename(staged, filepath.Join(k.manifest, name+".yaml")); err != nil {
		k.t.Fatal(err)
	}
	return name + "-" + nodeName
}

// writeGreedyPod writes a static pod of the pods' uid asking units of
// resource, whose container (restartPolicy: Always) runs the emulator's
// CUDA client with the MPS limits it set itself, 100 % SM and 12G, and
// takes 2 GiB. It shares the host's pid namespace only because the
// emulator's NVML reports the pid a client gives itself (NVIDIA's reports
// the host's).
func (k *kubelet) writeGreedyPod(name, resource string, units int) string {
	k.t.Helper()
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
spec:
  hostNetwork: true
  hostPID: true
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsNonRoot: true
    runAsUser: %[2]d
    runAsGroup: %[2]d
  containers:
    - name: main
      image: %[3]s
      imagePullPolicy: Never
      securityContext:
        allowPrivilegeEscalation: false
      command: ["/bin/sh", "-c", "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12G; exec /emu/mpsemu-client --alloc 2G --duration 1h"]
      resources:
        limits:
          %[4]s: %[5]d
      volumeMounts:
        - name: emu
          mountPath: /emu
          readOnly: true
  volumes:
    - name: emu
      hostPath:
        path: %[6]s
        type: Directory
`, name, podUID, busyboxImage, resource, units, k.e.PodEmu)
	staged := filepath.Join(k.work, "staging", name+".yaml")
	if err := os.WriteFile(staged, []byte(manifest), 0o644); err != nil {
		k.t.Fatal(err)
	}
	if err := os.Rename(staged, filepath.Join(k.manifest, name+".yaml")); err != nil {
		k.t.Fatal(err)
	}
	return name + "-" + nodeName
}

// deletePod removes a static pod's manifest and waits until the kubelet
// no longer lists the pod.
func (k *kubelet) deletePod(pod string) {
	k.t.Helper()
	name := strings.TrimSuffix(pod, "-"+nodeName)
	if err := os.Remove(filepath.Join(k.manifest, name+".yaml")); err != nil {
		k.t.Fatal(err)
	}
	k.d.wait("pod "+pod+" gone", func() (bool, string) {
		pods, err := k.pods()
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if p.Name == pod {
				return false, fmt.Sprintf("pod %s: %s", pod, p.Status.Phase)
			}
		}
		return true, ""
	})
	// Gone from the kubelet is not yet gone from the runtime: wait until
	// none of its containers (the sandbox's included) runs. Their records
	// stay until the kubelet's container GC, a minute or more later.
	ctr := func(args ...string) (string, error) {
		out, err := exec.Command(k.e.Ctr, append([]string{"--address", k.ctrd, "-n", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	k.d.wait("pod "+pod+"'s containers stopped", func() (bool, string) {
		ids, err := ctr("containers", "ls", "-q", `labels."io.kubernetes.pod.name"==`+pod)
		if err != nil {
			return false, fmt.Sprintf("ctr containers ls: %v: %s", err, ids)
		}
		tasks, err := ctr("tasks", "ls")
		if err != nil {
			return false, fmt.Sprintf("ctr tasks ls: %v: %s", err, tasks)
		}
		for _, line := range strings.Split(tasks, "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[2] == "RUNNING" && slices.Contains(strings.Fields(ids), f[0]) {
				return false, "still running: " + line
			}
		}
		return true, ""
	})
}

// pods is the kubelet's /pods (the read-only port): in standalone mode
// the static pods carry the status manager's status.
func (k *kubelet) pods() ([]corev1.Pod, error) {
	b, err := k.get(k.roPort, "/pods")
	if err != nil {
		return nil, err
	}
	var list corev1.PodList
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

func (k *kubelet) waitPod(pod, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	k.t.Helper()
	var found *corev1.Pod
	k.d.wait("pod "+pod+" "+what, func() (bool, string) {
		pods, err := k.pods()
		if err != nil {
			return false, err.Error()
		}
		for i := range pods {
			if pods[i].Name == pod {
				found = &pods[i]
				return cond(found), fmt.Sprintf("pod %s: %s %s %q", pod, found.Status.Phase, found.Status.Reason, found.Status.Message)
			}
		}
		return false, "pod " + pod + " not listed"
	})
	return found
}

func (k *kubelet) waitRunning(pod string) *corev1.Pod {
	k.t.Helper()
	return k.waitPod(pod, "running", func(p *corev1.Pod) bool {
		if p.Status.Phase == corev1.PodFailed {
			k.t.Fatalf("pod %s failed: %s %q", pod, p.Status.Reason, p.Status.Message)
		}
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
}

// checkNonRoot checks what the pod's container recorded of itself: its
// uid is the pods' and it has no effective, permitted or ambient
// capabilities.
func (k *kubelet) checkNonRoot(pod string) {
	k.t.Helper()
	out := filepath.Join(k.work, "out", strings.TrimSuffix(pod, "-"+nodeName))
	uid, err := os.ReadFile(filepath.Join(out, "uid"))
	if err != nil || strings.TrimSpace(string(uid)) != strconv.Itoa(podUID) {
		k.t.Errorf("pod %s's container runs as uid %q (%v), want %d", pod, uid, err, podUID)
	}
	caps, err := os.ReadFile(filepath.Join(out, "caps"))
	if err != nil {
		k.t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(caps)), "\n") {
		name, val, _ := strings.Cut(line, ":")
		if (name == "CapEff" || name == "CapPrm" || name == "CapAmb") && strings.Trim(strings.TrimSpace(val), "0") != "" {
			k.t.Errorf("pod %s's non-root container has %s", pod, line)
		}
	}
}

// podOutput is what the pod's container recorded: its environment and
// its /proc/self/mountinfo.
func (k *kubelet) podOutput(pod string) (map[string]string, string) {
	k.t.Helper()
	out := filepath.Join(k.work, "out", strings.TrimSuffix(pod, "-"+nodeName))
	k.d.wait("pod "+pod+"'s output", func() (bool, string) {
		_, err := os.Stat(filepath.Join(out, "env"))
		return err == nil, fmt.Sprint(err)
	})
	b, err := os.ReadFile(filepath.Join(out, "env"))
	if err != nil {
		k.t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	mi, err := os.ReadFile(filepath.Join(out, "mountinfo"))
	if err != nil {
		k.t.Fatal(err)
	}
	return env, string(mi)
}

// checkLeaseEnv: the container has the lease's MPS environment.
func checkLeaseEnv(t *testing.T, env map[string]string, l api.LeaseStatus, pipe string) {
	t.Helper()
	for k, want := range map[string]string{
		api.EnvLeaseID:           l.ID,
		api.EnvGroup:             l.Group,
		api.EnvThreadPercentage:  strconv.Itoa(l.SM),
		api.EnvPipeDirectory:     pipe,
		"NVIDIA_VISIBLE_DEVICES": gpu.SimUUID(0),
	} {
		if env[k] != want {
			t.Errorf("container's %s = %q; want %q", k, env[k], want)
		}
	}
	// 30 of the group's 32G budget in SM proportion, per GPU.
	if v := env[api.EnvPinnedMemLimit]; !strings.HasPrefix(v, "0=") && !strings.HasPrefix(v, gpu.SimUUID(0)+"=") {
		t.Errorf("container's %s = %q; want GPU 0's limit", api.EnvPinnedMemLimit, v)
	}
	if l.MemBytes <= 0 {
		t.Errorf("lease %s has no memory", l.ID)
	}
}

// checkLeaseMounts: the container has the instance's pipe directory pipe
// read-only, its log FIFO and pid file masked by /dev/null, and the
// instance's private shared memory (its tmpfs) as /dev/shm.
func checkLeaseMounts(t *testing.T, mountinfo, pipe string) {
	t.Helper()
	type mount struct{ root, opts, fstype, source string }
	mounts := map[string]mount{}
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 {
			m := mount{root: f[3], opts: f[5]}
			if i := slices.Index(f[6:], "-"); i >= 0 && 6+i+2 < len(f) {
				m.fstype, m.source = f[6+i+1], f[6+i+2]
			}
			mounts[f[4]] = m
		}
	}
	// A bind mount's root is its source's path in its filesystem: the
	// host path, or its end when the work dir is on a mount of its own.
	from := func(m mount, host string) bool { return m.root != "/" && strings.HasSuffix(host, m.root) }
	mp, ok := mounts[pipe]
	if !ok || !from(mp, pipe) || !slices.Contains(strings.Split(mp.opts, ","), "ro") {
		t.Errorf("pipe directory %s: mount %+v (present %v); want the instance's, read-only", pipe, mp, ok)
	}
	for _, masked := range []string{"log", "nvidia-cuda-mps-control.pid"} {
		m, ok := mounts[filepath.Join(pipe, masked)]
		if !ok || !strings.HasSuffix(m.root, "/null") {
			t.Errorf("%s in the pipe directory: mount %+v (present %v); want /dev/null over it", masked, m, ok)
		}
	}
	// The instance's private /dev/shm is a tmpfs of its own (mps.MountShm):
	// the pod gets its root.
	if m := mounts["/dev/shm"]; m.root != "/" || m.fstype != "tmpfs" || m.source != mps.ShmSource {
		t.Errorf("/dev/shm is %+v; want the instance's private tmpfs (%s) from %s", m, mps.ShmSource, mps.ShmDirFor(pipe))
	}
}
