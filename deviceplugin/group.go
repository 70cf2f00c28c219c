package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/internal/kubeinfo"
)

// group is the DevicePlugin service of one group's resource.
type group struct {
	pluginapi.UnimplementedDevicePluginServer

	p        *Plugin
	log      *slog.Logger
	name     string
	resource string
	socket   string

	mu      sync.Mutex
	devices []*pluginapi.Device
	// changed is closed, and replaced, when devices change.
	changed chan struct{}

	// The loop's: the gRPC server of the current socket, closed when its
	// Serve returned, and whether the kubelet must be told of it.
	srv          *grpc.Server
	served       chan struct{}
	needRegister bool
	// registeredWith is the kubeletID of the last registration.
	registeredWith string
}

var _ pluginapi.DevicePluginServer = (*group)(nil)

func newGroup(p *Plugin, name string) *group {
	return &group{
		p: p, log: p.log.With("group", name), name: name, resource: ResourceName(name),
		socket:  filepath.Join(p.opts.KubeletDir, "mpsd-"+name+".sock"),
		changed: make(chan struct{}),
	}
}

// start serves the group on a fresh socket.
func (g *group) start() error {
	if err := os.Remove(g.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deviceplugin: remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", g.socket)
	if err != nil {
		return fmt.Errorf("deviceplugin: listen: %w", err)
	}
	// WaitForHandlers: stop returns only once every RPC has returned.
	srv := grpc.NewServer(grpc.WaitForHandlers(true))
	pluginapi.RegisterDevicePluginServer(srv, g)
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil {
			g.log.Warn("device plugin server ended", "err", err)
		}
	}()
	g.srv, g.served = srv, served
	return nil
}

func (g *group) serving() bool { return g.srv != nil }

// stop ends the server, its streams and its socket.
func (g *group) stop() {
	if g.srv == nil {
		return
	}
	g.srv.Stop()
	<-g.served
	g.srv, g.served = nil, nil
}

// setDevices replaces the device list; ListAndWatch streams send it if it
// differs.
func (g *group) setDevices(devs []*pluginapi.Device) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if slices.EqualFunc(g.devices, devs, func(a, b *pluginapi.Device) bool { return a.ID == b.ID && a.Health == b.Health }) {
		return
	}
	if g.devices != nil {
		healthy := func(ds []*pluginapi.Device) int {
			n := 0
			for _, d := range ds {
				if d.Health == pluginapi.Healthy {
					n++
				}
			}
			return n
		}
		g.log.Info("device list changed", "units", len(devs), "healthy", healthy(devs), "healthy_before", healthy(g.devices))
	}
	g.devices = devs
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *group) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.devices, g.changed
}

// GetDevicePluginOptions: GetPreferredAllocation packs units onto one GPU;
// PreStartContainer checks the container when the plugin has a PodCheck.
func (g *group) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return g.p.pluginOptions(), nil
}

// PreStartContainer is asked by the kubelet before it creates and starts
// each container holding units (before each restart too), with the
// container's device ids. With a PodCheck the container starts only if
// the check passes: one that would run as host root is refused
// (PermissionDenied), and so is one the check could not judge
// (Unavailable: PodResources or the API server out of reach), since a root
// process in a pod is root to the shared MPS daemon (it may quit it, end
// other pods' clients or change the caps). The kubelet reports the error
// in the pod's events and tries again with a backoff.
func (g *group) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	chk := g.p.opts.PodCheck
	if chk == nil {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	ref, err := chk.Check(ctx, g.resource, req.DevicesIds)
	if err != nil {
		var refusal *kubeinfo.Refusal
		if errors.As(err, &refusal) {
			g.log.Warn("container refused: it would run as host root, which owns the shared MPS daemon", "namespace", ref.Namespace, "pod", ref.Pod, "container", ref.Container, "reason", refusal.Err)
			return nil, status.Errorf(codes.PermissionDenied, "mpsd: %v", err)
		}
		g.log.Warn("container refused: whether it would run as host root cannot be told", "namespace", ref.Namespace, "pod", ref.Pod, "container", ref.Container, "devices", len(req.DevicesIds), "err", err)
		return nil, status.Errorf(codes.Unavailable, "mpsd cannot tell whether the container holding %d %s units would run as host root, so it may not start yet: %v", len(req.DevicesIds), g.resource, err)
	}
	g.log.Info("container checked: not host root", "namespace", ref.Namespace, "pod", ref.Pod, "container", ref.Container)
	return &pluginapi.PreStartContainerResponse{}, nil
}

// ListAndWatch sends the units and their health, then every change.
func (g *group) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devs, changed := g.snapshot()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation packs each container's units onto one GPU (see
// preferred). Units the kubelet offers as available are free in its
// books: a lease the plugin still holds on one belongs to a pod that has
// ended, and is released now.
func (g *group) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		g.p.releaseFree(ctx, g.name, cr.AvailableDeviceIDs)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: preferred(g.name, cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize)),
		})
	}
	return resp, nil
}

// Allocate leases each container's units on mpsd and answers their MPS
// environment and mounts. If one container's lease cannot be had, the
// leases made for the others are released and the call fails.
func (g *group) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	var made []*allocation
	for _, cr := range req.ContainerRequests {
		r, a, err := g.p.allocate(ctx, g, cr.DevicesIds)
		if err != nil {
			for _, a := range made {
				g.p.release(ctx, a, "another container of the same request could not be allocated")
			}
			g.log.Warn("allocate refused", "devices", len(cr.DevicesIds), "err", err)
			return nil, err
		}
		made = append(made, a)
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

// preferred chooses size units of group from available, must included:
// all on the GPU of the must-include units, or else on the GPU with the
// fewest available units that still has size of them (binpack: large
// requests keep finding whole GPUs), lowest unit numbers first. When no
// GPU has enough it proposes the fullest set it can on the GPU with the
// most; the Allocate that follows refuses units spread over GPUs.
func preferred(group string, available, must []string, size int) []string {
	byGPU := map[int][]int{}
	for _, id := range available {
		if u, err := ParseUnit(id); err == nil && u.Group == group {
			byGPU[u.GPU] = append(byGPU[u.GPU], u.N)
		}
	}
	var chosen []Unit
	gpu := -1
	for _, id := range must {
		if u, err := ParseUnit(id); err == nil && u.Group == group {
			chosen = append(chosen, u)
			if gpu < 0 {
				gpu = u.GPU
			}
		}
	}
	if gpu < 0 {
		better := func(idx, n, best, bestN int) bool {
			fits, bestFits := n >= size, bestN >= size
			switch {
			case best < 0:
				return true
			case fits != bestFits:
				return fits
			case n != bestN:
				return fits == (n < bestN) // the tightest fit, or else the most
			}
			return idx < best
		}
		best, bestN := -1, 0
		for idx, ns := range byGPU {
			if better(idx, len(ns), best, bestN) {
				best, bestN = idx, len(ns)
			}
		}
		gpu = best
	}
	ns := byGPU[gpu]
	slices.Sort(ns)
	for _, n := range ns {
		if len(chosen) >= size {
			break
		}
		u := Unit{Group: group, GPU: gpu, N: n}
		if !slices.Contains(chosen, u) {
			chosen = append(chosen, u)
		}
	}
	ids := make([]string, len(chosen))
	for i, u := range chosen {
		ids[i] = u.ID()
	}
	return ids
}
