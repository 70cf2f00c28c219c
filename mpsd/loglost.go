package mpsd

import (
	"context"
	"time"

	"github.com/mpsd/mpsd/internal/clock"
)

// A lost MPS log. Any member of a group can write records into its
// instance's log FIFO (world-writable, NVIDIA's choice), and one record
// header whose length field is huge makes NVIDIA's logger swallow every
// later record, the daemon's own included: the server's fault records stop
// reaching server.log, and a release can no longer wait for the record of
// the fault that ended its command. mpsd notices it from its own probes:
// each probe is a command the daemon logs, and a probe whose record has not
// come back by the probes after it means the log is lost
// (mps.LogSilentSince, logLostProbes).
// Then, until the daemon is replaced:
//
//   - it says so: an error in its log, mpsd_mps_log_lost, the MPSLogLost
//     alert;
//   - faults are still detected from what no tenant writes: servers'
//     pidfds and exits (as always), the daemon's answers (every probe's
//     get_server_list finds new servers), and NVML Xids: an application
//     Xid that names no lease's process is taken for a fault of each
//     instance on its GPU whose log is lost (its log would have named the
//     server; MPS gives every client of a faulting server the error), and
//     a release (a command that ended) waits up to faultClaimWait for an
//     Xid on the instance's GPUs, so that a command killed by a fault is
//     revoked and requeued, not released as if it had ended by itself;
//   - the daemon is replaced once no lease runs on it (retireIfEmptyLocked):
//     a poisoned NVIDIA daemon does not exit on quit, so its stop ends it
//     through its verified pidfd, which frees its control_lock;
//   - a daemon that dies or stops answering with its log lost (NVIDIA's
//     dies of SIGSEGV some 6 KiB of records after the poisoned header,
//     which mpsd's own commands bring within seconds) charges nobody: its
//     leases are requeued without using up attempts, and the instance
//     counts no failure towards quarantine (chargeUnlessLogLost). A member
//     can so make every lease of the instance start over, but cannot
//     close the instance or exhaust a neighbour's attempts.

// logLoss is a daemon whose log was found lost, and since when it has
// carried no probe back.
type logLoss struct {
	dm    control
	since time.Time
}

// logLostLocked reports whether the instance's current daemon's log is
// lost.
func (in *instance) logLostLocked() bool {
	return in.logLost.dm != nil && in.logLost.dm == in.daemon
}

// The log counts as lost once logLostProbes probes in a row have not been
// logged, the oldest of them at least logLostAfter ago: the record of the
// probe just answered may still be on its way, one sent while the daemon
// started may predate the log follower, and the follower may lag a loaded
// host by seconds. With the default probe interval (2 s) a lost log is
// noticed within about three probes.
const logLostProbes = 3

func logLostAfter(interval time.Duration) time.Duration { return max(2*interval, logEchoMin) }

const logEchoMin = 5 * time.Second

// checkLog, after a probe of dm answered, notes whether dm's log still
// carries the probes back, saying so when that changes, and replaces a
// daemon found with a lost log once the instance has no lease.
func (d *Daemon) checkLog(in *instance, dm control) {
	since, unlogged := dm.LogSilentSince()
	silent := unlogged > 0
	now := d.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if in.daemon != dm {
		return
	}
	lost := in.logLostLocked()
	switch {
	case unlogged >= logLostProbes && !lost && now.Sub(since) >= logLostAfter(d.cfg.Watchdog.ProbeInterval):
		in.logLost = logLoss{dm: dm, since: since}
		in.log.Error("MPS log lost: the control daemon answers but no longer logs mpsd's probes (a record written into its log FIFO can do that); faults are detected from pidfds, the daemon's answers and Xids until the daemon is replaced, which happens once no lease runs on it",
			"daemon", dm.PID(), "silent_since", since, "leases", len(in.leases))
		d.retireIfEmptyLocked(in)
	case !silent && lost:
		in.log.Info("MPS log carries mpsd's probes again", "daemon", dm.PID(), "lost_for", now.Sub(in.logLost.since).Round(time.Millisecond))
		in.logLost = logLoss{}
	}
}

// ringLocked wakes whoever waits on the instance's bell (an Xid on its
// GPUs, a probe's outcome, a fault reported).
func (in *instance) ringLocked() {
	if in.bell != nil {
		close(in.bell)
		in.bell = nil
	}
}

// bellLocked is the channel the next ringLocked closes.
func (in *instance) bellLocked() <-chan struct{} {
	if in.bell == nil {
		in.bell = make(chan struct{})
	}
	return in.bell
}

// waitXidIfLogLost: a release of l (its command ended) on an instance
// whose log is lost waits up to faultClaimWait for an Xid on the
// instance's GPUs, or for a fault that takes l, since the server's record
// of a fault that killed the command will not come. It returns at once
// otherwise.
func (d *Daemon) waitXidIfLogLost(ctx context.Context, l *lease) {
	deadline := d.clock.NewTimer(faultClaimWait)
	defer deadline.Stop()
	// At each Xid the fault, if it takes l, is pending.
	d.waitOnBell(ctx, l, deadline, func(in *instance) bool { return in.logLostLocked() })
}

// waitOnBell waits while l runs on an instance for which waiting(in) holds
// and no fault is coming for l, looking again at each ring of the
// instance's bell, until deadline fires or ctx ends. d.mu is held for
// waiting.
func (d *Daemon) waitOnBell(ctx context.Context, l *lease, deadline clock.Timer, waiting func(in *instance) bool) {
	for {
		d.mu.Lock()
		in := l.inst
		if in == nil || l.state != leaseRunning || !waiting(in) || l.revocationComingLocked(0) {
			d.mu.Unlock()
			return
		}
		bell := in.bellLocked()
		d.mu.Unlock()
		select {
		case <-bell:
		case <-deadline.C():
			return
		case <-ctx.Done():
			return
		}
	}
}

// A daemon killed by SIGSEGV with logLostAtEndProbes of its probes in a
// row not logged, the oldest at least logLostAtEndAge before, lost its log
// first: NVIDIA's daemon dies so some 6 KiB of records after a poisoned
// header, which mpsd's own commands bring within seconds, often before
// the log counts as lost while the daemon lives (logLostProbes,
// logEchoMin). Any other end (SIGKILL, a hang) counts as log-lost only
// once the log was found lost while the daemon answered.
const (
	logLostAtEndProbes = 2
	logLostAtEndAge    = time.Second
)

// chargeUnlessLogLost marks f, the death or hang of in's daemon dm,
// uncharged when dm's log was lost: a member who poisoned the log FIFO
// can end the daemon so, and neither the victims nor the instance are
// charged for it (no attempt used up, no quarantine counted). segv says
// the daemon was killed by SIGSEGV. The reason says so.
func (d *Daemon) chargeUnlessLogLost(in *instance, dm control, f *fault, segv bool) {
	since, unlogged := dm.LogSilentSince()
	d.mu.Lock()
	lost := in.logLost.dm == dm
	d.mu.Unlock()
	lostAtEnd := segv && unlogged >= logLostAtEndProbes && d.clock.Since(since) >= logLostAtEndAge
	if !lost && !lostAtEnd {
		return
	}
	f.uncharged = true
	f.reason += "; its log was lost before (a record written into its log FIFO can do that): nobody is charged"
	in.log.Error("control daemon ended after its log was lost: its log FIFO may have been poisoned; its leases are requeued without using up attempts and it counts towards no quarantine",
		"daemon", dm.PID(), "fault", f.kind, "unlogged_probes", unlogged)
}
