package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/deviceplugin"
)

// jobPrefix starts the job id of a claim's lease: "dra:<claim uid>:<n>",
// n the index of its device among the claim's allocation results (their
// order is the allocation's, which does not change), so that a prepare
// after a restart of mpsd or the kubelet finds the lease.
const jobPrefix = "dra:"

// JobID is the job id of the lease of a claim's n-th allocated device.
func JobID(claim types.UID, n int) string {
	return jobPrefix + string(claim) + ":" + strconv.Itoa(n)
}

// ParseJobID reads a JobID; ok is false for any other job id.
func ParseJobID(s string) (claim types.UID, n int, ok bool) {
	rest, found := strings.CutPrefix(s, jobPrefix)
	if !found {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(rest[i+1:])
	if err != nil || n < 0 || strconv.Itoa(n) != rest[i+1:] {
		return "", 0, false
	}
	uid := rest[:i]
	if !validUID(types.UID(uid)) {
		return "", 0, false
	}
	return types.UID(uid), n, true
}

// claim is a prepared ResourceClaim: a lease per allocated device.
type claim struct {
	uid             types.UID
	namespace, name string
	leases          []*lease
	// specWritten: its CDI spec is on disk.
	specWritten bool
}

// lease is the lease of one allocated device of a claim. Its fields
// past n are guarded by Driver.mu.
type lease struct {
	c       *claim
	n       int
	request string
	pool    string
	device  string
	shareID *types.UID
	group   string
	gpu     int
	req     api.LeaseRequest
	// adopted: taken over from mpsd's status by job id (adoptOnce), not
	// yet checked against its claim's allocation (job ids are free text).
	adopted bool

	id      string // "" while mpsd holds none
	attempt int
	stream  deviceplugin.LeaseStream
	granted *api.Lease
	edits   *pluginapi.ContainerAllocateResponse
	ended   bool
	// retries and retryAt pace reconcile's attempts to get it back.
	retries int
	retryAt time.Time
}

// PrepareResourceClaims gives each claim a lease on mpsd per device
// allocated to it by this driver, and a CDI spec that hands the
// container each lease's environment and mounts. A claim prepared
// before (by this process, or by one before a restart: its leases are
// found by their job id) gets the same leases and devices again. A
// lease mpsd refuses fails the claim with mpsd's reason (ErrRefused),
// and the claim's other leases made by this call are released.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if err := d.lock(ctx); err != nil {
		return nil, err
	}
	defer d.unlock()
	st, err := d.status(ctx)
	if err != nil {
		return nil, errf("mpsd status: %w", err)
	}
	d.adoptOnce(st)
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, rc := range claims {
		devs, err := d.prepare(ctx, st, rc)
		if err != nil {
			d.log.Warn("cannot prepare claim", "namespace", rc.Namespace, "claim", rc.Name, "uid", rc.UID, "err", err)
		}
		out[rc.UID] = kubeletplugin.PrepareResult{Devices: devs, Err: err}
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, st api.Status, rc *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if err := checkUID(rc.UID); err != nil {
		return nil, err
	}
	if rc.Status.Allocation == nil {
		return nil, errf("claim %s/%s is not allocated", rc.Namespace, rc.Name)
	}
	d.mu.Lock()
	c := d.claims[rc.UID]
	fresh := c == nil
	if fresh {
		c = &claim{uid: rc.UID}
		d.claims[rc.UID] = c
	}
	c.namespace, c.name = rc.Namespace, rc.Name
	d.mu.Unlock()

	var made []*lease
	fail := func(err error) ([]kubeletplugin.Device, error) {
		for _, l := range made {
			_ = d.release(ctx, l, "its claim could not be prepared") // logged; made by this call, it has its stream
		}
		d.mu.Lock()
		if fresh && len(c.leases) == 0 {
			delete(d.claims, rc.UID)
		}
		d.mu.Unlock()
		return nil, err
	}
	var devs []kubeletplugin.Device
	for n, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != d.opts.NodeName {
			return fail(errf("claim %s/%s: device %s is of pool %s, not this node's", rc.Namespace, rc.Name, r.Device, r.Pool))
		}
		l := d.leaseOf(c, n)
		if l != nil && l.adopted {
			if why := d.mismatch(st, l, r, JobID(rc.UID, n)); why != "" {
				if err := d.release(ctx, l, why); err != nil {
					return fail(err)
				}
				l = nil
			} else {
				d.mu.Lock()
				l.adopted = false
				d.mu.Unlock()
			}
		}
		if l == nil {
			in, err := instanceOf(st, r.Device)
			if err != nil {
				return fail(err)
			}
			if !d.offered(in.Group) {
				return fail(fmt.Errorf("%w: group %s is not offered to the kubelet", ErrNoInstance, in.Group))
			}
			req, err := d.leaseRequest(in, r, JobID(rc.UID, n))
			if err != nil {
				return fail(err)
			}
			l = &lease{c: c, n: n, group: in.Group, gpu: in.GPUIndex, req: req}
			if err := d.open(ctx, l, in, l.req); err != nil {
				return fail(err)
			}
			made = append(made, l)
		} else if l.stream == nil {
			// Adopted after a restart, or lost since: resumed (or
			// renewed) before its container is given it.
			if err := d.regain(ctx, st, l); err != nil {
				return fail(err)
			}
		}
		d.mu.Lock()
		l.request, l.pool, l.device, l.shareID = r.Request, r.Pool, r.Device, r.ShareID
		d.mu.Unlock()
		devs = append(devs, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{CDIDeviceID(rc.UID, n)}, ShareID: r.ShareID,
		})
	}
	if err := d.writeSpec(c); err != nil {
		return fail(err)
	}
	if len(made) > 0 {
		d.log.Info("prepared claim", "namespace", rc.Namespace, "claim", rc.Name, "uid", rc.UID, "leases", len(made))
	}
	d.writeStatus(ctx, c)
	return devs, nil
}

