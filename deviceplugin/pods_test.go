package deviceplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
)

// fakeRuntime is the container runtime's CRI: its running containers,
// with the labels the kubelet gives them, and each one's first process.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	mu   sync.Mutex
	ctrs map[string]fakeContainer // by id
}

type fakeContainer struct {
	ref kubeinfo.ContainerRef
	pid int
}

func (f *fakeRuntime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &runtimeapi.ListContainersResponse{}
	for id, c := range f.ctrs {
		resp.Containers = append(resp.Containers, &runtimeapi.Container{Id: id, State: runtimeapi.ContainerState_CONTAINER_RUNNING,
			Metadata: &runtimeapi.ContainerMetadata{Name: c.ref.Container},
			Labels:   map[string]string{labelNamespaceKey: c.ref.Namespace, labelPodKey: c.ref.Pod, labelContainerKey: c.ref.Container}})
	}
	return resp, nil
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.ctrs[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %s not found", req.GetContainerId())
	}
	info, _ := json.Marshal(map[string]any{"pid": c.pid, "sandboxID": "s"})
	return &runtimeapi.ContainerStatusResponse{
		Status: &runtimeapi.ContainerStatus{Id: req.GetContainerId(), State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		Info:   map[string]string{"info": string(info)},
	}, nil
}

// The labels the kubelet puts on its containers (kubeinfo's).
const (
	labelNamespaceKey = "io.kubernetes.pod.namespace"
	labelPodKey       = "io.kubernetes.pod.name"
	labelContainerKey = "io.kubernetes.container.name"
)

func (f *fakeRuntime) add(id string, ref kubeinfo.ContainerRef, pid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctrs[id] = fakeContainer{ref: ref, pid: pid}
}

func (f *fakeRuntime) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ctrs, id)
}

func serveRuntime(t *testing.T, sock string) *fakeRuntime {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRuntime{ctrs: map[string]fakeContainer{}}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return f
}

// containerCgroup makes a cgroup named as containerd names a container's
// (cri-containerd-<id>.scope, under a parent of the test's own) in the
// unified hierarchy, or in v1's freezer where there is none, and returns
// its directory; cleanup kills what is left in it and removes it.
func containerCgroup(t *testing.T, id string) string {
	t.Helper()
	var mount string
	for _, m := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/freezer"} {
		var st unix.Statfs_t
		if unix.Statfs(m, &st) != nil {
			continue
		}
		if st.Type == unix.CGROUP2_SUPER_MAGIC || m == "/sys/fs/cgroup/freezer" && st.Type == unix.CGROUP_SUPER_MAGIC {
			mount = m
			break
		}
	}
	if mount == "" {
		t.Skip("no cgroup v2 or v1 freezer hierarchy mounted")
	}
	return emutest.ContainerCgroup(t, mount, testrun.CgroupName(fmt.Sprintf("podprocs-%d", os.Getpid())), id)
}

// podProc is a process of the test's pod.
type podProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error // its Wait's result, once it has ended
}

// waitOut waits until p has written s.
func (p *podProc) waitOut(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(p.out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("%v did not write %q within %s: %s", p.cmd.Args, s, waitFor, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *podProc) pid() int { return p.cmd.Process.Pid }

func (p *podProc) alive() bool { return syscall.Kill(p.pid(), 0) == nil }

// startAs starts cmd as uid, from the calling thread (inside a pod view,
// in it: not through testrun.Start, which starts from a thread of its
// own, and without a parent-death signal, as the pod view's thread ends
// once its function returns); it calls nothing of t, which is not the
// test's goroutine there. own ends it at the test's end.
func startAs(cmd *exec.Cmd, uid uint32) (*podProc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	cmd.Env = testrun.Env(cmd.Env)
	p := &podProc{cmd: cmd, out: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// own makes the test end p at its cleanup and moves p into the cgroup
// dir (none: ""), as the runtime starts a container's processes in its
// cgroup.
func own(t *testing.T, p *podProc, err error, dir string) *podProc {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		select {
		case err := <-p.done:
			p.done <- err
		case <-time.After(waitFor):
		}
	})
	if dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(p.pid())), 0); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// runPluginLogged is runPluginWith, with the plugin's log kept for the
// test to read.
func runPluginLogged(t *testing.T, m *mpsdProc, opts Options) *syncBuffer {
	t.Helper()
	logBuf := &syncBuffer{}
	opts.MPSD, opts.PollInterval, opts.ReleaseWait = m.client, 50*time.Millisecond, 5*time.Second
	opts.Logger = slog.New(slog.NewTextHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Plugin.Run: %v", err)
		}
		if t.Failed() {
			t.Logf("plugin log:\n%s", logBuf.String())
		}
	})
	return logBuf
}

