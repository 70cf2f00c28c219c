package mpsd

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/policy"
)

// Fault kinds, as logs and metrics name them.
const (
	faultDaemonExit     = "daemon_exit"
	faultServerExit     = "server_exit"
	faultFatalException = "fatal_exception"
	faultServerFault    = "server_fault"
	faultHung           = "hung"
	faultXid            = "xid"
	faultAdmin          = "admin_restart"
)

// restartMode is how much of an instance a recovery restarts.
type restartMode int

const (
	// restartNone: the MPS server is gone or survived; MPS starts a fresh
	// server for the next client by itself.
	restartNone restartMode = iota
	// restartServer: the servers are stopped so the next client gets one
	// with fresh GPU contexts.
	restartServer
	// restartDaemon: the control daemon (and with it every server) is
	// stopped and started again.
	restartDaemon
)

// String is the mode as the log's restarting= field says it.
func (m restartMode) String() string {
	switch m {
	case restartNone:
		return "nothing"
	case restartServer:
		return "servers"
	case restartDaemon:
		return "control_daemon"
	}
	return fmt.Sprintf("restartMode(%d)", int(m))
}

// fault is one failure of an instance, as the watchdog acts on it.
type fault struct {
	kind    string
	reason  string // one line for the launchers and the log
	restart restartMode
	// admin: asked for by an operator, so it does not count towards
	// quarantine.
	admin bool
	// uncharged: no workload caused it as far as mpsd can tell, though a
	// member may have: the daemon died or stopped answering after its log
	// was lost (a record written into its log FIFO stops NVIDIA's logger,
	// and some kilobytes later kills the daemon: loglost.go); or it may
	// be no failure at all: a server gone while mpsd was away, which MPS
	// may have ended itself (lostWhileAway). It counts towards no
	// quarantine and its victims use up no attempt.
	uncharged bool
	// fromServerLog: a server.log line at logOffset told of it; if mpsd
	// stops before handling it, the next mpsd reads the line again.
	fromServerLog bool
	logOffset     int64
	// leases, when set, limits the victims to these leases.
	leases []string
	// culprit, when set, is the lease whose client caused the fault, as
	// a fact named it (culprit.go): it alone is charged for it.
	culprit culpritID
	// server and serverUID, on a server_exit seen on the server's pidfd:
	// the crashed server, which the state file keeps if mpsd stops
	// before recovering from it (unhandledLocked). server, on a
	// server_fault: the server whose log recorded it, whose log may name
	// its culprit (culprithint.go).
	server, serverUID int
	// xidConfirmed, on a server_fault: an Xid on the instance's GPUs
	// confirmed the record (verify.go), so a real fault happened; only
	// then may the server's log name its culprit (culprithint.go).
	xidConfirmed bool
}

// culpritID names a culprit lease and its uid.
type culpritID struct {
	lease string
	uid   uint32
}

