package mpsd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// Reconciliation joins, per instance, what three sources say of the
// processes on its GPUs: MPS's client list of each of its servers
// (get_client_list), the processes of mpsd's leases (their cgroups) and
// NVML's compute processes on the instance's GPUs. It runs after every
// successful probe and on every client event of the instance (a "NEW
// CLIENT" record is only a reason to look: its pid is never used), at most
// once per probe interval (reconcileSoon). Each
// process the join cannot account for is a finding of one kind:
const (
	// reconUnleased: a client of one of the instance's servers that no
	// lease holds: a member who set CUDA_MPS_PIPE_DIRECTORY without
	// mps-launch (no admission, no cgroup, no lease; status lists it
	// under its instance, to admins).
	reconUnleased = "unleased"
	// reconWrongInstance: a process of a lease placed on another
	// instance, attached to a server of this one (it was given the limits
	// of the other instance, and is charged there).
	reconWrongInstance = "wrong_instance"
	// reconBypass: a compute process on one of the instance's GPUs that is
	// no MPS server of any instance: it runs beside MPS, with the whole GPU
	// (a client whose pipe directory was missing or misspelled).
	reconBypass = "bypass"
)

// reconKinds are the finding kinds, as metrics label them.
var reconKinds = []string{reconUnleased, reconWrongInstance, reconBypass}

// reconView is one instance as the join sees it.
type reconView struct {
	key   string
	group string
	gpus  []int
	// clients: each server's clients, by server pid, as get_client_list
	// answered.
	clients map[int][]int
}

// leaseAt is where a leased process belongs.
type leaseAt struct {
	lease, inst, group string
}

// finding is one process the join could not account for.
type finding struct {
	kind string
	// inst and group: the instance whose server or GPU the process uses,
	// and the group it is reported under (for wrong_instance, the lease's
	// group; for bypass, set once the process's owner is known).
	inst, group string
	gpu         int
	server      int // the server it is a client of; 0 for bypass
	pid         int
	lease       string // the lease it belongs to (wrong_instance)
}

// joinReconcile is the join, pure. view is the instance reconciled;
// servers maps every verified MPS server pid of every instance to its
// instance key; leased maps every process of a placed lease to its lease;
// procs are NVML's processes by GPU index (for view's GPUs). A process
// that is a client of a server and also a compute process on the GPU is
// reported once, as the client it is.
func joinReconcile(view reconView, servers map[int]string, leased map[int]leaseAt, procs map[int][]gpu.ProcessMemory) []finding {
	var out []finding
	gpu0 := -1
	if len(view.gpus) > 0 {
		gpu0 = view.gpus[0]
	}
	clients := map[int]bool{}
	for _, server := range slices.Sorted(maps.Keys(view.clients)) {
		for _, pid := range view.clients[server] {
			if pid <= 0 || clients[pid] {
				continue
			}
			clients[pid] = true
			at, ok := leased[pid]
			switch {
			case !ok:
				out = append(out, finding{kind: reconUnleased, inst: view.key, group: view.group, gpu: gpu0, server: server, pid: pid})
			case at.inst != view.key:
				out = append(out, finding{kind: reconWrongInstance, inst: view.key, group: at.group, gpu: gpu0, server: server, pid: pid, lease: at.lease})
			}
		}
	}
	for _, g := range view.gpus {
		for _, p := range procs[g] {
			if p.Kind != gpu.ProcessCompute || p.PID <= 0 || clients[p.PID] {
				continue
			}
			if _, isServer := servers[p.PID]; isServer {
				continue
			}
			out = append(out, finding{kind: reconBypass, inst: view.key, gpu: g, pid: p.PID})
		}
	}
	return out
}

// reconKey names a finding across joins, so that it is reported (and
// acted on) once however many joins see it: the process (pid and start
// time) and where it was found.
type reconKey struct {
	kind  string
	scope string // the instance key; "gpu:N" for bypass (GPUs are shared)
	pid   int
	start uint64
}

func (f finding) scope() string {
	if f.kind == reconBypass {
		return "gpu:" + strconv.Itoa(f.gpu)
	}
	return f.inst
}

// reconcileSoon asks for a reconciliation of in. One runs at a time per
// instance, in its own goroutine, and each begins a probe interval or more
// after the one before it began: what asks meanwhile (a client event, a
// probe) is answered by one run once that interval is over. A NEW CLIENT
// record, which any member can write into the log FIFO as fast as the
// daemon takes it, so costs at most one reconciliation (and its
// get_client_list commands) per probe interval per instance, probes'
// included, however many come; a client that really connected is seen by
// the next run, a probe interval later at most. event: a client event
// asked for it, so MPS's client lists are read whatever NVML shows.
func (d *Daemon) reconcileSoon(in *instance, event bool) {
	d.mu.Lock()
	in.reconEvent = in.reconEvent || event
	if in.reconRunning {
		in.reconAgain = true
		d.mu.Unlock()
		return
	}
	in.reconRunning = true
	d.mu.Unlock()
	if !d.spawn(func() { d.reconcileRuns(in) }) {
		d.mu.Lock()
		in.reconRunning = false
		d.mu.Unlock()
	}
}

