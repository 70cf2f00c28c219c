package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/kubeinfo"
	"github.com/mpsd/mpsd/internal/mpsenv"
	"github.com/mpsd/mpsd/mps"
)

// EnvVisibleDevices tells the NVIDIA container toolkit which GPUs (UUIDs)
// to give a container, with their device nodes and driver libraries.
const EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// shmDir is where MPS servers and clients share memory. A pod gets its
// instance's private shared-memory directory there (mps.ShmDirFor the
// pipe directory), which mpsd made the /dev/shm of that instance's control
// daemon and servers (mps.PrivateShm): never the host's /dev/shm, which
// holds every other tenant's and the host's shared memory.
const shmDir = mps.DevShm

// maskedEntries are the pipe directory's entries that a pod must not
// reach: NVIDIA's daemon makes the log FIFO world-writable and copies every
// record written into it, with the kind and pid the writer chose, into
// control.log or server.log, which mpsd reads; and the pid file 0666. A
// CUDA client needs neither (it talks to the daemon through the control
// socket). control_lock is the daemon's lock: a pod that could lock or
// replace it could make the next mpsd take a live daemon's files for
// stale. They are mounted over with /dev/null, read-only, as runc masks
// paths: a write there goes nowhere, a read finds nothing. The pipe
// directory itself is mounted read-only, so a pod's root can neither
// unlink nor replace what is in it (connecting to the control socket
// needs no write access to the mount).
var maskedEntries = []string{"log", "nvidia-cuda-mps-control.pid", "control_lock"}

// maskSource is what a masked entry is mounted from.
const maskSource = "/dev/null"

// allocation is one container's units, as the kubelet allocated them, and
// the lease on mpsd that backs them. The lease is held for as long as the
// allocation lives: until the kubelet hands one of its units out again
// (the pod has ended), or the plugin stops.
type allocation struct {
	group string
	gpu   int   // the instance's first GPU
	units []int // sorted

	// Guarded by Plugin.mu.
	leaseID string // "" when mpsd ended the lease
	attempt int
	// stream holds the lease; nil while no stream does (mpsd restarted,
	// or ended the lease): reconcile resumes it or asks anew.
	stream LeaseStream
	ended  bool // released; no longer in Plugin.allocs
	// retryAt and retries pace reconcile's attempts to get a lease back.
	retryAt time.Time
	retries int
	// pod is the container the kubelet lists holding the units
	// (trackPods), podSeen whether it ever listed one, podMissing since
	// when it lists none; bindWarned the lease/container whose binding
	// failed and was reported.
	pod        kubeinfo.ContainerRef
	podSeen    bool
	podMissing time.Time
	bindWarned string
}

// allocate leases one container's units: all on one instance of g, held
// for the container by a new lease of that many SM percent on mpsd.
func (p *Plugin) allocate(ctx context.Context, g *group, ids []string) (*pluginapi.ContainerAllocateResponse, *allocation, error) {
	gpu, units, err := parseUnits(g.name, ids)
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st, err := p.status(ctx)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "mpsd: %v", err)
	}
	in, ok := findInstance(st, g.name, gpu)
	if !ok {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "mpsd runs no instance of group %s on GPU %d", g.name, gpu)
	}
	if last := units[len(units)-1]; last >= in.SMBudget {
		return nil, nil, status.Errorf(codes.InvalidArgument, "unit %d of group %s on GPU %d is beyond its SM budget of %d", last, g.name, gpu, in.SMBudget)
	}
	// The kubelet hands a unit out again only once the pod that had it
	// has ended: its lease goes first.
	for _, old := range p.overlapping(g.name, gpu, units) {
		p.release(ctx, old, "its units were handed out again")
	}
	a := &allocation{group: g.name, gpu: gpu, units: units}
	req := leaseRequest(in, units)
	if p.releasePending(st, g.name) {
		// mpsd may not have finished a release yet: wait for it in the
		// queue, for a bounded time.
		req.NoWait, req.WaitMillis = false, p.opts.ReleaseWait.Milliseconds()
	}
	wctx, cancel := context.WithTimeout(ctx, p.opts.ReleaseWait+grantTimeout)
	defer cancel()
	lease, err := p.open(wctx, a, req)
	if err != nil {
		return nil, nil, leaseError(err, g.name, gpu, len(units))
	}
	resp, err := p.containerResponse(lease, in.DaemonPID)
	if err != nil {
		p.release(ctx, a, "its container cannot be given the lease")
		if _, ok := status.FromError(err); ok {
			return nil, nil, err
		}
		return nil, nil, status.Error(codes.Internal, err.Error())
	}
	g.log.Info("allocated", "gpu", gpu, "units", len(units), "lease", lease.ID, "job_id", req.JobID)
	return resp, a, nil
}

