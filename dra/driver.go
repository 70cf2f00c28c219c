package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/deviceplugin"
)

// Sentinel errors.
var (
	// ErrNoInstance: a claim names a device mpsd runs no instance of.
	ErrNoInstance = errors.New("dra: no such instance")
	// ErrRefused: mpsd refused a claim's lease; the error says mpsd's
	// reason.
	ErrRefused = errors.New("dra: mpsd refused the lease")
)

// Defaults of Options.
const (
	DefaultCDIDir       = "/var/run/cdi"
	DefaultPollInterval = 2 * time.Second
	// grantTimeout bounds the wait for mpsd's answer to a lease request
	// (it never queues one: NoWait).
	grantTimeout = 30 * time.Second
	// maxRetry paces the attempts to get a lost lease back.
	maxRetry = time.Minute
)

// Clock is the time the driver paces itself by.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Publisher publishes the node's ResourceSlices: kubeletplugin.Helper.
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

var _ Publisher = (*kubeletplugin.Helper)(nil)

// EditsFunc is what a container gets for lease l of instance in, in the
// device plugin's terms (deviceplugin.ContainerEdits).
type EditsFunc func(l *api.Lease, in api.InstanceStatus) (*pluginapi.ContainerAllocateResponse, error)

// Options configure a Driver.
type Options struct {
	// MPSD is mpsd's API (deviceplugin.NewClient of its socket).
	MPSD deviceplugin.MPSD
	// NodeName names the node: the pool of its devices.
	NodeName string
	// Kube writes the claims' device status; nil writes none.
	Kube kubernetes.Interface
	// CDIDir is where the claims' CDI specs are written (DefaultCDIDir).
	CDIDir string
	// Groups are the groups offered; empty offers every group.
	Groups []string
	// Limits are each group's lease limits, for the requestPolicy.
	Limits map[string]Limits
	// Mode is how claims share a device.
	Mode Mode
	// Edits gives a lease's container its environment, mounts and
	// device nodes; nil is deviceplugin.ContainerEdits under /proc and
	// /dev.
	Edits EditsFunc
	// PollInterval is how often mpsd's status is read (DefaultPollInterval).
	PollInterval time.Duration
	Clock        Clock
	Logger       *slog.Logger
}