// reconcileRuns reconciles in until nothing asks any more. After each
// run it waits out the rest of a probe interval from the run's start,
// then runs again only if something asked meanwhile; it returns when
// mpsd stops.
func (d *Daemon) reconcileRuns(in *instance) {
	for {
		d.mu.Lock()
		event := in.reconEvent
		in.reconEvent, in.reconAgain = false, false
		interval := d.cfg.Watchdog.ProbeInterval
		d.mu.Unlock()
		began := d.clock.Now()
		d.reconcileInstance(in, event)
		if wait := began.Add(interval).Sub(d.clock.Now()); wait > 0 {
			t := d.clock.NewTimer(wait)
			select {
			case <-t.C():
			case <-d.ctx.Done():
				t.Stop()
			}
		}
		d.mu.Lock()
		if !in.reconAgain || d.ctx.Err() != nil {
			in.reconRunning = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
	}
}

// reconcileInstance gathers the three sources for in, joins them, checks
// each finding through a pidfd and /proc, and reports and acts on the new
// ones.
//
// What it reads is kept cheap for a probe: NVML's two process lists per
// GPU (no program run), the leases' processes as last read from their
// cgroups (read again every few probe intervals), and for a process that
// reading does not hold, its own /proc/PID/cgroup (a process attached or
// forked since). MPS's client lists cost a control command per server, so
// a probe reads them only when NVML shows an MPS client no lease of an
// instance on that GPU holds, or the GPU has no MPS client list; a client
// event (a client connected) reads them too when the instance shares a
// GPU with another instance (NVML cannot tell their servers' clients
// apart). They are read before any
// lease's process is looked up: a leased process is in its cgroup before
// it runs (the trampoline), so a client MPS lists is in its lease's
// cgroup when looked up, unless it or its lease has ended since (checked
// again, through a pidfd, below).
func (d *Daemon) reconcileInstance(in *instance, event bool) {
	d.mu.Lock()
	dm := in.daemon
	// A run that began once an adopted instance was held for it opens the
	// instance when it ends, however it ends (adoptReconciled).
	if in.holds.unreconciled {
		defer d.adoptReconciled(in)
	}
	if dm == nil || !in.daemonUp() || d.ctx.Err() != nil {
		d.mu.Unlock()
		return
	}
	d.metrics.reconRuns[in.key]++
	view := reconView{key: in.key, group: in.group, gpus: slices.Clone(in.p.GPUs), clients: map[int][]int{}}
	own := in.mps.pids()
	// The servers held in FAULT by then: this run may end those.
	faultMark, inFault := in.mps.faultMark(), in.mps.inFault()
	multiuser := in.p.Multiuser
	serverUID := in.mps.serverUIDs()
	timeout := d.cfg.Watchdog.ProbeTimeout
	maxAge := reconLeasedAge * d.cfg.Watchdog.ProbeInterval
	onGPU := map[string]bool{}
	for _, other := range d.instances {
		for _, g := range view.gpus {
			if slices.Contains(other.p.GPUs, g) {
				onGPU[other.key] = true
			}
		}
	}
	d.mu.Unlock()

	// A process that started after this moment is not one the lists
	// below name, whatever its pid: the one they named ended and its pid
	// was taken again (pids wrap), by a process that may be another
	// lease's, which no finding may touch.
	listedAt, clockErr := bootTicks()
	procs := map[int][]gpu.ProcessMemory{}
	// NVML's MPS client list tells which GPU a client uses, not which
	// server: on a GPU of several instances, a client event reads MPS's
	// lists to see each client's server.
	needMPS := event && len(onGPU) > 1
	var nvmlClients []int
	for _, g := range view.gpus {
		p, mpsList, err := d.host.Processes(g)
		if err != nil {
			in.log.Debug("reconcile: NVML processes", "gpu", g, "err", err)
		}
		procs[g] = p
		needMPS = needMPS || !mpsList
		for _, pm := range p {
			if pm.Kind == gpu.ProcessMPSClient {
				nvmlClients = append(nvmlClients, pm.PID)
			}
		}
	}
	// The leases' processes are read (or their last reading taken) only
	// when some process is to be looked up: an instance whose GPUs show
	// none costs no walk of the leases' cgroups.
	var leased map[int]leaseAt
	resolve := func(pids []int) {
		if len(pids) == 0 {
			return
		}
		if leased == nil {
			leased = d.leasedPids(maxAge)
		}
		leased = d.resolveLeased(pids, leased)
	}
	if !needMPS {
		resolve(nvmlClients)
		for _, pid := range nvmlClients {
			if at, ok := leased[pid]; !ok || !onGPU[at.inst] {
				needMPS = true
			}
		}
	}
	if needMPS {
		var listed []int
		for _, server := range own {
			ctx, cancel := context.WithTimeout(d.ctx, timeout)
			clients, err := dm.ClientList(ctx, server)
			cancel()
			if err != nil {
				// Not ACTIVE yet, or gone: it has no clients to look at now.
				in.log.Debug("reconcile: get_client_list", "server", server, "err", err)
				continue
			}
			view.clients[server] = clients
			listed = append(listed, clients...)
		}
		resolve(listed)
	}
	var nvmlPids []int
	for _, g := range view.gpus {
		for _, pm := range procs[g] {
			nvmlPids = append(nvmlPids, pm.PID)
		}
	}
	resolve(nvmlPids)
	d.checkLeaseMemory(in, dm, own, procs, leased)
	d.noteLeaseClients(in, leaseClients(in.key, procs, view.clients, leased))
	servers := d.serverSnapshot()
	found := joinReconcile(view, servers, leased, procs)

	type checked struct {
		f     finding
		h     *pidHandle
		facts procFacts
		// reportOnly: the process may be reported, never ended (its
		// owner is no member of the group whose server lists it).
		reportOnly bool
	}
	var confirmed []checked
	for _, f := range found {
		h, facts, err := verifyProc(d.proc, f.pid)
		if err != nil {
			continue // gone: nothing to report
		}
		if clockErr == nil && h.start > listedAt {
			in.log.Debug("reconcile: a listed pid names a process started since; not the one listed", "pid", f.pid, "kind", f.kind)
			h.close()
			continue
		}
		// Where the process is now, read while the pidfd holds it: a
		// reading of the cgroups from before it was attached (or before
		// its pid was reused) does not decide.
		at, isLeased, known := d.leaseOfPid(f.pid)
		if !known {
			at, isLeased = d.leasedPids(0)[f.pid]
		}
		if !h.alive() {
			h.close()
			continue
		}
		_, isServer := servers[f.pid]
		// A leased process that NVML shows beside MPS is a bypass all
		// the same: it runs with the whole GPU, not its lease's limits.
		switch {
		case f.kind == reconUnleased && isLeased,
			f.kind == reconWrongInstance && (!isLeased || at.inst == f.inst),
			f.kind == reconBypass && d.notBypass(isServer, facts):
			h.close()
			continue
		}
		if f.kind == reconWrongInstance {
			f.lease, f.group = at.lease, at.group
		}
		if f.kind != reconBypass && !multiuser {
			// MPS serves one uid per server: a pid it lists under a
			// server of another uid is no client of that server.
			if uid, ok := serverUID[f.server]; ok && uid >= 0 && facts.uid != uint32(uid) {
				in.log.Warn("reconcile: MPS lists a client of another uid than its server's; not acted on", "server", f.server, "pid", f.pid, "uid", facts.uid, "server_uid", uid)
				h.close()
				continue
			}
		}
		reportOnly := false
		if f.kind != reconBypass && multiuser && !d.memberOf(in.group, facts) {
			// A shared server serves the group's members, whose uids it
			// cannot tell apart; a pid it lists whose owner is none is
			// what a client claimed or a pid reused since: reported,
			// never ended (nor is the lease it may belong to).
			reportOnly = true
		}
		if f.kind == reconBypass {
			f.group = d.bypassGroup(f.gpu, facts)
		}
		confirmed = append(confirmed, checked{f: f, h: h, facts: facts, reportOnly: reportOnly})
	}

	// The control daemon's own word on each server held in FAULT
	// (get_server_status; 535 has none, and then the fault's clients
	// decide): a fact no tenant writes.
	faultStates := map[int]mps.ServerState{}
	for _, server := range inFault {
		ctx, cancel := context.WithTimeout(d.ctx, timeout)
		st, err := dm.ReportedServerStatus(ctx, server)
		cancel()
		if err == nil {
			faultStates[server] = st
		}
	}

	// Only findings not reported before are reported; those gone are
	// forgotten, so a process found again later is reported again.
	d.mu.Lock()
	if in.daemon == dm {
		// The leases' clients just counted (noteLeaseClients), as clients
		// of the servers MPS serves their uids with.
		byUID, noClient := map[uint32]int{}, map[string]uint32{}
		for _, l := range in.leases {
			if l.state == leaseRunning && l.clients != nil {
				byUID[l.uid] += *l.clients
				if *l.clients == 0 {
					noClient[l.id] = l.uid
				}
			}
		}
		in.mps.noteClients(byUID, noClient, multiuser)

		// The clients no lease holds, by server. Without MPS's lists
		// read, NVML showed every MPS client leased: none.
		unleased := map[int][]int{}
		var unleasedFacts []unleasedFact
		for _, c := range confirmed {
			if c.f.kind == reconUnleased {
				unleased[c.f.server] = append(unleased[c.f.server], c.f.pid)
				unleasedFacts = append(unleasedFacts, unleasedFact{pid: c.f.pid, uid: c.facts.uid, server: c.f.server})
			}
		}
		// What holds a server of one uid for MPS: its unleased clients
		// make every other uid wait (mpsModel.serving; a multiuser
		// daemon's one server serves every uid).
		wasHeld := in.mps.held()
		in.mps.setUnleased(unleased)
		in.seen = noteUsage(in.key, view.gpus, procs, leased, unleasedFacts)
		if !multiuser && wasHeld != in.mps.held() {
			// Released: another uid may be served now. Taken: the
			// waiting requests of other uids say so.
			d.scheduleLocked(in.group)
		}
		// A server held in FAULT (mpsModel.holdFault) serves again once
		// the daemon reports it out of FAULT, or, where it cannot say,
		// once no client of its fault is left, as seen by this
		// reconciliation: in MPS's list of the server, or, where MPS's
		// lists were not read, in NVML's, which showed every MPS client
		// leased. A server whose list could not be read shows nothing.
		ev := faultEvidence{unleased: unleased, seen: map[int]bool{}, state: faultStates}
		for _, server := range own {
			if _, listed := view.clients[server]; listed || !needMPS {
				ev.seen[server] = true
			}
		}
		if in.mps.endFaults(ev, faultMark) {
			in.log.Info("MPS server out of FAULT: no client of its fault is left")
			d.scheduleLocked(in.group)
		}
	}
	if d.reconSeen == nil {
		d.reconSeen = map[reconKey]bool{}
	}
	seen := map[reconKey]bool{}
	var fresh []checked
	for _, c := range confirmed {
		k := reconKey{kind: c.f.kind, scope: c.f.scope(), pid: c.f.pid, start: c.h.start}
		seen[k] = true
		if d.reconSeen[k] {
			c.h.close()
			continue
		}
		d.reconSeen[k] = true
		fresh = append(fresh, c)
	}
	scopes := map[string]bool{view.key: true}
	for _, g := range view.gpus {
		scopes["gpu:"+strconv.Itoa(g)] = true
	}
	for k := range d.reconSeen {
		if scopes[k.scope] && !seen[k] {
			delete(d.reconSeen, k)
		}
	}
	policies := map[string]policy.ReconcilePolicy{}
	for _, c := range fresh {
		if g, ok := d.cfg.Group(c.f.group); ok {
			policies[c.f.group] = g.Reconcile
		}
		d.metrics.unreconciled[[2]string{c.f.group, c.f.kind}]++
	}
	d.mu.Unlock()

	for _, c := range fresh {
		pol := policies[c.f.group]
		if c.reportOnly {
			pol = policy.ReconcileReport
			in.log.Warn("reconcile: MPS lists a client of the group's shared server whose owner is no member of the group; reported, never ended",
				"server", c.f.server, "pid", c.f.pid, "uid", c.facts.uid)
		}
		if pol == policy.ReconcileTerminate && c.f.kind != reconBypass {
			// MPS's client list is what the clients told their server:
			// one may name any pid. Only a process that holds a unix
			// socket connected to the server's is ended.
			if why := d.unproven(c.f, c.h); why != "" {
				pol = policy.ReconcileReport
				in.log.Warn("reconcile: MPS lists a pid not proven to be a client of that server; reported, never signalled",
					"server", c.f.server, "pid", c.f.pid, "uid", c.facts.uid, "kind", c.f.kind, "reason", why)
			}
		}
		d.actOnFinding(in, dm, c.f, c.h, c.facts, pol)
		c.h.close()
	}
}

// unproven says why the process h holds (the pid MPS listed in f) is not
// proven to be a client of f's server, "" when it is: it holds a unix
// socket connected to one the server holds (proveClient). What cannot be
// told (the server gone, a kernel without unix sock_diag) is not proven.
func (d *Daemon) unproven(f finding, h *pidHandle) string {
	if f.server <= 0 {
		return "no server"
	}
	server, err := openPid(d.proc, f.server)
	if err != nil {
		return fmt.Sprintf("the server cannot be checked: %v", err)
	}
	defer server.close()
	ok, err := proveClient(d.proc, h, server)
	switch {
	case err != nil:
		return fmt.Sprintf("cannot be proven: %v", err)
	case !ok:
		return "it holds no unix socket connected to the server's"
	}
	return ""
}

// memoryExceeded is the reason of a revocation for device memory.
const memoryExceeded = "memory limit exceeded"

// checkLeaseMemory sums, per GPU, the device memory NVML reports for each
// running lease's processes on in (MPS clients and compute processes
// alike) and compares it with the lease's mem: MPS limits each client
// process, so a lease of several processes can hold more. A lease over it
// for longer than its group's memory_grace is revoked for good
// (memoryExceeded, api.CodeLimitExceeded).
func (d *Daemon) checkLeaseMemory(in *instance, dm control, servers []int, procs map[int][]gpu.ProcessMemory, leased map[int]leaseAt) {
	type use struct {
		gpu   int
		bytes uint64
	}
	sums := map[string]map[int]uint64{} // lease → GPU → bytes
	for g, list := range procs {
		for _, pm := range list {
			at, ok := leased[pm.PID]
			if !ok || at.inst != in.key || pm.UsedBytes == nil {
				continue
			}
			if sums[at.lease] == nil {
				sums[at.lease] = map[int]uint64{}
			}
			sums[at.lease][g] += *pm.UsedBytes
		}
	}
	now := d.clock.Now()
	var victims []*lease
	var why []string
	d.mu.Lock()
	grace := time.Duration(0)
	if g, ok := d.cfg.Group(in.group); ok {
		grace = g.MemoryGrace
	}
	for _, l := range in.leases {
		var most uint64
		for _, b := range sums[l.id] {
			most = max(most, b)
		}
		l.memUsed = &most
		if l.memPeak == nil || most > *l.memPeak {
			peak := most
			l.memPeak = &peak
		}
		if l.state != leaseRunning || grace <= 0 {
			continue
		}
		over := use{gpu: -1}
		for g, b := range sums[l.id] {
			if l.req.Mem > 0 && b > uint64(l.req.Mem) && b > over.bytes {
				over = use{gpu: g, bytes: b}
			}
		}
		switch {
		case over.gpu < 0:
			l.memOverSince = time.Time{}
		case l.memOverSince.IsZero():
			l.memOverSince = now
			l.log.Warn("lease over its memory limit; revoked if it stays over", "lease", l.id, "gpu_index", over.gpu,
				"used_bytes", over.bytes, "limit_bytes", l.req.Mem, "grace", grace)
		case now.Sub(l.memOverSince) >= grace:
			victims = append(victims, l)
			pod := ""
			if b := d.pods.get(l.id); b != nil {
				pod = fmt.Sprintf("; %s (container id %s): its CUDA processes are ended", b.ref, b.ref.ContainerID)
			}
			why = append(why, fmt.Sprintf("lease %s revoked: %s (%d bytes on GPU %d over its %d for %s)%s; not requeued",
				l.id, memoryExceeded, over.bytes, over.gpu, l.req.Mem, now.Sub(l.memOverSince).Round(time.Second), pod))
		}
	}
	d.mu.Unlock()
	for i, l := range victims {
		if b := d.pods.get(l.id); b != nil {
			// A pod's lease: its container's CUDA processes are ended
			// here (revoke ends only a lease's own cgroup), then the lease.
			d.mu.Lock()
			d.metrics.podMemExceeded[l.group]++
			log := l.logger()
			attrs := l.logAttrs("namespace", b.ref.Namespace, "pod", b.ref.Pod, "container", b.ref.Container, "container_id", b.ref.ContainerID)
			d.mu.Unlock()
			n := d.endPodClients(l, log, b, dm, servers, procs)
			log.Error(podMemoryExceeded, append(attrs, "ended", n, "limit_bytes", l.req.Mem, "detail", why[i])...)
		}
		l.log.Error("lease revoked: "+memoryExceeded, "lease", l.id, "detail", why[i])
		d.revoke([]*lease{l}, memoryExceeded, revokeHow{dm: dm, servers: servers,
			end: &api.Error{Code: api.CodeLimitExceeded, Message: why[i]}})
	}
}

// leaseClients counts the MPS client processes of each lease placed on
// instance inst: the pids NVML lists as MPS clients on the instance's GPUs
// (procs) and those MPS's client lists of its servers name (lists, when
// they were read), that the lease's cgroup holds (leased). A process on
// several GPUs, or in both sources, counts once. Pure.
func leaseClients(inst string, procs map[int][]gpu.ProcessMemory, lists map[int][]int, leased map[int]leaseAt) map[string]int {
	seen := map[int]bool{}
	n := map[string]int{}
	count := func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		if at, ok := leased[pid]; ok && at.inst == inst {
			n[at.lease]++
		}
	}
	for _, list := range procs {
		for _, pm := range list {
			if pm.Kind == gpu.ProcessMPSClient && pm.PID > 0 {
				count(pm.PID)
			}
		}
	}
	for _, pids := range lists {
		for _, pid := range pids {
			if pid > 0 {
				count(pid)
			}
		}
	}
	return n
}