// leaseOf is c's lease of its n-th device, if it has one.
func (d *Driver) leaseOf(c *claim, n int) *lease {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range c.leases {
		if l.n == n && !l.ended {
			return l
		}
	}
	return nil
}

// mismatch says why adopted lease l is not what allocation r asks for
// (another device, SM or memory: a lease someone else gave the claim's
// job id), or "".
func (d *Driver) mismatch(st api.Status, l *lease, r resourceapi.DeviceRequestAllocationResult, job string) string {
	if dev := DeviceName(l.group, l.gpu); dev != r.Device {
		return "it is of device " + dev + ", not the allocated " + r.Device
	}
	in, err := instanceOf(st, r.Device)
	if err != nil {
		return "" // regain fails the claim
	}
	want, err := d.leaseRequest(in, r, job)
	if err != nil {
		return err.Error()
	}
	if want.SM != l.req.SM || want.MemBytes != l.req.MemBytes {
		return fmt.Sprintf("it is of sm %d, memory %d bytes, not the allocated sm %d, memory %d bytes", l.req.SM, l.req.MemBytes, want.SM, want.MemBytes)
	}
	return ""
}

// leaseRequest is the lease of allocation r on instance in: in
// Consumable mode the sm and memory it consumed (a request without them
// took the requestPolicy's defaults, which the scheduler writes into
// ConsumedCapacity; an allocation without both is refused, as mpsd's
// defaults would not be what the scheduler counted), in Whole mode the most the group allows one lease
// on the instance; confined to the instance's GPUs, never queued, never
// requeued (a revoked lease ends, and the driver asks for a new one once
// the instance is ready).
func (d *Driver) leaseRequest(in api.InstanceStatus, r resourceapi.DeviceRequestAllocationResult, job string) (api.LeaseRequest, error) {
	lim := d.opts.Limits[in.Group]
	var sm, mem int64
	if d.opts.Mode == Consumable {
		qs, okSM := r.ConsumedCapacity[CapacitySM]
		qm, okMem := r.ConsumedCapacity[CapacityMemory]
		if !okSM || !okMem {
			return api.LeaseRequest{}, errf("device %s: the allocation consumed no %s and %s (an API server without consumable capacity needs --kubelet-dra-capacity=whole)", r.Device, CapacitySM, CapacityMemory)
		}
		sm, mem = qs.Value(), qm.Value()
	} else {
		sm, mem = int64(in.SMBudget), in.MemBudgetBytes
		if lim.MaxSM > 0 {
			sm = min(sm, int64(lim.MaxSM))
		}
		if lim.MaxMem > 0 {
			mem = min(mem, lim.MaxMem)
		}
	}
	if sm < 0 || sm > 100 || mem < 0 {
		return api.LeaseRequest{}, errf("device %s: consumed capacity sm %d, memory %s out of range", r.Device, sm, resource.NewQuantity(mem, resource.BinarySI))
	}
	zero := 0
	sel := in.GPUUUIDs
	if len(sel) == 0 {
		sel = []string{in.GPUUUID}
	}
	return api.LeaseRequest{
		Group: in.Group, SM: int(sm), MemBytes: mem, GPUs: max(len(in.GPUIndexes), 1),
		GPUSelect: slices.Clone(sel), RequeueAttempts: &zero, NoWait: true, JobID: job,
	}, nil
}

