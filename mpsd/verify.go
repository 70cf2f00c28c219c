package mpsd

import (
	"fmt"
	"slices"
	"time"

	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/mps"
)

// MPS's log records are hints, never facts: NVIDIA's control daemon makes
// the log FIFO of every pipe directory world-writable and copies each
// record written into it to control.log or server.log verbatim, with the
// kind and pid its writer chose (docs/security.md). So a record that would
// revoke leases is first confirmed by something a tenant cannot write:
//
//   - a server's exit is taken from its pidfd alone (package mps), never
//     from a log line;
//   - a fault a server contains ("Server is handling a fatal GPU error.")
//     must name a server of the daemon verified through its pidfd (mps:
//     Event.KnownServer) and be matched by an NVML Xid on one of the
//     instance's GPUs: the driver reports a client's fatal fault (an MMU
//     fault, Xid 31, for an illegal address) as it happens. The record and
//     the Xid travel separately, so whichever comes second completes the
//     match; a record waits faultClaimWait for its Xid, and an Xid
//     confirms a record that follows within xidEvidenceWindow. Each Xid
//     confirms at most one record per instance. At most
//     maxClaimsPerServer records of one server wait at once; more join
//     the newest (its count of records grows), so a member writing them
//     as fast as it can makes that many claims per server every
//     faultClaimWait, not one each, while real faults (each a record and
//     an Xid) are still paired one to one. A server's FAULT state
//     cannot serve: a real H200 left it in less than 100 ms
//     (docs/gpu-probe);
//   - a start failure ("Failed to start server using uid …") cannot be
//     confirmed: it is only logged (a server that started and died is
//     reported by its pidfd);
//   - a fault record written while mpsd was away (read again from where
//     the last mpsd left server.log) cannot be matched with an Xid any
//     more: it takes only the leases whose processes are all gone within
//     a second, never one that runs on;
//   - "fatal exception" lines announce a server's end, which its pidfd
//     reports: they are only logged.
//
// A record nothing confirms revokes nothing and counts for no quarantine:
// it is logged and counted (mpsd_unverified_mps_records_total).

const (
	// faultClaimWait is how long a fault record waits for its Xid.
	faultClaimWait = 2 * time.Second
	// maxClaimsPerServer bounds the fault records of one server waiting
	// for an Xid at once.
	maxClaimsPerServer = 8
	// xidEvidenceWindow is how long an Xid confirms a fault record that
	// comes after it.
	xidEvidenceWindow = 5 * time.Second
	// unwatchedFaultWait is how long a fault record read after mpsd was
	// away waits for the leases it hit to end (endedLeases).
	unwatchedFaultWait = time.Second
)

// faultClaim is a fault record of the instance waiting for an Xid, with
// the barriers that wait behind it (a barrier means every earlier record
// is handled, so it is acked only once the claim is settled).
type faultClaim struct {
	f        fault
	ev       mps.Event
	dm       control // whose server the record named
	at       time.Time
	barriers []mps.Event
	settled  bool
	// decided is closed once the claim is settled and acted on: its fault
	// reported (pending on the instance) or dropped as unconfirmed.
	decided chan struct{}
}

// claimServerFaultLocked takes a ServerFault record of a verified server:
// it is confirmed now by an Xid already seen on the instance's GPUs (the
// fault to report is returned), or waits for one as a claim (nil; joined
// reports that it joined the newest of the maxClaimsPerServer claims
// already waiting for that server, so it adds no claim and no timer).
func (d *Daemon) claimServerFaultLocked(in *instance, dm control, ev mps.Event, f fault, now time.Time) (confirmed *fault, joined bool) {
	if d.takeXidLocked(in, now) {
		f.xidConfirmed = true
		return &f, false
	}
	var newest *faultClaim
	waiting := 0
	for _, c := range in.claims {
		if c.dm == dm && c.ev.PID == ev.PID {
			newest = c
			waiting++
		}
	}
	if waiting >= maxClaimsPerServer {
		// More of that server's records than real faults come at once:
		// this one is handled with the newest claim (counted as one more
		// record if it expires; marked read with it).
		newest.ev.Suppressed += 1 + max(ev.Suppressed, 0)
		if ev.InServerLog && newest.ev.InServerLog && ev.LogOffset > newest.ev.LogOffset {
			newest.ev.LogOffset, newest.f.logOffset = ev.LogOffset, ev.LogOffset
		}
		return nil, true
	}
	c := &faultClaim{f: f, ev: ev, dm: dm, at: now, decided: make(chan struct{})}
	in.claims = append(in.claims, c)
	// Armed here, when the claim begins, not in the goroutine: on a fake
	// clock, time advanced after this call must count toward the wait.
	t := d.clock.NewTimer(faultClaimWait)
	started := d.spawn(func() {
		defer t.Stop()
		select {
		case <-t.C():
		case <-d.ctx.Done():
		}
		d.mu.Lock()
		if c.settled {
			d.mu.Unlock()
			return
		}
		expired := d.settleClaimLocked(in, c)
		d.mu.Unlock()
		if d.ctx.Err() == nil {
			d.unverifiedRecord(in, c.ev, fmt.Sprintf("no Xid on the instance's GPUs within %s", faultClaimWait))
		}
		d.decideClaim(in, c)
		for _, b := range expired {
			b.Ack()
		}
	})
	if !started { // mpsd is stopping: the next one reads the record again
		t.Stop()
		d.settleClaimLocked(in, c)
		d.decideClaimLocked(in, c)
	}
	return nil, false
}