// noteLeaseClients records, for each lease on in, how many MPS clients
// of its processes the reading saw (status's clients), and logs once a
// running lease that runs more than it declared (--procs): MPS gives each
// of them the lease's share divided by its procs, so together they take
// more than the lease was admitted with. mpsd cannot stop a lease from
// starting more; it reports it.
func (d *Daemon) noteLeaseClients(in *instance, counts map[string]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range in.leases {
		n := counts[l.id]
		l.clients = &n
		procs := l.req.Clients()
		switch over := n > procs && l.state == leaseRunning; {
		case over && !l.clientsOver:
			l.logger().Warn("lease runs more MPS clients than the processes it declared; each has its share divided by them, so together they take more than the lease's sm",
				l.logAttrs("clients", n, "procs", procs, "sm", l.req.SM, "sm_per_process", l.req.SM/procs)...)
			l.clientsOver = true
		case !over:
			l.clientsOver = false
		}
	}
}

// serverSnapshot is every instance's verified servers (pid → instance
// key).
func (d *Daemon) serverSnapshot() map[int]string {
	servers := map[int]string{}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, in := range d.instances {
		for _, pid := range in.mps.pids() {
			servers[pid] = in.key
		}
	}
	return servers
}

// reconLeasedAge is how many probe intervals a reading of every lease's
// cgroup is used again: what it lacks (a process attached or forked
// since) is looked up on its own (resolveLeased).
const reconLeasedAge = 5