// open sends req (l's request, or the resumption of its lease) and waits
// for mpsd's grant on instance in; the stream then holds the lease,
// followed by a goroutine of its own.
func (d *Driver) open(ctx context.Context, l *lease, in api.InstanceStatus, req api.LeaseRequest) error {
	ctx, cancel := context.WithTimeout(ctx, grantTimeout)
	defer cancel()
	s, err := d.opts.MPSD.Lease(d.leaseCtx, req)
	if err != nil {
		return refused(err, l)
	}
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	for {
		ev, err := s.Next()
		if err != nil {
			stop()
			_ = s.Close()
			if ctx.Err() != nil {
				return errf("mpsd did not answer the lease of device %s in time: %w", DeviceName(l.group, l.gpu), ctx.Err())
			}
			return refused(err, l)
		}
		switch ev.Type {
		case api.EventGranted:
			stop()
			edits, err := d.opts.Edits(ev.Lease, in)
			if err != nil {
				_ = s.Close()
				return errf("lease %s of device %s cannot be given to a container: %w", ev.Lease.ID, DeviceName(l.group, l.gpu), err)
			}
			if !d.hold(l, s, ev.Lease, edits) {
				_ = s.Close()
				return errf("the DRA driver is stopping")
			}
			return nil
		case api.EventError:
			stop()
			_ = s.Close()
			return refused(&api.Error{Code: ev.Code, Message: ev.Message}, l)
		}
	}
}

// refused words mpsd's refusal of l: the reason reaches the pod's events.
func refused(err error, l *lease) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("%w: sm %d, memory %s of group %s on GPU %d: %s", ErrRefused, l.req.SM,
			resource.NewQuantity(l.req.MemBytes, resource.BinarySI), l.group, l.gpu, ae.Message)
	}
	return errf("lease of group %s on GPU %d: %w", l.group, l.gpu, err)
}

// hold records s as the stream of l's lease (granted, with edits when
// known) and follows it; l joins its claim here. It reports false once
// the driver has stopped or l ended.
func (d *Driver) hold(l *lease, s deviceplugin.LeaseStream, g *api.Lease, edits *pluginapi.ContainerAllocateResponse) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || l.ended {
		return false
	}
	l.stream, l.id, l.attempt, l.retries = s, g.ID, g.Attempt, 0
	if edits != nil {
		l.granted, l.edits = g, edits
	}
	if !slices.Contains(l.c.leases, l) {
		l.c.leases = append(l.c.leases, l)
	}
	d.holders.Add(1)
	go d.follow(l, s)
	return true
}

// follow reads a lease's events until its stream ends. A stream the
// driver did not close itself leaves l without one: reconcile then
// resumes the lease (mpsd restarted) or asks for a new one (mpsd ended
// it).
func (d *Driver) follow(l *lease, s deviceplugin.LeaseStream) {
	defer d.holders.Done()
	defer func() { _ = s.Close() }()
	log := d.log.With(d.claimAttrs(l.c)...).With("group", l.group, "gpu", l.gpu)
	for {
		ev, err := s.Next()
		if err != nil {
			d.mu.Lock()
			lost, id := l.stream == s, l.id
			if lost {
				l.stream = nil
			}
			d.mu.Unlock()
			if lost {
				log.Info("lease stream ended (mpsd stopping?); the lease is resumed when mpsd answers", "lease", id, "err", err)
				d.wake()
			}
			return
		}
		switch ev.Type {
		case api.EventGranted:
			d.mu.Lock()
			l.id, l.attempt = ev.Lease.ID, ev.Lease.Attempt
			d.mu.Unlock()
		case api.EventRevoked:
			d.mu.Lock()
			id := l.id
			d.mu.Unlock()
			log.Warn("lease revoked: the claim's CUDA clients died with their MPS server; the kubelet restarts the container", "lease", id, "reason", ev.Reason)
		case api.EventError:
			d.mu.Lock()
			lost := l.stream == s
			if lost {
				l.stream, l.id = nil, ""
			}
			d.mu.Unlock()
			if lost {
				log.Warn("mpsd ended the claim's lease; a new one is asked for once the instance is ready", "code", ev.Code, "message", ev.Message)
				d.wake()
			}
			return
		}
	}
}

