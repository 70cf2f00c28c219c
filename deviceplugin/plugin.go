package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/kubeinfo"
)

// Defaults of Options.
const (
	// DefaultKubeletDir is where the kubelet's registration socket and the
	// plugins' sockets live.
	DefaultKubeletDir = "/var/lib/kubelet/device-plugins"
	// DefaultPollInterval is how often mpsd's status is read for health
	// changes.
	DefaultPollInterval = time.Second
	// DefaultReleaseWait bounds how long Allocate waits for mpsd to finish
	// releasing the leases of units the kubelet hands out again.
	DefaultReleaseWait = 10 * time.Second
)

// KubeletSocket is the name of the kubelet's registration socket in the
// kubelet directory.
const KubeletSocket = "kubelet.sock"

// Timeouts of the plugin's own calls.
const (
	statusTimeout   = 5 * time.Second
	registerTimeout = 5 * time.Second
	grantTimeout    = 10 * time.Second
	maxRegisterWait = 30 * time.Second
	maxLeaseRetry   = time.Minute
	startupPoll     = 100 * time.Millisecond
)

// Options configure a Plugin. MPSD is required.
type Options struct {
	// MPSD is the node's mpsd; NewClient(socket) in production.
	MPSD MPSD
	// KubeletDir holds kubelet.sock and the plugin's sockets; default
	// DefaultKubeletDir.
	KubeletDir string
	// Groups limits the groups offered to the kubelet; empty means every
	// group mpsd runs.
	Groups []string
	// PollInterval: see DefaultPollInterval.
	PollInterval time.Duration
	// ReleaseWait: see DefaultReleaseWait.
	ReleaseWait time.Duration
	// ProcRoot and DevRoot are where /proc and /dev are (device nodes of
	// real GPUs); default /proc and /dev.
	ProcRoot, DevRoot string
	// PodCheck, when set, is asked before each container holding units
	// starts (the kubelet's PreStartContainer): an error keeps the
	// container from starting, with the error in the pod's events. mpsd
	// sets a kubeinfo.RootCheck, which refuses a container that would run
	// as host root (docs/cluster.md). nil: no check, PreStartContainer is
	// not asked for.
	PodCheck PodCheck
	// Pods, when set, finds the container holding each allocation's units
	// and a process of it (mpsd sets kubeinfo.Pods: the kubelet's
	// PodResources API and the container runtime's CRI), and the plugin
	// binds the allocation's lease to that container, so that mpsd holds
	// the container's processes to the lease (docs/cluster.md). It needs
	// an MPSD that is a PodBinder. nil: leases hold no process.
	Pods PodSource
	// PodGoneAfter: see DefaultPodGoneAfter.
	PodGoneAfter time.Duration
	// Logger receives the plugin's log; nil discards it.
	Logger *slog.Logger
}

// PodCheck decides whether the container holding device ids of resource
// may start; kubeinfo.RootCheck is one. A *kubeinfo.Refusal means it may
// not; another error that it could not be told, and it does not start
// either.
type PodCheck interface {
	Check(ctx context.Context, resource string, ids []string) (kubeinfo.ContainerRef, error)
}

// Plugin is the device plugin of one node: one DevicePlugin service per
// group, each on its own socket in the kubelet directory and registered
// as that group's resource.
type Plugin struct {
	opts Options
	log  *slog.Logger
	uid  uint32
	// kick asks the loop for a status poll now.
	kick chan struct{}
	// leaseCtx outlives any one RPC: lease streams run under it and are
	// closed explicitly.
	leaseCtx context.Context

	// groups is the loop's; RPCs reach their own group only.
	groups map[string]*group
	// warned: groups of Options.Groups mpsd does not run, reported once.
	warned map[string]bool
	// statusFailing: the last status poll failed (reported once);
	// statusSeen: one succeeded (before that mpsd is still starting).
	statusFailing, statusSeen bool
	// podsFailing: the last look at the pods (Options.Pods) failed
	// (reported once).
	podsFailing bool

	mu      sync.Mutex
	closed  bool
	adopted bool
	allocs  []*allocation
	// releasing maps the ids of leases being released to their groups,
	// until mpsd's status no longer lists them.
	releasing map[string]string
	holders   sync.WaitGroup
}