// leasedSnapshot is the processes of every placed lease, read at a time.
type leasedSnapshot struct {
	pids map[int]leaseAt
	at   time.Time
	// refreshing: a reconciliation is reading every cgroup again.
	refreshing bool
	// found: processes looked up one by one since the reading
	// (resolveLeased), and the lease each is in.
	found map[int]leaseAt
}

// leasedPids is the processes of every placed lease, from their cgroups:
// the last reading, unless it is older than maxAge (0: read now). The
// cgroups are read without Daemon.mu. The map is shared: read it only.
func (d *Daemon) leasedPids(maxAge time.Duration) map[int]leaseAt {
	d.reconMu.Lock()
	snap := d.reconLeased
	if snap.pids != nil && (d.clock.Since(snap.at) < maxAge || (maxAge > 0 && snap.refreshing)) {
		// Fresh enough, or another reconciliation is reading every
		// cgroup right now: one walk at a time, whatever the number of
		// instances whose probes asked.
		d.reconMu.Unlock()
		return snap.pids
	}
	d.reconLeased.refreshing = true
	d.reconMu.Unlock()
	defer func() {
		d.reconMu.Lock()
		d.reconLeased.refreshing = false
		d.reconMu.Unlock()
	}()
	type placed struct {
		l               *lease
		inst, group, id string
	}
	var ls []placed
	d.mu.Lock()
	for _, in := range d.instances {
		for _, l := range in.leases {
			ls = append(ls, placed{l: l, inst: in.key, group: l.group, id: l.id})
		}
	}
	d.mu.Unlock()
	leased := map[int]leaseAt{}
	onInst := make(map[string]bool, len(ls))
	for _, p := range ls {
		onInst[p.id] = true
		// A pod's lease: its container's processes (podprocs.go).
		for _, pid := range d.leasePids(p.l) {
			leased[pid] = leaseAt{lease: p.id, inst: p.inst, group: p.group}
		}
	}
	d.pods.keepOnly(onInst)
	d.reconMu.Lock()
	d.reconLeased = leasedSnapshot{pids: leased, at: d.clock.Now(), refreshing: true}
	d.reconMu.Unlock()
	return leased
}