// UnprepareResourceClaims releases each claim's leases and removes its
// CDI spec. A claim not prepared (or unprepared before) is no error.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	if err := d.lock(ctx); err != nil {
		return nil, err
	}
	defer d.unlock()
	st, serr := d.status(ctx)
	if serr == nil {
		d.adoptOnce(st)
	}
	d.mu.Lock()
	adopted := d.adopted
	d.mu.Unlock()
	out := map[types.UID]error{}
	for _, o := range claims {
		if err := checkUID(o.UID); err != nil {
			d.log.Warn("cannot unprepare claim", "namespace", o.Namespace, "claim", o.Name, "uid", o.UID, "err", err)
			out[o.UID] = err
			continue
		}
		if !adopted {
			// The leases of claims prepared before a restart are not
			// known yet: one of them may be this claim's. The kubelet
			// retries.
			out[o.UID] = errf("mpsd status (the leases of claims prepared before a restart are not known yet): %w", serr)
			continue
		}
		d.mu.Lock()
		c := d.claims[o.UID]
		delete(d.claims, o.UID)
		var ls []*lease
		if c != nil {
			ls = slices.Clone(c.leases)
		}
		d.mu.Unlock()
		var errs []error
		for _, l := range ls {
			if err := d.release(ctx, l, "its claim was unprepared"); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			// The kubelet retries: the claim keeps the leases not
			// released, and its spec.
			d.mu.Lock()
			if d.claims[o.UID] == nil {
				d.claims[o.UID] = c
			}
			d.mu.Unlock()
			out[o.UID] = errors.Join(errs...)
			continue
		}
		out[o.UID] = d.removeSpec(o.UID)
		if c != nil {
			d.log.Info("unprepared claim", "namespace", o.Namespace, "claim", o.Name, "uid", o.UID, "leases", len(ls))
		}
	}
	return out, nil
}

// release ends l's lease: closing its stream makes mpsd release it. A
// lease no stream holds (mpsd restarted meanwhile) is resumed and closed
// at once; when that fails, but for mpsd not knowing the lease (it ended),
// l stays its claim's, for a later release, and the error is returned.
func (d *Driver) release(ctx context.Context, l *lease, why string) error {
	d.mu.Lock()
	if l.ended {
		d.mu.Unlock()
		return nil
	}
	l.ended = true
	l.c.leases = slices.DeleteFunc(l.c.leases, func(m *lease) bool { return m == l })
	s, id, attempt := l.stream, l.id, l.attempt
	l.stream = nil
	d.mu.Unlock()
	log := d.log.With(d.claimAttrs(l.c)...).With("group", l.group, "gpu", l.gpu, "lease", id)
	log.Info("releasing lease: " + why)
	if s != nil {
		_ = s.Close()
		return nil
	}
	if id == "" {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, grantTimeout)
	defer cancel()
	s, err := d.opts.MPSD.Lease(rctx, api.LeaseRequest{Group: l.group, ResumeLeaseID: id, Attempt: attempt, JobID: l.req.JobID})
	if err == nil {
		_ = s.Close()
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
		return nil
	}
	d.mu.Lock()
	l.ended = false
	if !slices.Contains(l.c.leases, l) {
		l.c.leases = append(l.c.leases, l)
	}
	d.mu.Unlock()
	log.Warn("cannot release lease; kept for a later try", "err", err)
	return errf("release lease %s of group %s on GPU %d: %w", id, l.group, l.gpu, err)
}

// claimAttrs are c's log attributes: its namespace, name and UID.
func (d *Driver) claimAttrs(c *claim) []any {
	d.mu.Lock()
	defer d.mu.Unlock()
	return []any{"namespace", c.namespace, "claim", c.name, "uid", c.uid}
}
