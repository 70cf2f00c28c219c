package mpsd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
)

// podUID runs the pod's processes in these tests.
const podUID = 65010

// podCgroup makes a cgroup named as containerd names a container's
// (cri-containerd-<id>.scope) in mpsd's membership hierarchy, and moves
// the processes of cmds into it; cleanup kills what is left and removes
// it.
func (e *testEnv) podCgroup(t *testing.T, id string) string {
	t.Helper()
	return emutest.ContainerCgroup(t, e.cgroupMount(t), testrun.CgroupName(fmt.Sprintf("pod-%d", os.Getpid())), id)
}

func moveTo(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
}

// A lease of root (the kubelet device plugin's: no process of its own)
// bound to a pod's container (POST /v1/leases/{id}/pod) has that
// container's processes: status shows them and the container. A process
// of the container, a real non-root uid that raised its own MPS limits in
// its environment (100 % SM, 12G), holds 2 GiB on a lease of 160 MiB:
// past memory_grace mpsd ends it, logs the pod and the container, counts
// it (mpsd_pod_memory_exceeded_total), and ends the lease with
// CodeLimitExceeded naming them, not requeued. The container's process
// that is no CUDA process runs on, though a client outside the container
// gave MPS its pid (MPS then lists it as a client: unproven, it is never
// signalled). A binding to a process in no cgroup
// named after the container is refused.
func TestPodLeaseOverMemoryEnded(t *testing.T) {
	// The pod's uid reaches the pipe directory as a member (a group served
	// to the kubelet has it without an ACL instead).
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [root, %s]
    memory: 16G
    gpus: ["0"]
    multiuser: true
    memory_grace: 1s
`, emutest.User(t, podUID)), "")
	e.start()
	c := client.New(e.socket)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	zero := 0
	s, err := c.Lease(ctx, api.LeaseRequest{Group: "a", SM: 1, MemBytes: 160 << 20, GPUs: 1, RequeueAttempts: &zero, NoWait: true, JobID: "k8s"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var lease *api.Lease
	for lease == nil {
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == api.EventGranted {
			lease = ev.Lease
		}
	}

	cid := fmt.Sprintf("%064x", time.Now().UnixNano())
	cg := e.podCgroup(t, cid)
	pause := startProc(t, asUID(exec.Command("sleep", "300"), podUID))
	moveTo(t, cg, pause.pid())
	greedyCmd := asUID(exec.Command(filepath.Join(e.emu, "mpsemu-client"), "--alloc", "2G", "--duration", "1m"), podUID)
	greedyCmd.Env = os.Environ()
	for k, v := range lease.Env {
		greedyCmd.Env = append(greedyCmd.Env, k+"="+v)
	}
	greedyCmd.Env = append(greedyCmd.Env, api.EnvThreadPercentage+"=100", api.EnvPinnedMemLimit+"=0=12G")
	greedy := startProc(t, greedyCmd)
	moveTo(t, cg, greedy.pid())
	other := startProc(t, asUID(exec.Command("sleep", "300"), podUID))
	// A client outside the container that gives MPS the pid of the
	// container's process that is no CUDA process: MPS lists that pid as a
	// client, which proves nothing.
	claimCmd := asUID(exec.Command(filepath.Join(e.emu, "mpsemu-client"), "--claim-pid", strconv.Itoa(pause.pid()), "--duration", "1m"), podUID)
	claimCmd.Env = greedyCmd.Env
	claimer := startProc(t, claimCmd)

	pod := api.PodContainer{Namespace: "tenants", Pod: "greedy", Container: "cuda", ContainerID: cid}
	var ae *api.Error
	if err := c.BindPod(ctx, lease.ID, api.BindPodRequest{PodContainer: pod, PID: other.pid()}); !errors.As(err, &ae) || ae.Code != api.CodeRefused {
		t.Errorf("a binding to a process outside the container: %v; want it refused", err)
	}
	if err := c.BindPod(ctx, lease.ID, api.BindPodRequest{PodContainer: pod, PID: pause.pid()}); err != nil {
		t.Fatalf("BindPod: %v", err)
	}
	e.waitStatus("the lease bound, with the container's processes", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].Pod != nil && *st.Leases[0].Pod == pod &&
			slices.Contains(st.Leases[0].PIDs, pause.pid()) && slices.Contains(st.Leases[0].PIDs, greedy.pid()) && !slices.Contains(st.Leases[0].PIDs, other.pid())
	})

	if r := greedy.wait(t); r.code != 90 && r.code != 128+9 {
		t.Errorf("the pod's CUDA process over its lease's memory: exit %d (stderr %q), want 90 (terminated) or SIGKILL", r.code, r.stderr)
	}
	var end api.Event
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("the lease's stream ended without its reason: %v", err)
		}
		if ev.Type == api.EventRequeued {
			t.Errorf("the lease over its memory was requeued")
		}
		if ev.Type == api.EventError {
			end = ev
			break
		}
	}
	if end.Code != api.CodeLimitExceeded || !strings.Contains(end.Message, "memory limit exceeded") || !strings.Contains(end.Message, "pod tenants/greedy container cuda") {
		t.Errorf("the lease ended with %s %q; want %s naming the reason, the pod and the container", end.Code, end.Message, api.CodeLimitExceeded)
	}
	e.waitLogAny(fmt.Sprintf("lease=%s job=k8s uid=0 user=root namespace=tenants pod=greedy container=cuda container_id=%s ended=1", lease.ID, cid))
	if got := e.limMetric("mpsd_pod_memory_exceeded_total", map[string]string{"group": "a"}); got != 1 {
		t.Errorf("mpsd_pod_memory_exceeded_total{group=a} = %v, want 1", got)
	}
	if !alive(pause.pid()) || !alive(other.pid()) {
		t.Errorf("a process that is no CUDA process of the container, or none of it, was ended")
	}
	e.waitLogAny(fmt.Sprintf("not proven a client of the instance's server; not signalled\" group=a gpu=%s gpu_index=0 pid=%d namespace=tenants", lease.GPUUUIDs[0], pause.pid()))
	if !alive(claimer.pid()) {
		t.Errorf("the client outside the container that claimed a pid of it was ended")
	}
	e.waitStatus("no lease left", func(st api.Status) bool { return len(st.Leases) == 0 })
}