// resolveLeased returns leased with the pids it lacks looked up
// (leaseOfPids); leased itself when it lacks none. Without a unified
// cgroup hierarchy to look a process up in, every cgroup is read again.
// What a look-up finds is kept with the reading of every cgroup until
// the next one (leasedSnapshot.found): a burst of client events looks
// each new client up once, not at every reconciliation it causes.
func (d *Daemon) resolveLeased(pids []int, leased map[int]leaseAt) map[int]leaseAt {
	var out map[int]leaseAt
	var lookup []int
	seen := map[int]bool{}
	d.reconMu.Lock()
	reading := d.reconLeased.at
	for _, pid := range pids {
		if _, ok := leased[pid]; ok || seen[pid] {
			continue
		}
		seen[pid] = true
		if at, ok := d.reconLeased.found[pid]; ok {
			if out == nil {
				out = maps.Clone(leased)
			}
			out[pid] = at
			continue
		}
		lookup = append(lookup, pid)
	}
	d.reconMu.Unlock()
	if len(lookup) > 0 {
		ats, known := d.leaseOfPids(lookup)
		if !known {
			return d.leasedPids(0)
		}
		if len(ats) > 0 {
			if out == nil {
				out = maps.Clone(leased)
			}
			maps.Copy(out, ats)
			d.reconMu.Lock()
			// Kept only with the reading it completes: a reading made
			// meanwhile is newer than these look-ups.
			if d.reconLeased.at.Equal(reading) {
				if d.reconLeased.found == nil {
					d.reconLeased.found = map[int]leaseAt{}
				}
				maps.Copy(d.reconLeased.found, ats)
			}
			d.reconMu.Unlock()
		}
	}
	if out == nil {
		return leased
	}
	return out
}

