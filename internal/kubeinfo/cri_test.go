package kubeinfo

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// fakeRuntime is a container runtime's CRI: its containers, running or
// not, and each one's verbose info.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	ctrs []*runtimeapi.Container
	info map[string]string // container id → verbose "info"
}

func (f *fakeRuntime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	resp := &runtimeapi.ListContainersResponse{}
	for _, c := range f.ctrs {
		if st := req.GetFilter().GetState(); st != nil && st.GetState() != c.GetState() {
			continue
		}
		resp.Containers = append(resp.Containers, c)
	}
	return resp, nil
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	for _, c := range f.ctrs {
		if c.GetId() == req.GetContainerId() {
			resp := &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: c.GetId(), State: c.GetState()}}
			if info, ok := f.info[c.GetId()]; ok && req.GetVerbose() {
				resp.Info = map[string]string{"info": info}
			}
			return resp, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "no container %s", req.GetContainerId())
}

func serveRuntime(t *testing.T, f *fakeRuntime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return sock
}

func ctr(id, ns, pod, name string, state runtimeapi.ContainerState) *runtimeapi.Container {
	return &runtimeapi.Container{Id: id, State: state, Labels: map[string]string{labelNamespace: ns, labelPod: pod, labelContainer: name}}
}

// Holders maps each of mpsd's devices to the container holding it, and
// nothing of other resources.
func TestHolders(t *testing.T) {
	sock := servePodResources(t, t.TempDir(), []*podresourcesapi.PodResources{
		podRes("ns", "a", "gpu", "mpsd.io/x-sm", "x-gpu0-sm0", "x-gpu0-sm1"),
		podRes("ns", "b", "gpu", "nvidia.com/gpu", "GPU-1"),
	})
	got, err := Holders(context.Background(), sock, ResourcePrefix)
	if err != nil {
		t.Fatal(err)
	}
	want := map[Device]ContainerRef{
		{"mpsd.io/x-sm", "x-gpu0-sm0"}: {"ns", "a", "gpu"},
		{"mpsd.io/x-sm", "x-gpu0-sm1"}: {"ns", "a", "gpu"},
	}
	if len(got) != len(want) {
		t.Errorf("Holders = %v, want %v", got, want)
	}
	for d, ref := range want {
		if got[d] != ref {
			t.Errorf("Holders[%v] = %v, want %v", d, got[d], ref)
		}
	}
	if _, err := Holders(context.Background(), filepath.Join(t.TempDir(), "none.sock"), ResourcePrefix); err == nil {
		t.Error("Holders without a kubelet succeeded")
	}
}

// Runtime lists the running containers the kubelet made by the names its
// labels give (a name two running containers hold names none), and a
// running container's pid from its verbose info.
func TestRuntime(t *testing.T) {
	rt := Runtime{Socket: serveRuntime(t, &fakeRuntime{
		ctrs: []*runtimeapi.Container{
			ctr("c1", "ns", "a", "gpu", runtimeapi.ContainerState_CONTAINER_RUNNING),
			ctr("c0", "ns", "a", "gpu", runtimeapi.ContainerState_CONTAINER_EXITED), // its earlier run
			ctr("c2", "ns", "b", "gpu", runtimeapi.ContainerState_CONTAINER_RUNNING),
			ctr("c3", "ns", "b", "gpu", runtimeapi.ContainerState_CONTAINER_RUNNING),
			{Id: "c4", State: runtimeapi.ContainerState_CONTAINER_RUNNING}, // not the kubelet's
			ctr("c5", "ns", "c", "gpu", runtimeapi.ContainerState_CONTAINER_RUNNING),
		},
		info: map[string]string{"c1": `{"pid": 4242, "sandboxID": "s"}`, "c5": `{"sandboxID": "s"}`, "c0": `{"pid": 99}`},
	})}
	ctx := context.Background()
	got, err := rt.Running(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[ContainerRef]string{{"ns", "a", "gpu"}: "c1", {"ns", "b", "gpu"}: "", {"ns", "c", "gpu"}: "c5"}
	if len(got) != len(want) {
		t.Errorf("Running = %v, want %v", got, want)
	}
	for ref, id := range want {
		if got[ref] != id {
			t.Errorf("Running[%v] = %q, want %q", ref, got[ref], id)
		}
	}
	if pid, err := rt.PID(ctx, "c1"); err != nil || pid != 4242 {
		t.Errorf("PID(c1) = %d, %v; want 4242", pid, err)
	}
	for id, why := range map[string]string{"c5": "no pid", "c0": "not running", "c9": "NotFound", "c2": "no verbose info"} {
		if _, err := rt.PID(ctx, id); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("PID(%s): %v; want an error saying %q", id, err, why)
		}
	}
}
