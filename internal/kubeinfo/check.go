package kubeinfo

import (
	"context"
	"fmt"
)

// PodGetter reads a pod's spec; *APIServer is one.
type PodGetter interface {
	Pod(ctx context.Context, namespace, name string) (*Pod, error)
}

// RootCheck refuses containers that would run as host root: it finds the
// container holding a set of devices (Locate, through PodResources), reads
// its pod (Pods) and applies HostRoot. It fails closed: when either cannot
// be reached the answer is an error naming what could not be.
type RootCheck struct {
	// PodResources is the kubelet's PodResources socket;
	// DefaultPodResourcesSocket when empty.
	PodResources string
	// Pods reads pods' specs.
	Pods PodGetter
}

// Refusal is RootCheck's answer for a container that would run as host
// root (not for a check that could not be made).
type Refusal struct {
	Ref ContainerRef
	Err error
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("%s refused: %v; mpsd's units are given only to pods whose processes cannot be host root (docs/cluster.md)", r.Ref, r.Err)
}

func (r *Refusal) Unwrap() error { return r.Err }

// Check returns nil when the container holding ids of resource may start,
// a *Refusal when it would run as host root, and another error when that
// could not be told.
func (c RootCheck) Check(ctx context.Context, resource string, ids []string) (ContainerRef, error) {
	sock := c.PodResources
	if sock == "" {
		sock = DefaultPodResourcesSocket
	}
	ref, err := Locate(ctx, sock, resource, ids)
	if err != nil {
		return ref, err
	}
	if c.Pods == nil {
		return ref, fmt.Errorf("kubeinfo: no source of pod specs to check %s", ref)
	}
	pod, err := c.Pods.Pod(ctx, ref.Namespace, ref.Pod)
	if err != nil {
		return ref, err
	}
	if err := HostRoot(pod); err != nil {
		return ref, &Refusal{Ref: ref, Err: err}
	}
	return ref, nil
}