// leaseOfPid is the placed lease whose cgroup holds pid, from
// /proc/PID/cgroup's cgroup v2 line. known is false when that cannot
// tell: no unified hierarchy (v1, or cgroups disabled).
func (d *Daemon) leaseOfPid(pid int) (at leaseAt, ok, known bool) {
	ats, known := d.leaseOfPids([]int{pid})
	at, ok = ats[pid]
	return at, ok, known
}

// leaseOfPids is leaseOfPid for several pids: their /proc/PID/cgroup are
// read first, without Daemon.mu, then matched against every placed
// lease's cgroup in one pass under it. A pid that is gone, or in no
// lease's cgroup, is not in the map.
func (d *Daemon) leaseOfPids(pids []int) (ats map[int]leaseAt, known bool) {
	paths := make(map[int]string, len(pids))
	for _, pid := range pids {
		if path, err := unifiedCgroup(d.proc, pid); err == nil {
			paths[pid] = path
		}
	}
	ats = map[int]leaseAt{}
	d.mu.Lock()
	defer d.mu.Unlock()
	byPath := map[string]leaseAt{}
	podsKnown := true
	for _, in := range d.instances {
		for _, l := range in.leases {
			if p := d.leaseUnifiedCgroup(l); p != "" {
				byPath[p] = leaseAt{lease: l.id, inst: in.key, group: l.group}
			}
			// A pod's lease: its container's cgroup v2 (podprocs.go);
			// one in v1 hierarchies only is read with every lease's.
			if b := d.pods.get(l.id); b != nil {
				if p, ok := b.paths[""]; ok {
					byPath[p] = leaseAt{lease: l.id, inst: in.key, group: l.group}
				} else {
					podsKnown = false
				}
			}
		}
	}
	if !podsKnown {
		return ats, false
	}
	if len(byPath) == 0 {
		// No lease has a cgroup v2 path: either none has a cgroup yet
		// (then nothing is leased) or there is no unified hierarchy.
		m, isCgroups := d.cg.(*cgroup.Cgroups)
		return ats, isCgroups && m.Mode() != cgroup.ModeV1
	}
	for pid, path := range paths {
		// The lease's own cgroup or one nested in it: the lease's too.
		for p := path; strings.HasPrefix(p, "/") && p != "/"; p = filepath.Dir(p) {
			if at, ok := byPath[p]; ok {
				ats[pid] = at
				break
			}
		}
	}
	return ats, true
}