// leaseRequest asks for units SM percent of instance in, confined to its
// GPUs, with memory in proportion: units/sm_budget of the group's memory
// budget, so the units the kubelet counts are the only thing that can run
// out. It is never requeued: a revoked lease ends, and reconcile asks for
// a new one once the instance is ready (a requeued lease would wait at the
// head of the group's queue and hold up every other allocation).
func leaseRequest(in api.InstanceStatus, units []int) api.LeaseRequest {
	zero := 0
	gpus := max(len(in.GPUIndexes), 1)
	sel := in.GPUUUIDs
	if len(sel) == 0 {
		sel = []string{in.GPUUUID}
	}
	return api.LeaseRequest{
		Group: in.Group, SM: len(units), MemBytes: memFor(in, len(units)), GPUs: gpus,
		GPUSelect: slices.Clone(sel), RequeueAttempts: &zero, NoWait: true, JobID: jobID(units),
	}
}

// memFor is units/sm_budget of the instance's memory budget, in whole
// MiB, at least 1 MiB; 0 (the group's default_mem) without a budget.
func memFor(in api.InstanceStatus, units int) int64 {
	if in.SMBudget <= 0 || in.MemBudgetBytes <= 0 {
		return 0
	}
	mem := in.MemBudgetBytes * int64(units) / int64(in.SMBudget)
	return max(mem&^(1<<20-1), 1<<20)
}

func findInstance(st api.Status, group string, gpu int) (api.InstanceStatus, bool) {
	for _, in := range st.Instances {
		if in.Group == group && in.GPUIndex == gpu {
			return in, true
		}
	}
	return api.InstanceStatus{}, false
}

// leaseError words mpsd's refusal for the kubelet (it shows in the pod's
// events).
func leaseError(err error, group string, gpu, units int) error {
	var ae *api.Error
	if !errors.As(err, &ae) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return status.Errorf(codes.DeadlineExceeded, "mpsd did not grant %d SM units of group %s on GPU %d in time", units, group, gpu)
		}
		return status.Errorf(codes.Unavailable, "lease %d SM units of group %s on GPU %d: %v", units, group, gpu, err)
	}
	c := codes.Internal
	switch ae.Code {
	case api.CodeWaitTimeout:
		c = codes.ResourceExhausted
	case api.CodeRefused, api.CodeForbidden:
		c = codes.FailedPrecondition
	case api.CodeUnavailable:
		c = codes.Unavailable
	case api.CodeBadRequest:
		c = codes.InvalidArgument
	}
	return status.Errorf(c, "mpsd refused %d SM units of group %s on GPU %d: %s", units, group, gpu, ae.Message)
}