// Driver is mpsd's DRA kubelet plugin (kubeletplugin.DRAPlugin).
type Driver struct {
	opts Options
	log  *slog.Logger

	// ops serializes Prepare, Unprepare and reconcile: each asks mpsd for
	// leases or ends them, and must see the others' results. It is held
	// across calls to mpsd; mu is not.
	ops chan struct{}

	mu       sync.Mutex
	claims   map[types.UID]*claim
	adopted  bool
	closed   bool
	leaseCtx context.Context
	stopAll  context.CancelFunc
	holders  sync.WaitGroup
	// since is when each device's instance was last seen becoming not
	// ready: its taint's TimeAdded.
	since map[string]time.Time
	poke  chan struct{}
	// republish: the last publication failed.
	republish atomic.Bool
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New checks opts and makes a Driver.
func New(opts Options) (*Driver, error) {
	if opts.MPSD == nil {
		return nil, errors.New("dra: no mpsd client")
	}
	if opts.NodeName == "" {
		return nil, errors.New("dra: no node name")
	}
	if err := checkGroupNames(append(slices.Sorted(maps.Keys(opts.Limits)), opts.Groups...)); err != nil {
		return nil, err
	}
	if opts.CDIDir == "" {
		opts.CDIDir = DefaultCDIDir
	}
	if err := checkCDIDir(opts.CDIDir, os.Geteuid()); err != nil {
		return nil, err
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Edits == nil {
		opts.Edits = func(l *api.Lease, in api.InstanceStatus) (*pluginapi.ContainerAllocateResponse, error) {
			return deviceplugin.ContainerEdits(l, "/proc", "/dev", in.DaemonPID)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Driver{
		opts: opts, log: opts.Logger.With("node", opts.NodeName, "mode", opts.Mode.String()),
		ops: make(chan struct{}, 1), claims: map[types.UID]*claim{},
		leaseCtx: ctx, stopAll: cancel, since: map[string]time.Time{}, poke: make(chan struct{}, 1),
	}, nil
}

// lock takes ops, or fails when ctx ends first.
func (d *Driver) lock(ctx context.Context) error {
	select {
	case d.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *Driver) unlock() { <-d.ops }

// Run publishes the node's devices through pub and keeps the prepared
// claims' leases until ctx ends: every PollInterval (and at once after a
// lease's stream ended) it reads mpsd's status, adopts the leases of
// claims prepared before a restart, resumes or renews the leases that
// lost their stream, and publishes the devices again when they changed.
// It returns nil when ctx ends, leaving the leases to mpsd (closing their
// streams as mpsd stops keeps them for the next plugin).
func (d *Driver) Run(ctx context.Context, pub Publisher) error {
	defer d.stop()
	// Publishing blocks until the API server answers (the helper's
	// ResourceSlice controller syncs first): it has a goroutine of its
	// own, handed the latest devices, so leases are kept meanwhile.
	pending := make(chan []resourceapi.Device, 1)
	published := make(chan struct{})
	go func() {
		defer close(published)
		d.publish(ctx, pub, pending)
	}()
	defer func() { <-published }()
	var last []resourceapi.Device
	for {
		st, err := d.status(ctx)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				d.log.Debug("mpsd status", "err", err)
			}
		default:
			d.reconcile(ctx, st)
			devs := d.devices(st)
			if d.republish.Swap(false) || !reflect.DeepEqual(devs, last) {
				select {
				case <-pending: // superseded
				default:
				}
				pending <- devs
				last = devs
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-d.opts.Clock.After(d.opts.PollInterval):
		case <-d.poke:
		}
	}
}

// publish publishes each list of devices handed over on pending until
// ctx ends; one that fails is published again after the next poll.
func (d *Driver) publish(ctx context.Context, pub Publisher, pending <-chan []resourceapi.Device) {
	for {
		select {
		case <-ctx.Done():
			return
		case devs := <-pending:
			res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
				d.opts.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
			}}
			if err := pub.PublishResources(ctx, res); err != nil {
				if ctx.Err() == nil {
					d.log.Warn("cannot publish the node's ResourceSlice", "err", err)
					d.republish.Store(true)
				}
				continue
			}
			d.log.Info("published the node's devices", "devices", len(devs), "unavailable", tainted(devs))
		}
	}
}

func tainted(devs []resourceapi.Device) int {
	n := 0
	for _, dv := range devs {
		if len(dv.Taints) > 0 {
			n++
		}
	}
	return n
}

// devices are st's devices of the offered groups.
func (d *Driver) devices(st api.Status) []resourceapi.Device {
	st.Instances = slices.DeleteFunc(slices.Clone(st.Instances), func(in api.InstanceStatus) bool { return !d.offered(in.Group) })
	now := d.opts.Clock.Now()
	d.mu.Lock()
	for _, in := range st.Instances {
		name := DeviceName(in.Group, in.GPUIndex)
		if _, down := unavailable(in); !down {
			delete(d.since, name)
		} else if _, ok := d.since[name]; !ok {
			d.since[name] = now
		}
	}
	since := maps.Clone(d.since)
	d.mu.Unlock()
	return Devices(st, d.opts.Limits, d.opts.Mode, since)
}

func (d *Driver) offered(group string) bool {
	return len(d.opts.Groups) == 0 || slices.Contains(d.opts.Groups, group)
}

func (d *Driver) status(ctx context.Context) (api.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, grantTimeout)
	defer cancel()
	return d.opts.MPSD.Status(ctx)
}

// stop ends the lease streams without releasing what mpsd keeps: called
// once mpsd has stopped (or is stopping), whose leases outlive it.
func (d *Driver) stop() {
	d.mu.Lock()
	d.closed = true
	var streams []deviceplugin.LeaseStream
	for _, c := range d.claims {
		for _, l := range c.leases {
			if l.stream != nil {
				streams = append(streams, l.stream)
				l.stream = nil
			}
		}
	}
	d.mu.Unlock()
	d.stopAll()
	for _, s := range streams {
		_ = s.Close()
	}
	d.holders.Wait()
}

// HandleError logs the helper's background errors (publishing the
// ResourceSlice, its gRPC servers); none stops the driver, as none is
// mended by a restart of mpsd. A slice the API server dropped fields of
// means a cluster without consumable capacity: run with
// --kubelet-dra-capacity=whole.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) && d.opts.Mode == Consumable {
		d.log.Error("the API server dropped fields of the node's ResourceSlice: this cluster has no consumable capacity (Kubernetes before 1.36, or DRAConsumableCapacity off); restart mpsd with --kubelet-dra-capacity=whole", "err", err)
		return
	}
	d.log.Warn("DRA kubelet plugin: "+msg, "err", err, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}

// WatchHealthStatus is not offered: an instance's health reaches the
// scheduler as its device's taint.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// wake asks Run for a reconcile now.
func (d *Driver) wake() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// errf wraps err for a claim.
func errf(format string, args ...any) error { return fmt.Errorf("dra: "+format, args...) }