// bypassGroup is the group a process beside MPS on GPU g is reported
// under: the first group (by name) with an instance on g whose member the
// process's owner is; "" when it is no member of any (root's tools, the
// driver's daemons): such a process is reported, never ended.
func (d *Daemon) bypassGroup(g int, facts procFacts) string {
	if facts.uid == 0 {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	on := map[string]bool{}
	for _, in := range d.instances {
		if slices.Contains(in.p.GPUs, g) {
			on[in.group] = true
		}
	}
	for _, name := range d.cfg.Access.Groups(policy.Credentials{UID: facts.uid, GIDs: facts.gids}) {
		if on[name] {
			return name
		}
	}
	return ""
}

// memberOf reports whether the owner facts names is a member of group
// (by uid or by one of its groups, as the config says).
func (d *Daemon) memberOf(group string, facts procFacts) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.cfg.Access.Groups(policy.Credentials{UID: facts.uid, GIDs: facts.gids}), group)
}

// mpsServerProgram is the program of an MPS server (NVIDIA's, and the
// emulator's under the same name).
const mpsServerProgram = "nvidia-cuda-mps-server"

// isMPSServer: the process runs the MPS server program from a directory
// of the control daemons' PATH (root's, from the config): a server of an
// instance, one whose start mpsd has not seen yet, or one a killed daemon
// left behind (the watchdog's to handle), never a program beside MPS. A
// tenant's copy under that name elsewhere does not count.
// notBypass reports whether a compute process NVML shows beside MPS is
// none of a tenant's: a server mpsd knows, a process running the MPS
// server program mpsd starts, or one whose program can no longer be read
// (/proc's exe link goes with the process's memory as it exits, before
// its pidfd says so: the chaos soak met another instance's server, killed
// with its daemon, reported so). A live process's program root can
// always read.
func (d *Daemon) notBypass(isServer bool, facts procFacts) bool {
	return isServer || facts.exe == "" || d.isMPSServer(facts)
}

func (d *Daemon) isMPSServer(facts procFacts) bool {
	if filepath.Base(facts.exe) != mpsServerProgram {
		return false
	}
	dir := filepath.Dir(facts.exe)
	for _, kv := range d.mpsBase.Env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, p := range filepath.SplitList(path) {
				if p != "" && filepath.Clean(p) == dir {
					return true
				}
			}
		}
	}
	return false
}

// reconLogMsg is the message of a finding's log line (docs/alerts.md).
const reconLogMsg = "GPU process not accounted to a lease of its instance"