// open asks mpsd for a's lease and waits, within ctx, for its grant; the
// stream then holds the lease for a, followed by a holder goroutine. A
// refusal is an *api.Error.
func (p *Plugin) open(ctx context.Context, a *allocation, req api.LeaseRequest) (*api.Lease, error) {
	s, err := p.opts.MPSD.Lease(p.leaseCtx, req)
	if err != nil {
		return nil, err
	}
	// A Next blocked past ctx's end is woken by closing the stream.
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	fail := func(err error) (*api.Lease, error) {
		stop()
		_ = s.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	for {
		ev, err := s.Next()
		if err != nil {
			return fail(err)
		}
		switch ev.Type {
		case api.EventGranted:
			if !stop() {
				return fail(ctx.Err())
			}
			if !p.hold(a, s, ev.Lease) {
				_ = s.Close()
				return nil, &api.Error{Code: api.CodeUnavailable, Message: "the device plugin is stopping"}
			}
			return ev.Lease, nil
		case api.EventError:
			return fail(&api.Error{Code: ev.Code, Message: ev.Message})
		}
	}
}

// resume rebinds a's lease, which mpsd kept when its stream ended (mpsd
// restarted), to a new stream.
func (p *Plugin) resume(a *allocation, id string, attempt int) error {
	s, err := p.opts.MPSD.Lease(p.leaseCtx, api.LeaseRequest{Group: a.group, ResumeLeaseID: id, Attempt: attempt, JobID: jobID(a.units)})
	if err != nil {
		return err
	}
	if !p.hold(a, s, &api.Lease{ID: id, Attempt: attempt}) {
		_ = s.Close()
		return errors.New("the device plugin is stopping")
	}
	return nil
}

// hold records s as the stream of a's lease and follows it in a goroutine
// of its own. A new allocation joins Plugin.allocs here. It reports false
// once the plugin has stopped.
func (p *Plugin) hold(a *allocation, s LeaseStream, l *api.Lease) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || a.ended {
		return false
	}
	a.stream, a.leaseID, a.attempt = s, l.ID, l.Attempt
	a.retries, a.retryAt = 0, time.Time{}
	if !slices.Contains(p.allocs, a) {
		p.allocs = append(p.allocs, a)
	}
	p.holders.Add(1)
	go p.follow(a, s)
	return true
}

// follow reads a lease's events until the stream ends. A stream the
// plugin did not close itself leaves a without one: reconcile then resumes
// the lease (mpsd restarted) or asks for a new one (mpsd ended it).
func (p *Plugin) follow(a *allocation, s LeaseStream) {
	defer p.holders.Done()
	defer func() { _ = s.Close() }()
	log := p.log.With("group", a.group, "gpu", a.gpu, "units", len(a.units))
	for {
		ev, err := s.Next()
		if err != nil {
			p.mu.Lock()
			lost, id := a.stream == s, a.leaseID
			if lost {
				a.stream = nil
			}
			p.mu.Unlock()
			if lost {
				log.Info("lease stream ended (mpsd stopping?); the lease is resumed when mpsd answers", "lease", id, "err", err)
				p.poke()
			}
			return
		}
		switch ev.Type {
		case api.EventGranted:
			p.mu.Lock()
			a.leaseID, a.attempt = ev.Lease.ID, ev.Lease.Attempt
			p.mu.Unlock()
		case api.EventRevoked:
			p.mu.Lock()
			id := a.leaseID
			p.mu.Unlock()
			log.Warn("lease revoked: the container's CUDA clients died with their MPS server; the kubelet restarts the container", "lease", id, "reason", ev.Reason)
			p.poke()
		case api.EventError:
			p.mu.Lock()
			lost := a.stream == s
			if lost {
				a.stream, a.leaseID = nil, ""
			}
			ref, seen := a.pod, a.podSeen
			p.mu.Unlock()
			switch {
			case lost && ev.Code == api.CodeLimitExceeded && seen:
				// mpsd ended the container's CUDA processes: the kubelet
				// restarts the container, bound to the new lease.
				log.Error("pod over its lease's limits: mpsd ended its container's CUDA processes and the lease; a new lease is asked for, and bound to the container the kubelet restarts",
					"namespace", ref.Namespace, "pod", ref.Pod, "container", ref.Container, "code", ev.Code, "message", ev.Message)
			case lost:
				log.Warn("mpsd ended the lease; a new one is asked for once the instance is ready", "code", ev.Code, "message", ev.Message)
			}
			if lost {
				p.poke()
			}
			return
		}
	}
}

// overlapping takes the allocations of group on gpu that share a unit
// with units out of the table.
func (p *Plugin) overlapping(group string, gpu int, units []int) []*allocation {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*allocation
	for _, a := range p.allocs {
		if a.group == group && a.gpu == gpu && overlaps(a.units, units) {
			out = append(out, a)
		}
	}
	return out
}

