package deviceplugin

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// fakePodResources is the kubelet's PodResources API: which container of
// which pod holds which devices, as the kubelet records them at admission.
type fakePodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	pods []*podresourcesapi.PodResources
	srv  *grpc.Server
}

func (f *fakePodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &podresourcesapi.ListPodResourcesResponse{PodResources: f.pods}, nil
}

// add records that container ctr of pod ns/name holds ids of resource.
func (f *fakePodResources) add(ns, name, ctr, resource string, ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods = append(f.pods, &podresourcesapi.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesapi.ContainerResources{
		{Name: ctr, Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}},
	}})
}

func servePodResources(t *testing.T, sock string) *fakePodResources {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePodResources{srv: grpc.NewServer()}
	podresourcesapi.RegisterPodResourcesListerServer(f.srv, f)
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(f.srv.Stop)
	return f
}

// podSpecs stands for the API server.
type podSpecs map[string]*corev1.Pod

func (p podSpecs) Pod(_ context.Context, ns, name string) (*kubeinfo.Pod, error) {
	if pod := p[ns+"/"+name]; pod != nil {
		// As the API server sends it, decoded as the check reads it.
		b, err := json.Marshal(pod)
		if err != nil {
			return nil, err
		}
		return kubeinfo.DecodePod(b)
	}
	return nil, errors.New("pods \"" + name + "\" not found")
}

func testPod(name string, hostUsers *bool, sc *corev1.PodSecurityContext, csc *corev1.SecurityContext) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: name},
		Spec:       corev1.PodSpec{HostUsers: hostUsers, SecurityContext: sc, Containers: []corev1.Container{{Name: "cuda", SecurityContext: csc}}},
	}
}

// kubeletStart does what the kubelet does before it creates and starts a
// container holding ids: PreStartContainer when the plugin asked for it;
// an error there and the container is not created.
func kubeletStart(t *testing.T, pc *pluginConn, ids []string) error {
	t.Helper()
	if !pc.opts.GetPreStartRequired() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), pluginapi.KubeletPreStartContainerRPCTimeoutInSecs*1e9)
	defer cancel()
	_, err := pc.client.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids})
	return err
}

// mpsControl runs NVIDIA's (the emulator's) nvidia-cuda-mps-control as uid
// with cmd on its stdin against the pipe directory as a pod sees it
// (inside a pod view: root is the pod's root).
func mpsControl(t *testing.T, uid uint32, root, pipe, cmd string) (string, error) {
	t.Helper()
	// Relative to the pipe directory: the pod view's paths are longer
	// than a unix socket address may be.
	return runAs(uid, []byte(cmd+"\n"), `cd "$1" && CUDA_MPS_PIPE_DIRECTORY=. exec "$2"`,
		filepath.Join(root, pipe), filepath.Join(emutest.BinDir(t), emutest.ControlName))
}