// actOnFinding reports a finding, and under the terminate policy ends the
// process: terminate_client on its server first (killing a client with
// work in flight can hang the server), then SIGKILL through the pidfd
// verifyProc opened, so only the process checked is signalled. Root's
// processes and those of no group are only reported; so is a client MPS
// lists that is not proven its server's (unproven): its caller passes
// the report policy then.
func (d *Daemon) actOnFinding(in *instance, dm control, f finding, h *pidHandle, facts procFacts, pol policy.ReconcilePolicy) {
	gpuUUID := ""
	if inv := d.host.GPUs(); f.gpu >= 0 && f.gpu < len(inv) {
		gpuUUID = inv[f.gpu].UUID
	}
	action := "reported"
	terminate := pol == policy.ReconcileTerminate && f.group != "" && facts.uid != 0
	if terminate {
		action = "terminated"
	}
	args := []any{"kind", f.kind, "group", f.group, "gpu", gpuUUID, "gpu_index", f.gpu, "instance", f.inst,
		"pid", f.pid, "uid", facts.uid, "exe", facts.exe, "action", action}
	if f.server != 0 {
		args = append(args, "server", f.server)
	}
	if f.lease != "" {
		args = append(args, "lease", f.lease)
	}
	d.log.Warn(reconLogMsg, args...)
	if !terminate {
		return
	}
	if f.server != 0 && dm != nil && !dm.Exited() {
		ctx, cancel := context.WithTimeout(d.ctx, 2*time.Second)
		err := dm.TerminateClient(ctx, f.server, f.pid)
		cancel()
		if err != nil {
			d.log.Warn("reconcile: terminate_client failed; killing the process", "pid", f.pid, "server", f.server, "err", err)
		}
	}
	if !h.alive() {
		d.countTerminated(f)
		return
	}
	if err := unix.PidfdSendSignal(h.fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		d.log.Error("reconcile: kill failed", "pid", f.pid, "group", f.group, "kind", f.kind, "err", err)
		return
	}
	d.countTerminated(f)
}

func (d *Daemon) countTerminated(f finding) {
	d.mu.Lock()
	d.metrics.reconTerminated[[2]string{f.group, f.kind}]++
	d.mu.Unlock()
}

// procFacts is what reconciliation reads of a process through /proc,
// while a pidfd shows it is still the process the pid named.
type procFacts struct {
	uid  uint32
	gids []uint32 // the supplementary groups (initgroups puts the login group there)
	ppid int
	exe  string
}

// verifyProc opens a pidfd on pid and reads its owner, groups, parent and
// program; the facts are the pidfd's process's only if it is still alive
// after they were read, else the pid may name a successor and verifyProc
// fails. The caller closes the handle.
func verifyProc(proc string, pid int) (*pidHandle, procFacts, error) {
	h, err := openPid(proc, pid)
	if err != nil {
		return nil, procFacts{}, err
	}
	facts, err := readProcFacts(proc, pid)
	if err == nil && !h.alive() {
		err = fmt.Errorf("pid %d exited", pid)
	}
	if err != nil {
		h.close()
		return nil, procFacts{}, err
	}
	return h, facts, nil
}

func readProcFacts(proc string, pid int) (procFacts, error) {
	st, err := readProcStatus(proc, pid)
	if err != nil {
		return procFacts{}, err
	}
	facts := procFacts{uid: st.uid, gids: st.groups, ppid: st.ppid}
	if t, err := os.Readlink(filepath.Join(proc, strconv.Itoa(pid), "exe")); err == nil {
		facts.exe = strings.TrimSuffix(t, " (deleted)")
	}
	return facts, nil
}

// clientUsage is what a reconciliation read of an instance's MPS clients
// for status (api.InstanceStatus's Unleased, UnleasedMemBytes and
// MemUsedBytes): those no lease holds, and the device memory NVML
// reported, per GPU, on the instance's GPU where it is highest.
type clientUsage struct {
	read        bool // a reconciliation has read them
	unleased    []api.UnleasedClient
	unleasedMem uint64 // the clients of no lease's
	memUsed     uint64 // every client's of the instance, leased or not
}

// unleasedFact is a client of no lease a reconciliation confirmed: its
// pid, its owner (read while a pidfd held it) and its server.
type unleasedFact struct {
	pid    int
	uid    uint32
	server int
}

// noteUsage joins the clients of no lease of instance inst (on GPUs
// gpus) with NVML's processes (procs, by GPU) and the leased processes
// (leased): each client's memory summed over the GPUs, and per GPU the
// memory of the clients of no lease and of all the instance's clients,
// the most of any GPU kept. A process NVML gives no memory for adds
// none. Pure.
func noteUsage(inst string, gpus []int, procs map[int][]gpu.ProcessMemory, leased map[int]leaseAt, unleased []unleasedFact) clientUsage {
	u := clientUsage{read: true}
	mine := map[int]int{} // pid of a client of no lease → its index in u.unleased
	for _, f := range unleased {
		if _, dup := mine[f.pid]; dup {
			continue
		}
		mine[f.pid] = len(u.unleased)
		u.unleased = append(u.unleased, api.UnleasedClient{PID: f.pid, UID: f.uid, Server: f.server})
	}
	for _, g := range gpus {
		var free, all uint64
		for _, pm := range procs[g] {
			if pm.UsedBytes == nil {
				continue
			}
			if i, ok := mine[pm.PID]; ok {
				c := &u.unleased[i]
				if c.MemBytes == nil {
					c.MemBytes = new(uint64)
				}
				*c.MemBytes += *pm.UsedBytes
				free += *pm.UsedBytes
				all += *pm.UsedBytes
			} else if at, ok := leased[pm.PID]; ok && at.inst == inst {
				all += *pm.UsedBytes
			}
		}
		u.unleasedMem, u.memUsed = max(u.unleasedMem, free), max(u.memUsed, all)
	}
	slices.SortFunc(u.unleased, func(a, b api.UnleasedClient) int { return a.PID - b.PID })
	return u
}