// takeXidLocked reports whether an Xid on one of in's GPUs newer than the
// last one in used, and at most xidEvidenceWindow old, confirms a record
// now; it uses that Xid up for in.
func (d *Daemon) takeXidLocked(in *instance, now time.Time) bool {
	newest := d.newestXidLocked(in)
	if newest.IsZero() || !newest.After(in.xidUsed) || now.Sub(newest) > xidEvidenceWindow {
		return false
	}
	in.xidUsed = newest
	return true
}

// newestXidLocked is the time of the newest Xid on in's GPUs (zero: none).
func (d *Daemon) newestXidLocked(in *instance) time.Time {
	var newest time.Time
	for _, g := range in.p.GPUs {
		if t, ok := d.xidAt[g]; ok && t.After(newest) {
			newest = t
		}
	}
	return newest
}

// xidHandledLocked reports whether the newest Xid on in's GPUs, within
// xidEvidenceWindow of now, is one that took in down itself (its own
// fault, reported by onXid) while server ran: a fault record of that
// server that comes after it is the same fault's, and needs no recovery
// of its own. A server started after the Xid (its recovery's, or the
// next uid's) had no part in it: its record is a fault of its own (the
// chaos soak met a culprit's fault on such a server dropped so, and its
// leases released as if their commands had ended by themselves).
func (d *Daemon) xidHandledLocked(in *instance, now time.Time, server int) bool {
	newest := d.newestXidLocked(in)
	return !newest.IsZero() && newest.Equal(in.xidHandled) && now.Sub(newest) <= xidEvidenceWindow &&
		slices.Contains(in.xidHandledServers, server)
}

// settleClaimLocked takes c off in's claims and returns its barriers for
// the caller to ack once it has acted on the claim. Until the caller has
// (decideClaim), c is in in.deciding: a release that looks for a record
// naming its lease meanwhile must still find it, and wait.
func (d *Daemon) settleClaimLocked(in *instance, c *faultClaim) []mps.Event {
	c.settled = true
	in.claims = slices.DeleteFunc(in.claims, func(x *faultClaim) bool { return x == c })
	in.deciding = append(in.deciding, c)
	b := c.barriers
	c.barriers = nil
	return b
}

// decideClaim: the settled claim c has been acted on (its fault reported,
// pending on the instance, or dropped as unconfirmed); whoever waits for
// it may look again.
func (d *Daemon) decideClaim(in *instance, c *faultClaim) {
	d.mu.Lock()
	d.decideClaimLocked(in, c)
	d.mu.Unlock()
}

func (d *Daemon) decideClaimLocked(in *instance, c *faultClaim) {
	in.deciding = slices.DeleteFunc(in.deciding, func(x *faultClaim) bool { return x == c })
	close(c.decided)
}

// holdBarrierLocked keeps a barrier behind in's pending claims; false
// when there are none (ack it now).
func (in *instance) holdBarrierLocked(b mps.Event) bool {
	if len(in.claims) == 0 {
		return false
	}
	c := in.claims[len(in.claims)-1]
	c.barriers = append(c.barriers, b)
	return true
}