// releaseFree releases the allocations holding a unit the kubelet lists
// as available: their pods have ended.
func (p *Plugin) releaseFree(ctx context.Context, group string, available []string) {
	free := map[int][]int{}
	for _, id := range available {
		if u, err := ParseUnit(id); err == nil && u.Group == group {
			free[u.GPU] = append(free[u.GPU], u.N)
		}
	}
	for gpu, ns := range free {
		slices.Sort(ns)
		for _, a := range p.overlapping(group, gpu, ns) {
			p.release(ctx, a, "its units were handed out again")
		}
	}
}

// release ends a's lease, for why: closing its stream makes mpsd release
// it (it kills nothing: the pod's processes are the kubelet's). A lease
// that no stream holds (mpsd restarted meanwhile) is resumed and closed at
// once, so mpsd does not keep it through its reconnect grace.
func (p *Plugin) release(ctx context.Context, a *allocation, why string) {
	p.mu.Lock()
	if a.ended {
		p.mu.Unlock()
		return
	}
	a.ended = true
	p.allocs = slices.DeleteFunc(p.allocs, func(b *allocation) bool { return b == a })
	s, id, attempt := a.stream, a.leaseID, a.attempt
	a.stream = nil
	if id != "" {
		p.releasing[id] = a.group
	}
	p.mu.Unlock()
	p.log.Info("releasing lease: "+why, "group", a.group, "gpu", a.gpu, "lease", id, "units", len(a.units))
	if s != nil {
		_ = s.Close()
		return
	}
	if id == "" {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	if s, err := p.opts.MPSD.Lease(rctx, api.LeaseRequest{Group: a.group, ResumeLeaseID: id, Attempt: attempt}); err == nil {
		_ = s.Close()
	}
}

// releasePending reports whether a lease of group the plugin released
// is still listed by mpsd.
func (p *Plugin) releasePending(st api.Status, group string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range st.Leases {
		if g, ok := p.releasing[l.ID]; ok && g == group {
			return true
		}
	}
	return false
}

// reconcile brings the allocations in line with mpsd's status: on the
// first status it adopts the leases an earlier plugin left (their job id
// names their units), it forgets released leases mpsd no longer lists,
// and it gets a lease back for every allocation that lost its stream:
// resuming the lease if mpsd still has it, else asking for a new one once
// the instance is ready.
func (p *Plugin) reconcile(ctx context.Context, st api.Status) {
	known := map[string]api.LeaseStatus{}
	for _, l := range st.Leases {
		known[l.ID] = l
	}
	p.mu.Lock()
	for id := range p.releasing {
		if _, ok := known[id]; !ok {
			delete(p.releasing, id)
		}
	}
	if !p.adopted {
		p.adopted = true
		p.adoptLocked(st)
	}
	now := time.Now()
	type todo struct {
		a       *allocation
		id      string
		attempt int
	}
	var work []todo
	for _, a := range p.allocs {
		if a.stream != nil || a.ended || now.Before(a.retryAt) {
			continue
		}
		if l, ok := known[a.leaseID]; a.leaseID != "" && (!ok || l.Group != a.group) {
			a.leaseID = "" // mpsd lost it
		}
		work = append(work, todo{a, a.leaseID, a.attempt})
	}
	p.mu.Unlock()

	for _, w := range work {
		a := w.a
		log := p.log.With("group", a.group, "gpu", a.gpu, "units", len(a.units))
		var err error
		if w.id != "" {
			if err = p.resume(a, w.id, known[w.id].Attempt); err == nil {
				log.Info("lease resumed", "lease", w.id)
				continue
			}
		} else {
			in, ok := findInstance(st, a.group, a.gpu)
			if !ok || in.State != api.InstanceReady {
				continue // its units are unhealthy; wait for the instance
			}
			ctx, cancel := context.WithTimeout(ctx, grantTimeout)
			var l *api.Lease
			l, err = p.open(ctx, a, leaseRequest(in, a.units))
			cancel()
			if err == nil {
				log.Info("lease renewed for a running allocation", "lease", l.ID)
				continue
			}
		}
		p.mu.Lock()
		if w.id != "" {
			var ae *api.Error
			if errors.As(err, &ae) && (ae.Code == api.CodeNotFound || ae.Code == api.CodeConflict || ae.Code == api.CodeForbidden) {
				a.leaseID = ""
			}
		}
		a.retries++
		a.retryAt = time.Now().Add(min(time.Second<<min(a.retries, 6), maxLeaseRetry))
		retries := a.retries
		p.mu.Unlock()
		if retries == 1 {
			log.Warn("cannot get the lease of a running allocation back; retrying", "err", err)
		}
	}
}

// adoptLocked takes over the running leases of this uid whose job id the
// plugin made: an earlier plugin's allocations, kept by mpsd across its
// restart. They are resumed by the reconcile that follows.
func (p *Plugin) adoptLocked(st api.Status) {
	for _, l := range st.Leases {
		units, ok := parseJobID(l.JobID)
		if !ok || l.UID != p.uid || l.State != api.LeaseRunning || len(l.GPUIndexes) == 0 ||
			len(p.opts.Groups) > 0 && !slices.Contains(p.opts.Groups, l.Group) {
			continue
		}
		a := &allocation{group: l.Group, gpu: l.GPUIndexes[0], units: units, leaseID: l.ID, attempt: l.Attempt}
		p.allocs = append(p.allocs, a)
		p.log.Info("adopting the lease of an allocation made before a restart", "group", l.Group, "gpu", a.gpu, "lease", l.ID, "job_id", l.JobID)
	}
}

// containerResponse is what the container gets for a lease
// (ContainerEdits).
func (p *Plugin) containerResponse(l *api.Lease, daemonPID int) (*pluginapi.ContainerAllocateResponse, error) {
	return ContainerEdits(l, p.opts.ProcRoot, p.opts.DevRoot, daemonPID)
}

// ContainerEdits is what a container gets for lease l of an instance whose
// control daemon is daemonPID: the MPS environment of the lease, the GPUs
// for the NVIDIA container toolkit, the instance's pipe directory with its
// log FIFO and pid file masked (podMounts), the instance's private
// shared-memory directory as /dev/shm, and on a host with NVIDIA's driver
// the GPUs' device nodes (procRoot and devRoot are where /proc and /dev
// are). The kubelet's DRA driver (package dra) gives its claims the same.
// An instance without a private /dev/shm its daemon shares is a
// FailedPrecondition status error.
func ContainerEdits(l *api.Lease, procRoot, devRoot string, daemonPID int) (*pluginapi.ContainerAllocateResponse, error) {
	envs := map[string]string{}
	for _, k := range []string{api.EnvPipeDirectory, api.EnvThreadPercentage, api.EnvPinnedMemLimit, api.EnvLeaseID, api.EnvGroup} {
		v, ok := l.Env[k]
		if !ok {
			return nil, fmt.Errorf("deviceplugin: lease %s has no %s", l.ID, k)
		}
		envs[k] = v
	}
	// Set only where the driver's MPS takes it.
	if v, ok := l.Env[api.EnvClientPriority]; ok {
		envs[api.EnvClientPriority] = v
	}
	envs[EnvVisibleDevices] = strings.Join(l.GPUUUIDs, ",")
	// The GPUs as the container's CUDA client enumerates them, which the
	// lease's pinned memory limits are relative to (mpsenv).
	envs[mpsenv.VisibleDevices] = strings.Join(l.GPUUUIDs, ",")
	if err := mpsenv.Check(func(k string) (string, bool) { v, ok := envs[k]; return v, ok }); err != nil {
		// A container under this environment would run without (some
		// of) the lease's limits: refuse it rather than start it so.
		return nil, fmt.Errorf("deviceplugin: lease %s: %w", l.ID, err)
	}
	mounts, err := podMounts(envs[api.EnvPipeDirectory], procRoot, daemonPID)
	if err != nil {
		return nil, err
	}
	resp := &pluginapi.ContainerAllocateResponse{Envs: envs, Mounts: mounts}
	devs, err := deviceNodes(procRoot, devRoot, l.GPUUUIDs)
	if err != nil {
		return nil, err
	}
	resp.Devices = devs
	return resp, nil
}

// podMounts are the mounts of a container of the instance whose pipe
// directory is pipe, in the order runc must apply them: the pipe
// directory (the control socket, and whatever the daemon and its servers
// create there later), then over it each masked entry the daemon made,
// then the instance's shared-memory directory at /dev/shm. runc mounts in
// the order of the OCI spec; the kubelet keeps the plugin's order and the
// CRI runtimes sort the container's mounts by the depth of their
// destination only, stably (containerd and CRI-O, as Docker did), so a
// mask inside the pipe directory always lands after the pipe directory,
// and only those two orders matter.
//
// That directory must be the instance's private /dev/shm, a tmpfs of its
// own (mps.MountShm: bounded by the group's shm_size), and the instance's
// control daemon (daemonPID, as mpsd reports it) must have it as its
// /dev/shm, or the pod's clients would not share
// memory with its servers: a daemon adopted from an mpsd that did not
// serve the group to the kubelet has the host's, and is refused until it
// is restarted.
//
// An entry that does not exist is not masked: the runtime would create
// it, as root, in the host's pipe directory (a pid file where 535 writes
// none). A daemon that runs makes its FIFO before it answers, so an
// instance that is ready has it. A mask covers the entry the pod found
// at its start: should the daemon be restarted while the pod runs (its
// servers, and so the pod's CUDA contexts, die with it), the new daemon's
// FIFO is not masked in that pod until its container restarts; there,
// only mpsd's rule to take a log line for a hint it checks, never for a
// fact, keeps a forged record harmless.
func podMounts(pipe, procRoot string, daemonPID int) ([]*pluginapi.Mount, error) {
	if pipe == "" || !filepath.IsAbs(pipe) {
		return nil, fmt.Errorf("deviceplugin: pipe directory %q is not an absolute path", pipe)
	}
	shm := mps.ShmDirFor(pipe)
	fi, err := os.Lstat(shm)
	if err != nil || !fi.IsDir() || fi.Mode()&os.ModeSticky == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "the instance of pipe directory %s has no private /dev/shm at %s (mpsd makes one for the groups it serves with --kubelet-device-plugin, at the daemon's start; a daemon started without it must be restarted): %v", pipe, shm, err)
	}
	if err := mps.IsShm(shm); err != nil {
		// A plain directory (an earlier mpsd's) is unbounded: what the pod
		// writes there would fill run_dir's file system.
		return nil, status.Errorf(codes.FailedPrecondition, "the private /dev/shm of pipe directory %s at %s is not a tmpfs of its own (its daemon was started by an mpsd before shm_size; restart the instance): %v", pipe, shm, err)
	}
	var daemonShm os.FileInfo
	if daemonPID > 0 {
		daemonShm, err = os.Stat(filepath.Join(procRoot, strconv.Itoa(daemonPID), "root", shmDir))
	}
	if daemonShm == nil || !os.SameFile(daemonShm, fi) {
		return nil, status.Errorf(codes.FailedPrecondition, "the MPS control daemon (pid %d) of pipe directory %s does not have %s as its /dev/shm (started before mpsd served its group to the kubelet?); restart the instance: %v", daemonPID, pipe, shm, err)
	}
	mounts := []*pluginapi.Mount{{ContainerPath: pipe, HostPath: pipe, ReadOnly: true}}
	for _, name := range maskedEntries {
		p := filepath.Join(pipe, name)
		if _, err := os.Lstat(p); err == nil {
			mounts = append(mounts, &pluginapi.Mount{ContainerPath: p, HostPath: maskSource, ReadOnly: true})
		}
	}
	return append(mounts, &pluginapi.Mount{ContainerPath: shmDir, HostPath: shm}), nil
}