// New checks opts and fills in the defaults; Run starts the plugin.
func New(opts Options) (*Plugin, error) {
	if opts.MPSD == nil {
		return nil, errors.New("deviceplugin: no mpsd client")
	}
	if opts.KubeletDir == "" {
		opts.KubeletDir = DefaultKubeletDir
	}
	dir, err := filepath.Abs(opts.KubeletDir)
	if err != nil {
		return nil, fmt.Errorf("deviceplugin: kubelet directory: %w", err)
	}
	opts.KubeletDir = dir
	for _, g := range opts.Groups {
		if !validGroup(g) {
			return nil, fmt.Errorf("deviceplugin: %q is not a group name", g)
		}
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.ReleaseWait <= 0 {
		opts.ReleaseWait = DefaultReleaseWait
	}
	if opts.PodGoneAfter <= 0 {
		opts.PodGoneAfter = DefaultPodGoneAfter
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.DevRoot == "" {
		opts.DevRoot = "/dev"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Plugin{
		opts: opts, log: log, uid: uint32(os.Getuid()), kick: make(chan struct{}, 1),
		groups: map[string]*group{}, warned: map[string]bool{}, releasing: map[string]string{},
	}, nil
}

// Run serves the kubelet until ctx ends: it polls mpsd's status, serves
// and registers one resource per group, re-registers when the kubelet
// restarts, and holds a lease on mpsd for every allocation. When ctx ends
// it stops serving, removes its sockets and closes its lease streams
// (mpsd releases those leases unless it is itself stopping, in which case
// it keeps them for the next plugin to resume). Every goroutine it starts
// has ended when it returns; it returns an error only when it cannot start.
func (p *Plugin) Run(ctx context.Context) error {
	if err := os.MkdirAll(p.opts.KubeletDir, 0o755); err != nil {
		return fmt.Errorf("deviceplugin: kubelet directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("deviceplugin: watch kubelet directory: %w", err)
	}
	defer w.Close()
	if err := w.Add(p.opts.KubeletDir); err != nil {
		return fmt.Errorf("deviceplugin: watch %s: %w", p.opts.KubeletDir, err)
	}
	p.leaseCtx = context.WithoutCancel(ctx)
	defer p.shutdown()
	p.log.Info("kubelet device plugin starting", "kubelet_dir", p.opts.KubeletDir, "groups", p.opts.Groups)

	poll := time.NewTicker(p.opts.PollInterval)
	defer poll.Stop()
	// Until mpsd first answers (it starts alongside), ask more often.
	startup := time.NewTicker(min(startupPoll, p.opts.PollInterval))
	defer startup.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	<-retry.C
	backoff := time.Second
	// due: a group needs registering (new, or its socket was served
	// anew) or a failed registration is retried.
	due := p.refresh(ctx)
	for {
		if due {
			due = false
			if p.register(ctx) {
				retry.Reset(backoff)
				backoff = min(2*backoff, maxRegisterWait)
			} else {
				backoff = time.Second
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
			due = p.refresh(ctx)
		case <-startup.C:
			if p.statusSeen {
				startup.Stop()
				continue
			}
			due = p.refresh(ctx)
		case <-p.kick:
			due = p.refresh(ctx)
		case <-retry.C:
			due = true
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			due = p.onDirEvent(ev)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			p.log.Warn("watching the kubelet directory", "err", err)
		}
	}
}

// poke asks the loop for a status poll soon.
func (p *Plugin) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// onDirEvent reacts to the kubelet's restart: it deletes every plugin
// socket and creates kubelet.sock anew, and a plugin must then serve a new
// socket and register again. It reports whether a group needs
// registering.
func (p *Plugin) onDirEvent(ev fsnotify.Event) bool {
	name := filepath.Base(ev.Name)
	due := false
	if name == KubeletSocket {
		if !ev.Has(fsnotify.Create) {
			return false
		}
		p.log.Info("kubelet registration socket created (kubelet started)")
		kid, _ := p.kubeletID()
		for _, g := range p.groups {
			if _, err := os.Stat(g.socket); err != nil || !g.serving() {
				p.restartGroup(g)
			}
			// A group served anew on the socket's removal may already
			// have registered with this kubelet.
			if g.registeredWith != kid {
				g.needRegister, due = true, true
			}
		}
		return due
	}
	if !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
		return false
	}
	for _, g := range p.groups {
		if filepath.Base(g.socket) != name {
			continue
		}
		if _, err := os.Stat(g.socket); err == nil {
			return false // our own replacement of it
		}
		p.log.Info("plugin socket removed (kubelet restarting?); serving it again", "group", g.name, "socket", g.socket)
		p.restartGroup(g)
		return true
	}
	return false
}

func (p *Plugin) restartGroup(g *group) {
	g.stop()
	if err := g.start(); err != nil {
		p.log.Error("serve device plugin socket", "group", g.name, "err", err)
	}
	g.needRegister = true
}

// kubeletID identifies the kubelet.sock in the directory now: a kubelet
// that starts again creates a new one (a new inode and change time).
func (p *Plugin) kubeletID() (string, error) {
	fi, err := os.Stat(filepath.Join(p.opts.KubeletDir, KubeletSocket))
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d:%d.%d", st.Ino, st.Ctim.Sec, st.Ctim.Nsec), nil
	}
	return fi.ModTime().String(), nil
}

// register registers every group that needs it while kubelet.sock exists,
// and reports whether one failed (the caller retries with a backoff).
func (p *Plugin) register(ctx context.Context) (failed bool) {
	var todo []*group
	for _, g := range p.groups {
		if g.needRegister && g.serving() {
			todo = append(todo, g)
		}
	}
	if len(todo) == 0 {
		return false
	}
	sock := filepath.Join(p.opts.KubeletDir, KubeletSocket)
	kid, err := p.kubeletID()
	if err != nil {
		return false // its creation wakes us
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.log.Warn("connect to the kubelet", "socket", sock, "err", err)
		return true
	}
	defer conn.Close()
	client := pluginapi.NewRegistrationClient(conn)
	slices.SortFunc(todo, func(a, b *group) int { return strings.Compare(a.name, b.name) })
	for _, g := range todo {
		rctx, cancel := context.WithTimeout(ctx, registerTimeout)
		_, err := client.Register(rctx, &pluginapi.RegisterRequest{
			Version:      pluginapi.Version,
			Endpoint:     filepath.Base(g.socket),
			ResourceName: g.resource,
			Options:      p.pluginOptions(),
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("register with the kubelet failed; retrying", "resource", g.resource, "err", err)
			}
			failed = true
			continue
		}
		g.needRegister, g.registeredWith = false, kid
		p.log.Info("registered with the kubelet", "resource", g.resource, "endpoint", filepath.Base(g.socket))
	}
	return failed
}

// pluginOptions are the options of every group's service: preferred
// allocations always, PreStartContainer with a PodCheck.
func (p *Plugin) pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true, PreStartRequired: p.opts.PodCheck != nil}
}

// status reads mpsd's status within statusTimeout.
func (p *Plugin) status(ctx context.Context) (api.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	return p.opts.MPSD.Status(ctx)
}

// refresh polls mpsd: it starts and stops the groups' services, updates
// their device lists (ListAndWatch sends a list that changed) and brings
// allocations whose lease was lost back to mpsd. It reports whether a
// new group needs registering.
func (p *Plugin) refresh(ctx context.Context) (due bool) {
	st, err := p.status(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		switch {
		case !p.statusSeen:
			p.log.Debug("waiting for mpsd to serve", "err", err)
		case !p.statusFailing:
			p.log.Warn("mpsd status unavailable; device health is as last seen", "err", err)
			p.statusFailing = true
		}
		return false
	}
	if p.statusFailing {
		p.log.Info("mpsd status available again")
		p.statusFailing = false
	}
	p.statusSeen = true
	lists := deviceLists(st)
	for name, devs := range lists {
		if len(p.opts.Groups) > 0 && !slices.Contains(p.opts.Groups, name) {
			continue
		}
		g := p.groups[name]
		if g == nil {
			g = newGroup(p, name)
			g.setDevices(devs)
			if err := g.start(); err != nil {
				p.log.Error("serve device plugin socket", "group", name, "err", err)
			}
			g.needRegister, due = true, true
			p.groups[name] = g
			p.log.Info("offering group to the kubelet", "group", name, "resource", g.resource, "units", len(devs))
			continue
		}
		g.setDevices(devs)
	}
	for name, g := range p.groups {
		if _, ok := lists[name]; !ok {
			p.log.Info("group gone from mpsd; no longer offered", "group", name)
			g.stop()
			delete(p.groups, name)
		}
	}
	for _, name := range p.opts.Groups {
		if _, ok := lists[name]; !ok && !p.warned[name] {
			p.log.Warn("mpsd runs no instance of this group; it is not offered", "group", name)
			p.warned[name] = true
		}
	}
	p.reconcile(ctx, st)
	p.trackPods(ctx, st)
	return due
}

// deviceLists maps each group of st to its units: one per SM percent of
// each instance's budget, healthy only while the instance is ready.
func deviceLists(st api.Status) map[string][]*pluginapi.Device {
	insts := slices.Clone(st.Instances)
	slices.SortFunc(insts, func(a, b api.InstanceStatus) int { return a.GPUIndex - b.GPUIndex })
	out := map[string][]*pluginapi.Device{}
	for _, in := range insts {
		if !validGroup(in.Group) {
			continue
		}
		health := pluginapi.Unhealthy
		if in.State == api.InstanceReady {
			health = pluginapi.Healthy
		}
		devs := out[in.Group]
		for n := range min(in.SMBudget, MaxUnits) {
			devs = append(devs, &pluginapi.Device{ID: Unit{Group: in.Group, GPU: in.GPUIndex, N: n}.ID(), Health: health})
		}
		out[in.Group] = devs
	}
	return out
}

// shutdown stops every group's service and closes every lease stream.
func (p *Plugin) shutdown() {
	for name, g := range p.groups {
		g.stop()
		delete(p.groups, name)
	}
	p.mu.Lock()
	p.closed = true
	var streams []LeaseStream
	for _, a := range p.allocs {
		if a.stream != nil {
			streams = append(streams, a.stream)
			a.stream = nil
		}
	}
	p.mu.Unlock()
	for _, s := range streams {
		_ = s.Close()
	}
	p.holders.Wait()
	p.log.Info("kubelet device plugin stopped")
}
