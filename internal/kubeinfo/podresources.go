package kubeinfo

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is the kubelet's PodResources API socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// ContainerRef names one container of one pod.
type ContainerRef struct {
	Namespace, Pod, Container string
}

func (r ContainerRef) String() string {
	return fmt.Sprintf("pod %s/%s container %s", r.Namespace, r.Pod, r.Container)
}

// Locate asks the kubelet's PodResources API at socket which container
// holds the devices ids of resource. The kubelet records an allocation
// when it admits the pod, before it creates the container, so the
// container is listed by the time the kubelet calls PreStartContainer. A
// device id belongs to one container at a time: the container that holds
// every one of ids is the answer; none, or devices split over containers,
// is an error.
func Locate(ctx context.Context, socket, resource string, ids []string) (ContainerRef, error) {
	if len(ids) == 0 {
		return ContainerRef{}, fmt.Errorf("kubeinfo: no device ids to look up")
	}
	pods, err := listPodResources(ctx, socket)
	if err != nil {
		return ContainerRef{}, err
	}
	var found []ContainerRef
	for _, p := range pods {
		for _, c := range p.GetContainers() {
			held := 0
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != resource {
					continue
				}
				for _, id := range ids {
					if slices.Contains(d.GetDeviceIds(), id) {
						held++
					}
				}
			}
			if held > 0 {
				found = append(found, ContainerRef{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()})
				if held < len(ids) {
					return ContainerRef{}, fmt.Errorf("kubeinfo: %s holds %d of the %d %s devices asked about", found[len(found)-1], held, len(ids), resource)
				}
			}
		}
	}
	switch len(found) {
	case 0:
		return ContainerRef{}, fmt.Errorf("kubeinfo: the kubelet's PodResources API lists no container holding %s devices %v", resource, ids)
	case 1:
		return found[0], nil
	}
	return ContainerRef{}, fmt.Errorf("kubeinfo: %d containers hold %s devices %v (%s, %s)", len(found), resource, ids, found[0], found[1])
}

// Device is one device id of one extended resource.
type Device struct {
	Resource, ID string
}

// Holders asks the kubelet's PodResources API at socket which container
// holds each device of the resources whose names start with prefix: the
// kubelet's record of its allocations, which it keeps from a pod's
// admission until the pod has ended.
func Holders(ctx context.Context, socket, prefix string) (map[Device]ContainerRef, error) {
	pods, err := listPodResources(ctx, socket)
	if err != nil {
		return nil, err
	}
	out := map[Device]ContainerRef{}
	for _, p := range pods {
		for _, c := range p.GetContainers() {
			ref := ContainerRef{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()}
			for _, d := range c.GetDevices() {
				if !strings.HasPrefix(d.GetResourceName(), prefix) {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					out[Device{Resource: d.GetResourceName(), ID: id}] = ref
				}
			}
		}
	}
	return out, nil
}

// listPodResources is the kubelet's PodResources List at socket: every
// pod's containers and the devices each holds.
func listPodResources(ctx context.Context, socket string) ([]*podresourcesapi.PodResources, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: the kubelet's PodResources API at %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubeinfo: the kubelet's PodResources API at %s: %w", socket, err)
	}
	return resp.GetPodResources(), nil
}