// podGroup is a group served to pods as the examples serve them: one
// shared server (multiuser), memory in proportion to the units (one
// unit of 100: 1 % SM and 163 MiB), and a memory_grace short for a
// test.
const podGroup = `  a:
    users: ["UID"]
    gpus: ["0"]
    memory: 16G
    multiuser: true
    memory_grace: 1s
`

// A pod holding 1 unit (1 % SM, 163 MiB) plays the attacker the finding
// describes, as a real non-root uid: its CUDA process sets
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// to 12G itself and takes 2 GiB. The plugin binds the lease to the
// container holding the unit (the kubelet's PodResources API, then the
// runtime's CRI: the container's id and first process), and mpsd, which
// reads the container's cgroup from the kernel, holds its processes to
// the lease: past memory_grace the CUDA process is ended (terminate_client,
// then SIGKILL), the lease ends with the reason, naming the pod and the
// container (mpsd's log, the plugin's), and the plugin leases the units
// again and binds the new lease to the container, and to the container
// the kubelet starts in its place. The container's other
// process, which is no CUDA process, runs on; so does a process of the
// same uid outside the container that copied the lease's environment
// (MPSD_LEASE_ID and all): the environment decides nothing. Binding is
// root's alone, and a process in no cgroup named after the container is
// refused. Once the kubelet no longer lists the pod, its lease is
// released. Without the binding (what the plugin did before) the pod's
// process runs on with its 2 GiB: the test plays a real attack.
func TestPodOverMemoryEnded(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: cgroups, another uid")
	}
	m := newMPSD(t, podGroup)
	// The pod's uid reaches the pipe directory and mpsd's socket.
	if err := os.Chmod(m.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	podRes := servePodResources(t, filepath.Join(dir, "pod-resources.sock"))
	rt := serveRuntime(t, filepath.Join(dir, "cri.sock"))
	plog := runPluginLogged(t, m, Options{KubeletDir: dir, PodGoneAfter: time.Second, Pods: kubeinfo.Pods{
		PodResources: filepath.Join(dir, "pod-resources.sock"), Runtime: kubeinfo.Runtime{Socket: filepath.Join(dir, "cri.sock")}}})
	pc := k.waitRegistered("mpsd.io/a-sm")["mpsd.io/a-sm"]
	pc.waitList(t, "a healthy", allHealthy)

	units, resp, err := allocate(t, pc, ids("a", 0, seq(0, 99)...), 1)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	st := m.waitStatus("the pod's lease", func(st api.Status) bool { return len(st.Leases) == 1 })
	lease := st.Leases[0]
	if lease.SM != 1 || lease.MemBytes != 163<<20 {
		t.Fatalf("lease %+v; want 1 %% SM and 163 MiB", lease)
	}

	// The container: its first process (no CUDA), and its CUDA process,
	// whose environment the pod wrote itself.
	cid := fmt.Sprintf("%064x", time.Now().UnixNano())
	cg := containerCgroup(t, cid)
	ref := kubeinfo.ContainerRef{Namespace: "tenants", Pod: "greedy", Container: "cuda"}
	pause, err := startAs(exec.Command("sleep", "300"), attackerUID)
	own(t, pause, err, cg)
	// In the mount view Allocate gives the pod, with the pipe directory at
	// its own path, as in a container (the pod's uid cannot reach it
	// through the host's group directory, whose ACL admits members only).
	pipe := resp.Envs[api.EnvPipeDirectory]
	env := os.Environ()
	for k, v := range resp.Envs {
		env = append(env, k+"="+v)
	}
	env = append(env, api.EnvThreadPercentage+"=100", api.EnvPinnedMemLimit+"=0=12G")
	client := filepath.Join(emutest.BinDir(t), "mpsemu-client")
	var greedy, copier *podProc
	var greedyErr, copierErr error
	podView(t, resp.Mounts, func(root string) {
		groupDir := filepath.Dir(filepath.Dir(pipe))
		if greedyErr = unix.Mount("tmpfs", groupDir, "tmpfs", 0, "mode=0755"); greedyErr != nil {
			return
		}
		if greedyErr = os.MkdirAll(pipe, 0o755); greedyErr != nil {
			return
		}
		if greedyErr = unix.Mount(filepath.Join(root, pipe), pipe, "", unix.MS_BIND|unix.MS_REC, ""); greedyErr != nil {
			return
		}
		cmd := exec.Command(client, "--alloc", "2G", "--duration", "1m")
		cmd.Env = env
		greedy, greedyErr = startAs(cmd, attackerUID)
		// The same uid outside the container, with the lease's
		// environment.
		cmd = exec.Command(client, "--alloc", "1G", "--duration", "1m")
		cmd.Env = env
		copier, copierErr = startAs(cmd, attackerUID)
	})
	own(t, greedy, greedyErr, cg)
	own(t, copier, copierErr, "")
	greedy.waitOut(t, "allocated")
	copier.waitOut(t, "allocated")

	// Binding is root's: a pod's uid is refused, and so is a process in
	// no cgroup named after the container (a pid reused since, say).
	body := fmt.Sprintf(`{"namespace":"tenants","pod":"greedy","container":"cuda","container_id":"%s","pid":%d}`, cid, copier.pid())
	out, err := runAs(attackerUID, []byte(body), `exec curl -s --unix-socket "$1" -X POST --data-binary @- "http://mpsd$2"`, m.socket, api.PodPath(lease.ID))
	if err != nil || !strings.Contains(out, string(api.CodeForbidden)) {
		t.Errorf("a non-root caller's binding: %q %v; want it forbidden", out, err)
	}
	var ae *api.Error
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	err = m.client.BindPod(ctx, lease.ID, api.BindPodRequest{PodContainer: api.PodContainer{Namespace: ref.Namespace, Pod: ref.Pod, Container: ref.Container, ContainerID: cid}, PID: copier.pid()})
	if !errors.As(err, &ae) || ae.Code != api.CodeRefused {
		t.Errorf("binding to a process outside the container: %v; want it refused", err)
	}

	// The kubelet's record and the runtime's container: the plugin binds.
	podRes.add(ref.Namespace, ref.Pod, ref.Container, "mpsd.io/a-sm", units)
	rt.add(cid, ref, pause.pid())
	m.waitStatus("the lease bound to the container, its processes the lease's", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.ID == lease.ID && l.Pod != nil && l.Pod.ContainerID == cid && slices.Contains(l.PIDs, greedy.pid()) && slices.Contains(l.PIDs, pause.pid()) {
				return !slices.Contains(l.PIDs, copier.pid())
			}
		}
		return false
	})

	select {
	case err := <-greedy.done:
		greedy.done <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 90 && ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the pod's CUDA process: %v; want terminated (90) or killed", err)
		}
	case <-time.After(waitFor):
		t.Fatalf("the pod's CUDA process over its lease's memory still runs after %s", waitFor)
	}
	st = m.waitStatus("the old lease ended, a new one bound to the container", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].ID != lease.ID && st.Leases[0].Pod != nil && st.Leases[0].Pod.ContainerID == cid
	})
	if !pause.alive() {
		t.Errorf("the container's process that is no CUDA process was ended")
	}
	if !copier.alive() {
		t.Errorf("a process outside the container with the lease's environment was ended")
	}
	mlog, _ := os.ReadFile(m.log.Name())
	for _, want := range []string{
		`msg="pod over its lease's memory: its container's CUDA processes are ended"`,
		"lease=" + lease.ID, "namespace=tenants pod=greedy container=cuda container_id=" + cid,
	} {
		if !bytes.Contains(mlog, []byte(want)) {
			t.Errorf("mpsd's log has no %q", want)
		}
	}
	for _, want := range []string{"pod over its lease's limits", "namespace=tenants pod=greedy container=cuda", "memory limit exceeded", "code=" + string(api.CodeLimitExceeded)} {
		if !strings.Contains(plog.String(), want) {
			t.Errorf("the plugin's log has no %q", want)
		}
	}

	// The kubelet restarts the container: a new id, cgroup and first
	// process; the plugin binds the lease to it.
	renewed := st.Leases[0].ID
	cid2 := fmt.Sprintf("%064x", time.Now().UnixNano())
	pause2, err := startAs(exec.Command("sleep", "300"), attackerUID)
	own(t, pause2, err, containerCgroup(t, cid2))
	rt.remove(cid)
	rt.add(cid2, ref, pause2.pid())
	m.waitStatus("the lease bound to the restarted container", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].ID == renewed && st.Leases[0].Pod != nil && st.Leases[0].Pod.ContainerID == cid2 &&
			slices.Contains(st.Leases[0].PIDs, pause2.pid()) && !slices.Contains(st.Leases[0].PIDs, pause.pid())
	})

	// The pod ends: once the kubelet lists no container holding the units
	// for PodGoneAfter, the lease is released.
	podRes.mu.Lock()
	podRes.pods = nil
	podRes.mu.Unlock()
	m.waitStatus("the ended pod's lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
	if !strings.Contains(plog.String(), `msg="releasing lease: its pod has ended"`) {
		t.Errorf("the plugin's log does not say why it released the lease")
	}
}
