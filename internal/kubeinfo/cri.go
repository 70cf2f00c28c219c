package kubeinfo

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultRuntimeSocket is containerd's socket, which serves the CRI.
const DefaultRuntimeSocket = "/run/containerd/containerd.sock"

// The labels the kubelet puts on every container it creates through the
// CRI, naming its pod and itself. The kubelet sets them from the pod's
// metadata, not from anything in the container.
const (
	labelNamespace = "io.kubernetes.pod.namespace"
	labelPod       = "io.kubernetes.pod.name"
	labelContainer = "io.kubernetes.container.name"
)

// Runtime reads containers from the container runtime's CRI socket
// (containerd's, CRI-O's), which only root reaches.
type Runtime struct {
	// Socket is the runtime's CRI socket; DefaultRuntimeSocket when
	// empty.
	Socket string
}

func (r Runtime) socket() string {
	if r.Socket == "" {
		return DefaultRuntimeSocket
	}
	return r.Socket
}

func (r Runtime) client() (runtimeapi.RuntimeServiceClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+r.socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("kubeinfo: the container runtime at %s: %w", r.socket(), err)
	}
	return runtimeapi.NewRuntimeServiceClient(conn), func() { _ = conn.Close() }, nil
}

// Running maps each running container the kubelet made to its id, by the
// pod and container names its labels give. A name held by more than one
// running container (a pod deleted and made again under its name, while
// the old one stops) maps to "": which one holds the devices cannot be
// told from the names.
func (r Runtime) Running(ctx context.Context) (map[ContainerRef]string, error) {
	c, done, err := r.client()
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: the container runtime at %s: list containers: %w", r.socket(), err)
	}
	out := map[ContainerRef]string{}
	for _, ct := range resp.GetContainers() {
		l := ct.GetLabels()
		ref := ContainerRef{Namespace: l[labelNamespace], Pod: l[labelPod], Container: l[labelContainer]}
		if ref.Namespace == "" || ref.Pod == "" || ref.Container == "" || ct.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		if _, twice := out[ref]; twice {
			out[ref] = ""
			continue
		}
		out[ref] = ct.GetId()
	}
	return out, nil
}

// PID is a process of the running container id as the runtime reports it
// (its first process, from ContainerStatus's verbose info), for the
// container's cgroups to be read through.
func (r Runtime) PID(ctx context.Context, id string) (int, error) {
	c, done, err := r.client()
	if err != nil {
		return 0, err
	}
	defer done()
	resp, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, fmt.Errorf("kubeinfo: the container runtime at %s: status of container %s: %w", r.socket(), id, err)
	}
	if st := resp.GetStatus(); st == nil || st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return 0, fmt.Errorf("kubeinfo: container %s is not running", id)
	}
	var info struct {
		PID int `json:"pid"`
	}
	raw, ok := resp.GetInfo()["info"]
	if !ok {
		return 0, fmt.Errorf("kubeinfo: the container runtime at %s gives no verbose info (pid) for container %s", r.socket(), id)
	}
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		return 0, fmt.Errorf("kubeinfo: verbose info of container %s: %w", id, err)
	}
	if info.PID <= 1 {
		return 0, fmt.Errorf("kubeinfo: the container runtime gives no pid for container %s", id)
	}
	return info.PID, nil
}

// Pods finds which container holds each of mpsd's devices (the kubelet's
// PodResources API) and the running containers with a process of each
// (the runtime's CRI). The device plugin binds each lease to its
// container with them.
type Pods struct {
	// PodResources is the kubelet's PodResources socket;
	// DefaultPodResourcesSocket when empty.
	PodResources string
	Runtime      Runtime
}

// Holders is Holders of mpsd's resources (ResourcePrefix).
func (p Pods) Holders(ctx context.Context) (map[Device]ContainerRef, error) {
	sock := p.PodResources
	if sock == "" {
		sock = DefaultPodResourcesSocket
	}
	return Holders(ctx, sock, ResourcePrefix)
}

// Running is Runtime.Running.
func (p Pods) Running(ctx context.Context) (map[ContainerRef]string, error) {
	return p.Runtime.Running(ctx)
}

// PID is Runtime.PID.
func (p Pods) PID(ctx context.Context, id string) (int, error) {
	return p.Runtime.PID(ctx, id)
}