// xidConfirms notes an Xid on a GPU and settles the oldest fault claim of
// each instance on it: the Xid confirms it, and its fault is reported
// unless alsoReported (the Xid itself takes that instance down).
func (d *Daemon) xidConfirms(ev gpu.XidEvent, alsoReported map[*instance]bool) {
	type confirmed struct {
		in       *instance
		c        *faultClaim
		f        fault
		barriers []mps.Event
	}
	var done []confirmed
	d.mu.Lock()
	if d.xidAt == nil {
		d.xidAt = map[int]time.Time{}
	}
	d.xidAt[ev.GPU] = ev.Time
	for _, in := range d.instances {
		if !slices.Contains(in.p.GPUs, ev.GPU) {
			continue
		}
		in.ringLocked() // a release waiting while the log is lost
		if len(in.claims) == 0 {
			if alsoReported[in] && ev.Time.After(in.xidUsed) {
				// The Xid took the instance down itself: the record of
				// the same fault that MPS writes after it is that
				// fault's, not a second one (xidHandledLocked).
				in.xidUsed, in.xidHandled, in.xidHandledServers = ev.Time, ev.Time, in.mps.pids()
			}
			continue
		}
		if !d.takeXidLocked(in, ev.Time) {
			continue
		}
		c := in.claims[0]
		f := c.f
		f.xidConfirmed = true
		if c.dm != in.daemon {
			// The daemon whose server it named is gone, and its
			// recovery took every lease it had: nothing is left to take.
			f.kind = ""
		}
		done = append(done, confirmed{in, c, f, d.settleClaimLocked(in, c)})
	}
	d.mu.Unlock()
	for _, c := range done {
		if !alsoReported[c.in] && c.f.kind != "" {
			c.in.log.Info("MPS fault record confirmed by an Xid", "xid_gpu_index", ev.GPU, "xid", ev.Xid)
			d.reportFault(c.in, c.f)
		}
		d.decideClaim(c.in, c.c)
		for _, b := range c.barriers {
			b.Ack()
		}
	}
}

// endedLeases are the running leases of in whose processes are all gone
// within unwatchedFaultWait: the clients a real fault hit end on their
// sticky error, and those of a fault read late are ending as mpsd comes
// back. A lease still running after that was not hit (or takes longer to
// notice: it then ends with its CUDA error, unrequeued). It polls: the
// processes are no children of mpsd.
func (d *Daemon) endedLeases(in *instance) []string {
	d.mu.Lock()
	var ls []*lease
	for _, l := range in.leases {
		if l.state == leaseRunning {
			ls = append(ls, l)
		}
	}
	d.mu.Unlock()
	var ended []string
	deadline := d.clock.NewTimer(unwatchedFaultWait)
	defer deadline.Stop()
	tick := d.clock.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ls = slices.DeleteFunc(ls, func(l *lease) bool {
			if len(l.livePids(d.clock)) == 0 {
				ended = append(ended, l.id)
				return true
			}
			return false
		})
		if len(ls) == 0 {
			return ended
		}
		select {
		case <-tick.C():
		case <-deadline.C():
			return ended
		case <-d.ctx.Done():
			return ended
		}
	}
}

// unverifiedRecord notes an MPS log record mpsd did not act on: logged,
// counted, and marked handled so the next mpsd does not read it again.
// At most one warning a second per instance: a tenant writing records
// in a loop must not flood mpsd's log (the counter counts them all).
func (d *Daemon) unverifiedRecord(in *instance, ev mps.Event, why string) {
	now := d.clock.Now()
	d.mu.Lock()
	// Suppressed: records mps dropped unreported before this one (its
	// own bound on a flood).
	in.unverified += 1 + uint64(max(ev.Suppressed, 0))
	if ev.InServerLog && in.logHandled >= 0 {
		in.logHandled = max(in.logHandled, ev.LogOffset+1)
		d.store.request()
	}
	_, pass := in.unverifiedLog.pass(now, 1)
	total := in.unverified
	d.mu.Unlock()
	if !pass {
		return
	}
	in.log.Warn("MPS log record not acted on: nothing confirms it (anyone who can reach the pipe directory can write MPS log records)",
		"record", ev.Kind.String(), "pid", ev.PID, "uid", ev.UID, "message", ev.Message, "why", why, "unverified_total", total)
}

// logGate lets one log line a second through, for what anyone may make
// mpsd log as often as it likes. Guarded by its owner's lock.
type logGate struct {
	at   time.Time // when a line last went through
	held int       // what the lines held back since stood for
}

// pass counts n more of what the line is about and reports whether a
// line goes through at now, and how many it stands for (n and those held
// back since the last one).
func (g *logGate) pass(now time.Time, n int) (int, bool) {
	g.held += n
	if now.Sub(g.at) < time.Second {
		return 0, false
	}
	total := g.held
	g.at, g.held = now, 0
	return total, true
}
