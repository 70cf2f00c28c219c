package deviceplugin

import (
	"context"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/kubeinfo"
)

// DefaultPodGoneAfter is how long the kubelet may list no container
// holding an allocation's units, after it listed one, before the plugin
// takes the pod for ended and releases the lease (the kubelet restarting
// lists none for a moment).
const DefaultPodGoneAfter = 30 * time.Second

// PodSource finds the container holding each of mpsd's devices and the
// running containers with a process of each; kubeinfo.Pods is one (the
// kubelet's PodResources API and the runtime's CRI).
type PodSource interface {
	// Holders maps each allocated device to the container holding it.
	Holders(ctx context.Context) (map[kubeinfo.Device]kubeinfo.ContainerRef, error)
	// Running maps each running container to its id ("" when the name is
	// held by more than one).
	Running(ctx context.Context) (map[kubeinfo.ContainerRef]string, error)
	// PID is a process of running container id, as the runtime says.
	PID(ctx context.Context, id string) (int, error)
}

// PodBinder is what an MPSD needs besides for Options.Pods: binding a
// lease to the container holding its units (POST /v1/leases/{id}/pod).
// Client is one.
type PodBinder interface {
	BindPod(ctx context.Context, id string, b api.BindPodRequest) error
}

var _ PodBinder = (*Client)(nil)

// BindPod posts b for lease id.
func (c *Client) BindPod(ctx context.Context, id string, b api.BindPodRequest) error {
	return c.c.BindPod(ctx, id, b)
}

// trackPods binds each allocation's lease to the container that holds its
// units, as the kubelet's PodResources API and the container runtime say
// (Options.Pods), whenever mpsd's status shows it bound to none or to
// another container (the container restarted, mpsd restarted, a new
// lease replaced one mpsd ended): from then on mpsd holds that
// container's processes to the lease. An allocation the kubelet stops
// listing, after it listed it, for Options.PodGoneAfter has its lease
// released: its pod has ended.
func (p *Plugin) trackPods(ctx context.Context, st api.Status) {
	if p.opts.Pods == nil {
		return
	}
	binder, ok := p.opts.MPSD.(PodBinder)
	if !ok {
		return
	}
	type todo struct {
		a     *allocation
		lease string
	}
	var work []todo
	p.mu.Lock()
	for _, a := range p.allocs {
		if !a.ended {
			work = append(work, todo{a, a.leaseID})
		}
	}
	p.mu.Unlock()
	if len(work) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	holders, err := p.opts.Pods.Holders(ctx)
	var running map[kubeinfo.ContainerRef]string
	if err == nil {
		running, err = p.opts.Pods.Running(ctx)
	}
	if err != nil {
		if !p.podsFailing && ctx.Err() == nil {
			p.log.Warn("cannot tell which containers hold the units (the kubelet's PodResources API, the container runtime); their leases are not bound to them until it can", "err", err)
		}
		p.podsFailing = true
		return
	}
	if p.podsFailing {
		p.log.Info("the containers holding the units can be told again")
		p.podsFailing = false
	}
	bound := map[string]*api.PodContainer{}
	for _, l := range st.Leases {
		if l.Pod != nil {
			bound[l.ID] = l.Pod
		}
	}
	now := time.Now()
	for _, w := range work {
		a := w.a
		log := p.log.With("group", a.group, "gpu", a.gpu, "units", len(a.units))
		ref, held := holderOf(holders, a)
		p.mu.Lock()
		if !held {
			if a.podSeen && a.podMissing.IsZero() {
				a.podMissing = now
			}
			gone := a.podSeen && now.Sub(a.podMissing) >= p.opts.PodGoneAfter
			ref = a.pod
			p.mu.Unlock()
			if gone {
				log.Info("the kubelet lists no container holding the allocation's units any more: its pod has ended", "namespace", ref.Namespace, "pod", ref.Pod, "container", ref.Container)
				p.release(ctx, a, "its pod has ended")
			}
			continue
		}
		a.pod, a.podSeen, a.podMissing = ref, true, time.Time{}
		p.mu.Unlock()
		id := running[ref]
		if w.lease == "" || id == "" {
			continue // no lease (mpsd ended it; a new one comes), or not running
		}
		want := api.PodContainer{Namespace: ref.Namespace, Pod: ref.Pod, Container: ref.Container, ContainerID: id}
		if b := bound[w.lease]; b != nil && *b == want {
			continue
		}
		pid, err := p.opts.Pods.PID(ctx, id)
		if err == nil {
			err = binder.BindPod(ctx, w.lease, api.BindPodRequest{PodContainer: want, PID: pid})
		}
		p.mu.Lock()
		warned := a.bindWarned == w.lease+"/"+id
		if err != nil {
			a.bindWarned = w.lease + "/" + id
		}
		p.mu.Unlock()
		if err != nil {
			if !warned {
				log.Warn("cannot bind the lease to the container holding its units; retrying", "lease", w.lease, "namespace", ref.Namespace, "pod", ref.Pod, "container", ref.Container, "container_id", id, "err", err)
			}
			continue
		}
		log.Info("lease bound to the container holding its units: mpsd holds its processes to the lease", "lease", w.lease, "namespace", ref.Namespace, "pod", ref.Pod, "container", ref.Container, "container_id", id, "pid", pid)
	}
}

// holderOf is the container holding every unit of a; false when the
// kubelet lists none, or the units split over containers.
func holderOf(holders map[kubeinfo.Device]kubeinfo.ContainerRef, a *allocation) (kubeinfo.ContainerRef, bool) {
	var ref kubeinfo.ContainerRef
	res := ResourceName(a.group)
	for i, n := range a.units {
		r, ok := holders[kubeinfo.Device{Resource: res, ID: Unit{Group: a.group, GPU: a.gpu, N: n}.ID()}]
		if !ok || i > 0 && r != ref {
			return kubeinfo.ContainerRef{}, false
		}
		ref = r
	}
	return ref, len(a.units) > 0
}