// reportFault records a fault of an instance for its supervisor
// (supervisor.go) and wakes it. An instance that is up (or has its daemon
// while starting) becomes recovering at once, which closes it to new
// placements; during a recovery, or a bring-up that has no daemon yet, the
// fault waits in pending to be handled next, with every other fault
// pending (one recovery handles them all).
// It never blocks: the recovery waits on processes in the supervisor,
// which holds Daemon.mu only between those waits.
func (d *Daemon) reportFault(in *instance, f fault) {
	if d.opts.faultHook != nil {
		d.opts.faultHook(in, f)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if in.life == instStopping || in.life == instStopped {
		return
	}
	if d.ctx.Err() != nil {
		in.unhandledLocked(f)
		return
	}
	if f.fromServerLog && in.logHandled >= 0 {
		// Handled from here on (its recovery begins now or next). Until
		// that recovery has marked its victims revoking, the state file
		// keeps the line to be read again (serverLogSavedLocked): an mpsd
		// that dies before then would otherwise lose the fault.
		in.logHandled = max(in.logHandled, f.logOffset+1)
	}
	in.faults[f.kind]++
	// Every fault waits with its own victims: the recovery takes them all
	// (a fault limited to one uid or some leases must not hide another's).
	in.pending = append(in.pending, f)
	if in.life == instUp || (in.life == instStarting && in.daemon != nil) {
		if _, err := in.step(instEvFault, f.kind); err != nil {
			return
		}
	} else if in.life == instStarting {
		d.revokeWithoutDaemonLocked(in, f)
	}
	if in.probeCancel != nil {
		// A probe under way would keep the recovery waiting.
		in.probeCancel()
	}
	in.ringLocked() // a release waiting for the fault's verdict
	in.kickLocked()
}

// revokeWithoutDaemonLocked revokes the running leases fault f names on
// in, which has no daemon yet (mpsd started while the daemon they ran on
// is gone, and no start has succeeded since): its recovery runs only once
// a daemon is up, which may be never, and their launchers must not wait
// for it. f stays pending: that recovery still counts it and restarts
// what it needs, and finds its victims revoked already.
func (d *Daemon) revokeWithoutDaemonLocked(in *instance, f fault) {
	var victims []*lease
	for _, l := range in.leases {
		if _, ok := faultVictim([]fault{f}, l.id); ok && l.state == leaseRunning {
			victims = append(victims, l)
		}
	}
	if len(victims) == 0 {
		return
	}
	slices.SortFunc(victims, func(a, b *lease) int { return int(a.req.Seq - b.req.Seq) })
	in.log.Warn("fault on an instance without a control daemon; its leases are revoked now", "fault", f.kind, "reason", f.reason, "leases", len(victims))
	d.spawn(func() { d.revoke(victims, f.reason, revokeHow{}) })
}

// unhandledLocked notes a fault mpsd is stopping too soon to handle. One
// from server.log is read again by the next mpsd: logHandled goes back to
// its line, which its report had passed. Any other is not saved: the next
// mpsd's adoption finds a server or daemon that went meanwhile, but an Xid
// or a hang it left unhandled is not seen again.
func (in *instance) unhandledLocked(f fault) {
	if f.fromServerLog && in.logHandled >= 0 {
		// Its line is read again by the next mpsd: the offset saved at
		// the stop goes back to it.
		in.logHandled = min(in.logHandled, f.logOffset)
	}
	if f.kind == faultServerExit && f.server > 0 {
		// Its pidfd's news dies with this mpsd: the saved server list
		// keeps the server, so the next mpsd finds it gone and revokes
		// its leases (lostWhileAway).
		in.mps.crashUnhandled(f.server, f.serverUID)
	}
	in.log.Warn("fault left for the next mpsd", "fault", f.kind, "reason", f.reason, "read_again", f.fromServerLog || f.server > 0)
}

// serverLogSavedLocked is the server.log offset the state file keeps for
// in: where the next mpsd reads its faults again. That is logHandled,
// unless a fault read from the log waits for its Xid (a claim, settled or
// not yet acted on) or for a recovery, or its recovery has not yet marked
// its victims revoking (the chaos soak met an mpsd killed in between: the
// next one neither read the line again nor knew of the revocation, and
// the culprit's job ended as if its command had). A later record marked
// handled meanwhile (an unverified one moves logHandled past the claim's
// line) does not move it past them.
func (in *instance) serverLogSavedLocked() int64 {
	off := in.logHandled
	keep := func(f fault) {
		if f.fromServerLog && f.logOffset >= 0 {
			off = min(off, f.logOffset)
		}
	}
	for _, f := range in.pending {
		keep(f)
	}
	if !in.handlingMarked {
		for _, f := range in.handling {
			keep(f)
		}
	}
	for _, cs := range [...][]*faultClaim{in.claims, in.deciding} {
		for _, c := range cs {
			if c.dm == in.daemon {
				keep(c.f)
			}
		}
	}
	return off
}

// combineFaults is one recovery of the faults pending together (pure):
// the restart is the strongest one's, and so are the kind and reason the
// log, the metrics and quarantine see; it counts as an operator's only if
// every fault was one. The victims stay each fault's own (faultVictim).
func combineFaults(fs []fault) fault {
	main := fs[0]
	admin := true
	for _, f := range fs {
		if f.restart > main.restart {
			main = f
		}
		admin = admin && f.admin
	}
	main.admin = admin
	return main
}

// faultVictim is the first of fs that names lease id, and whether one
// does: a fault without leases names every lease of the instance.
func faultVictim(fs []fault, id string) (fault, bool) {
	for _, f := range fs {
		if f.leases == nil || slices.Contains(f.leases, id) {
			return f, true
		}
	}
	return fault{}, false
}

// recoveryPlan is what one recovery does to its instance's counts and
// leases (planRecoveryLocked).
type recoveryPlan struct {
	// barred: the culprit uids barred from the instance now.
	barred []uint32
	// quarantined: the instance was quarantined now.
	quarantined bool
	// victims: the running leases the faults name, oldest first; reasons:
	// a victim's own fault's reason where it is not the combined one;
	// spared: the victims whose requeue uses up no attempt.
	victims []*lease
	reasons map[string]string
	spared  map[string]bool
}

// planRecoveryLocked counts the failure that the faults pending (combined
// as f) make at now, and picks their victims. When every fault names its
// culprit, each culprit uid is charged (culprit.go) and the instance stays
// open to the group's others; otherwise the failure counts towards the
// instance's quarantine. An operator's fault counts for neither.
//
// A lease already ending (its launcher left, release is killing it; or
// another revocation has it) is its owner's to finish; every other running
// lease the faults name is a victim, told the reason of the fault that
// named it. A victim is spared (its requeue uses up no attempt) when every
// fault names a culprit and it is none of them, or when every fault is
// uncharged (the daemon died of its lost log, a server ended while mpsd
// was away), which counts towards no quarantine either. It does no I/O: the
// recovery acts on the plan (and mpsd's simulation checks it).
func (in *instance) planRecoveryLocked(pending []fault, f fault, now time.Time, wd policy.WatchdogConfig) recoveryPlan {
	var plan recoveryPlan
	blamed, anonymous := culprits(pending)
	uncharged := !slices.ContainsFunc(pending, func(p fault) bool { return !p.uncharged })
	switch {
	case uncharged:
		// The daemon died of its lost log, or a server ended while mpsd
		// was away: nobody is charged.
	case !f.admin && !anonymous:
		plan.barred = in.chargeCulpritsLocked(blamed, now, wd)
	case !f.admin:
		keep := in.failures[:0]
		for _, t := range in.failures {
			if now.Sub(t) < wd.QuarantineWindow {
				keep = append(keep, t)
			}
		}
		in.failures = append(keep, now)
		if len(in.failures) >= wd.QuarantineAfter && !in.holds.quarantined {
			in.holds.quarantined = true
			in.quarantinedFor = fmt.Sprintf("%d failures in %s%s%s", len(in.failures), wd.QuarantineWindow, lastFailure, f.reason)
			plan.quarantined = true
		}
	}
	for _, l := range in.leases {
		if l.state != leaseRunning {
			continue
		}
		vf, ok := faultVictim(pending, l.id)
		if !ok {
			continue
		}
		plan.victims = append(plan.victims, l)
		if uncharged || !anonymous && !slices.ContainsFunc(pending, func(p fault) bool { return p.culprit.lease == l.id }) {
			if plan.spared == nil {
				plan.spared = map[string]bool{}
			}
			plan.spared[l.id] = true
		}
		if vf.reason != f.reason {
			if plan.reasons == nil {
				plan.reasons = map[string]string{}
			}
			plan.reasons[l.id] = vf.reason
		}
	}
	slices.SortFunc(plan.victims, func(a, b *lease) int { return int(a.req.Seq - b.req.Seq) })
	return plan
}

// recovery is a recovery begun (beginRecovery): its faults combined, its
// plan, and what the rest of it (recoverOnce) restarts.
type recovery struct {
	f    fault
	plan recoveryPlan
	// failures: the instance's failures in the quarantine window, this
	// one included (the backoff before the restart grows with them).
	failures int
	// dm and servers: the control daemon the faults were on and its
	// servers as the recovery began (dm is nil on a daemon gone).
	dm      control
	servers []int
	// reopen: when each uid barred now may be served again.
	reopen []time.Time
	start  time.Time
	wd     policy.WatchdogConfig
}

// recoverOnce handles the faults pending together in the instance's
// supervisor, as one failure: it counts it (quarantine), revokes every
// fault's victims (beginRecovery) and restarts what the strongest fault
// needs.
func (d *Daemon) recoverOnce(in *instance, pending []fault) {
	r := d.beginRecovery(in, pending)
	for _, until := range r.reopen {
		d.reopenAfterBar(in, until)
	}
	f, failures, dm, servers, wd := r.f, r.failures, r.dm, r.servers, r.wd

	// The first failure in the window restarts at once; a crash loop
	// backs off exponentially.
	if failures > 1 {
		delay := wd.BackoffInitial << min(failures-2, 20)
		if delay > wd.BackoffMax || delay <= 0 {
			delay = wd.BackoffMax
		}
		select {
		case <-d.ctx.Done():
			if f.restart == restartDaemon && dm != nil {
				// Taken out of the instance above: Run will not close it.
				_ = dm.Close()
			}
			return
		case <-d.after(delay):
		}
	}
	switch f.restart {
	case restartServer:
		// Each server's exit is waited for before the instance reopens (a
		// new client must get a fresh server, not the one going away),
		// and is no fault when seen later (mpsModel.serverExited).
		var gone []chan struct{}
		for _, pid := range servers {
			d.mu.Lock()
			done := in.mps.shuttingDown(pid)
			d.mu.Unlock()
			if done == nil {
				continue // already gone
			}
			ctx, cancel := context.WithTimeout(d.ctx, wd.ProbeTimeout)
			if err := dm.ShutdownServer(ctx, pid, true); err != nil {
				in.log.Debug("shutdown_server", "server", pid, "err", err)
			}
			cancel()
			gone = append(gone, done)
		}
		wctx, wcancel := context.WithTimeout(d.ctx, max(wd.ProbeTimeout*time.Duration(wd.ProbeFailures), time.Second))
		for _, done := range gone {
			select {
			case <-done:
			case <-wctx.Done():
			}
		}
		if wctx.Err() != nil && d.ctx.Err() == nil {
			in.log.Warn("a server shut down after a fault has not exited yet; reopening the instance anyway")
		}
		wcancel()
	case restartDaemon:
		d.restartDaemon(in, dm)
		return
	}
	if dm == nil {
		return
	}
	ctx, cancel := context.WithTimeout(d.ctx, wd.ProbeTimeout)
	err := dm.Probe(ctx)
	cancel()
	if err != nil && d.ctx.Err() == nil {
		d.mu.Lock()
		if !slices.ContainsFunc(in.pending, func(p fault) bool { return p.restart == restartDaemon }) {
			in.pending = append(in.pending, fault{kind: faultHung, restart: restartDaemon, admin: true,
				reason: fmt.Sprintf("MPS control daemon of group %s on GPU %d does not answer after a fault: %v", in.group, in.gpus[0].Index, err)})
		}
		d.mu.Unlock()
	}
}

// beginRecovery is the part of a recovery that decides and revokes, with
// no wait of its own but the revocation's: the culprits the server's log
// named where facts confirm them (nameLogCulprits), the failure counted
// and its victims picked (planRecoveryLocked), bars and quarantine noted,
// a daemon gone taken out of the instance, and the victims revoked
// (revoke). What is left to the supervisor (recoverOnce) is the
// backoff, the restart and the probe; mpsd's simulation runs this part
// as it is.
func (d *Daemon) beginRecovery(in *instance, pending []fault) recovery {
	// A culprit the server's log named, where facts confirm it; before
	// anything is revoked, so that its process's own end is its own.
	d.nameLogCulprits(in, pending)
	f := combineFaults(pending)
	start := d.clock.Now()
	d.mu.Lock()
	wd := d.cfg.Watchdog
	in.restartsBy[f.kind]++
	in.restarts++
	plan := in.planRecoveryLocked(pending, f, start, wd)
	r := recovery{f: f, plan: plan, start: start, wd: wd}
	for _, uid := range plan.barred {
		b := in.barred[uid]
		in.log.Error("uid barred from the instance: its clients' faults keep taking the server down; mpsctl resume lifts it",
			"uid", uid, "until", b.until, "reason", b.reason)
		r.reopen = append(r.reopen, b.until)
		d.store.request()
	}
	if plan.quarantined {
		d.store.request()
		in.log.Error("instance quarantined: it failed too often; mpsctl resume reopens it",
			"failures", len(in.failures), "window", wd.QuarantineWindow)
	}
	r.failures = len(in.failures)
	r.dm = in.daemon
	r.servers = in.mps.pids()
	if f.restart == restartDaemon {
		in.daemon, in.logHandled = nil, -1
		in.mps.daemonGone()
		in.seen = clientUsage{}
	}
	d.mu.Unlock()
	in.log.Warn("instance failed; recovering", "fault", f.kind, "reason", f.reason, "faults", len(pending), "leases", len(plan.victims), "restarting", f.restart, "failures_in_window", r.failures)

	n := d.revoke(plan.victims, f.reason, revokeHow{dm: r.dm, servers: r.servers, reasons: plan.reasons, spared: plan.spared,
		marked: func() { in.handlingMarked = true }})
	in.log.Info("revocation done", "leases", n, "took", d.clock.Since(start))
	if f.restart == restartNone {
		// A server's fatal fault: MPS keeps the server in FAULT while any
		// client of the fault lives; the revocation ended the leased ones.
		d.mu.Lock()
		for _, p := range pending {
			if p.kind == faultServerFault && p.server > 0 && in.mps.holdFault(p.server) {
				in.log.Warn("MPS server stays in FAULT: clients no lease holds still use it, and it refuses new clients; nothing is placed on the instance until they have gone",
					"server", p.server)
			}
		}
		d.mu.Unlock()
	}
	return r
}

// restartDaemon stops what is left of the old control daemon (its servers
// too) and starts a new one, retrying with the watchdog's backoff.
func (d *Daemon) restartDaemon(in *instance, old control) {
	if old != nil {
		ctx, cancel := context.WithTimeout(d.ctx, 15*time.Second)
		rep, err := old.Stop(ctx)
		cancel()
		_ = old.Close()
		in.log.Info("old control daemon stopped", "daemon_pid", rep.DaemonPID, "killed_servers", rep.KilledServers, "err", err)
	}
	d.mu.Lock()
	cfg := d.mpsConfig(in)
	wd := d.cfg.Watchdog
	d.mu.Unlock()
	backoff := wd.BackoffInitial
	for {
		dm, how, err := d.startDaemon(cfg, true)
		if err == nil {
			d.mu.Lock()
			if d.ctx.Err() != nil {
				d.mu.Unlock()
				_ = dm.Close()
				return
			}
			in.daemon, in.logHandled = dm, dm.ServerLogStart()
			in.probeFails = 0
			in.ringLocked()
			// Saved at once, as in bringUp: the next mpsd adopts only the
			// daemon the state file names.
			d.store.request()
			d.mu.Unlock()
			in.log.Info("control daemon restarted", "how", how, "daemon_pid", dm.PID())
			d.spawn(func() { d.watchInstance(in, dm) })
			return
		}
		d.mu.Lock()
		shutting := d.shuttingDown
		d.mu.Unlock()
		if shutting {
			// mpsctl shutdown ends the MPS service: no new start.
			in.log.Error("control daemon restart failed; not retried: mpsctl shutdown is under way", "err", err)
			return
		}
		in.log.Error("control daemon restart failed", "retry_in", backoff, "err", err)
		select {
		case <-d.ctx.Done():
			return
		case <-d.after(backoff):
		}
		backoff = min(2*backoff, wd.BackoffMax)
	}
}

// onXid applies the blast radius of a GPU fault: a device-level Xid takes
// down every instance on the GPU; an application-level one only the
// instance of the faulting process. NVML's events carry no pid, so on a
// real host an application Xid usually names nobody: it is counted and
// logged, and the instance it hit is found by MPS itself (the server logs
// the fault it contains, or dies), never by taking down every tenant of
// the GPU for one client's bad kernel.
func (d *Daemon) onXid(ev gpu.XidEvent) {
	if ev.GPU < 0 {
		d.log.Warn("Xid on a GPU this host does not know", "xid", ev.Xid)
		return
	}
	d.mu.Lock()
	var on []*instance
	for _, in := range d.instances {
		if slices.Contains(in.p.GPUs, ev.GPU) {
			on = append(on, in)
		}
	}
	var leases []*lease
	for _, in := range on {
		for _, l := range in.leases {
			leases = append(leases, l)
		}
	}
	d.mu.Unlock()
	affected := on
	var culprit culpritID
	if ev.Level == gpu.LevelApplication {
		affected = nil
		for _, l := range leases {
			if ev.PID > 0 && slices.Contains(l.livePids(d.clock), ev.PID) {
				d.mu.Lock()
				if l.inst != nil {
					affected = append(affected, l.inst)
					culprit = culpritID{lease: l.id, uid: l.uid}
				}
				d.mu.Unlock()
				break
			}
		}
		if len(affected) == 0 {
			// An instance whose log is lost has no fault record of its
			// own any more: the Xid is taken for its fault (loglost.go).
			d.mu.Lock()
			for _, in := range on {
				if in.logLostLocked() {
					affected = append(affected, in)
				}
			}
			d.mu.Unlock()
		}
		if len(affected) == 0 {
			d.log.Warn("application Xid names no process of a lease; its instance is left to MPS's own fault signals", "gpu", ev.UUID, "gpu_index", ev.GPU, "xid", ev.Xid, "pid", ev.PID)
		}
	}
	restart := restartNone
	if ev.Level == gpu.LevelDevice {
		restart = restartServer
	}
	d.mu.Lock()
	d.metrics.xids[[2]uint64{uint64(ev.GPU), ev.Xid}]++
	d.mu.Unlock()
	d.log.Warn("GPU Xid", "gpu", ev.UUID, "gpu_index", ev.GPU, "xid", ev.Xid, "level", ev.Level.String(), "pid", ev.PID, "instances", len(affected))
	reported := map[*instance]bool{}
	for _, in := range affected {
		select {
		case <-in.tried:
		default:
			// Its first start or adoption is under way (mpsd is
			// starting): the bring-up finds what the fault left, as it
			// did when Xids were watched only after every first try.
			in.log.Warn("Xid on an instance not yet started; its bring-up handles what is left", "xid", ev.Xid)
			continue
		}
		reported[in] = true
		f := fault{kind: faultXid, restart: restart, culprit: culprit,
			reason: fmt.Sprintf("Xid %d (%s-level) on GPU %d", ev.Xid, ev.Level, ev.GPU)}
		if culprit.lease != "" {
			f.reason = fmt.Sprintf("Xid %d (%s-level) on GPU %d, raised by lease %s (uid %d)", ev.Xid, ev.Level, ev.GPU, culprit.lease, culprit.uid)
		}
		d.reportFault(in, f)
	}
	// An Xid is what confirms an MPS fault record of an instance on the
	// GPU (verify.go); one the Xid itself took down needs no second
	// recovery for it.
	d.xidConfirms(ev, reported)
}