// A pod whose container would run as host uid 0 is refused before it
// starts (the kubelet's PreStartContainer), with the pod, the container
// and the reason; one running as a non-root uid, or in a user namespace,
// starts, and its `quit` and a change of the daemon's defaults are refused
// by the daemon itself. With the
// kubelet's PodResources API out of reach nothing starts. Without the
// check (what the plugin did before), the root pod's container, in
// exactly the mount view Allocate gives it, quits the shared daemon: the
// test plays a real attack.
func TestRootPodRefusedBeforeStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts mpsd")
	}
	rootOK := os.Geteuid() == 0
	m := newMPSD(t, twoGroups)
	dir := t.TempDir()
	k := newFakeKubelet(t, dir)
	prSock := filepath.Join(dir, "pod-resources.sock")
	pr := servePodResources(t, prSock)
	yes, no := true, false
	uid := int64(attackerUID)
	specs := podSpecs{
		"tenants/root":   testPod("root", nil, nil, nil),
		"tenants/user":   testPod("user", nil, &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid}, &corev1.SecurityContext{AllowPrivilegeEscalation: &no}),
		"tenants/userns": testPod("userns", &no, nil, nil),
	}
	runPluginWith(t, m, Options{KubeletDir: dir, Groups: []string{"a"}, PodCheck: kubeinfo.RootCheck{PodResources: prSock, Pods: specs}})
	pc := k.waitRegistered("mpsd.io/a-sm")["mpsd.io/a-sm"]
	if !pc.req.Options.GetPreStartRequired() || !pc.opts.GetPreStartRequired() {
		t.Fatalf("options %v at registration, %v from the plugin: PreStartContainer not asked for", pc.req.Options, pc.opts)
	}
	pc.waitList(t, "a healthy", allHealthy)
	avail := ids("a", 1, seq(0, 99)...)
	var all []string
	resps := map[string]*pluginapi.ContainerAllocateResponse{}
	units := map[string][]string{}
	for _, name := range []string{"root", "user", "userns"} {
		got, resp, err := allocate(t, pc, without(avail, all), 10)
		if err != nil {
			t.Fatalf("Allocate %s: %v", name, err)
		}
		all = append(all, got...)
		resps[name], units[name] = resp, got
		pr.add("tenants", name, "cuda", "mpsd.io/a-sm", got)
	}
	st := m.waitStatus("status", func(api.Status) bool { return true })
	in, _ := findInstance(st, "a", 1)
	pipe := resps["root"].Envs[api.EnvPipeDirectory]

	err := kubeletStart(t, pc, units["root"])
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "pod tenants/root container cuda refused") || !strings.Contains(err.Error(), "may run as uid 0") {
		t.Errorf("PreStartContainer of a root pod: %v, want PermissionDenied naming the pod, its container and why", err)
	}
	for _, name := range []string{"user", "userns"} {
		if err := kubeletStart(t, pc, units[name]); err != nil {
			t.Errorf("PreStartContainer of the %s pod: %v", name, err)
		}
	}
	if !rootOK {
		t.Log("not root: the pods' processes are not run")
	} else {
		// The non-root pod's container, started, tries to quit the daemon.
		podView(t, resps["user"].Mounts, func(root string) {
			out, err := mpsControl(t, attackerUID, root, pipe, "quit")
			if err != nil || !strings.Contains(out, "Not enough privilege") {
				t.Errorf("quit from the non-root pod: %q %v, want the daemon's refusal", out, err)
			}
			// Nor may it raise the caps the next server starts with
			// (refused from driver 550 on; the simulated driver is newer).
			out, err = mpsControl(t, attackerUID, root, pipe, "set_default_active_thread_percentage 100")
			if err != nil || !strings.Contains(out, "Insufficient privileges") {
				t.Errorf("set_default_active_thread_percentage from the non-root pod: %q %v, want the daemon's refusal", out, err)
			}
		})
		after := m.waitStatus("status", func(api.Status) bool { return true })
		if a, _ := findInstance(after, "a", 1); a.DaemonPID != in.DaemonPID || a.State != api.InstanceReady {
			t.Errorf("after the non-root pod's quit the daemon is %d (%s), was %d", a.DaemonPID, a.State, in.DaemonPID)
		}
	}

	// Fail closed: no PodResources, no start.
	pr.srv.Stop()
	if err := kubeletStart(t, pc, units["user"]); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "PodResources") {
		t.Errorf("PreStartContainer without the kubelet's PodResources API: %v, want Unavailable naming it", err)
	}

	if !rootOK {
		return
	}
	// Without the check the kubelet would have started the root pod's
	// container: in its mount view it quits the shared daemon.
	podView(t, resps["root"].Mounts, func(root string) {
		if out, err := mpsControl(t, 0, root, pipe, "quit"); err != nil || strings.Contains(out, "privilege") {
			t.Errorf("quit from the root pod's view: %q %v", out, err)
		}
	})
	m.waitStatus("the root pod's quit to end the daemon", func(st api.Status) bool {
		a, _ := findInstance(st, "a", 1)
		return a.DaemonPID != in.DaemonPID || a.State != api.InstanceReady
	})
}
