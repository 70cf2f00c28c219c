package mpsd

import (
	"fmt"
	"slices"
	"time"

	"github.com/mpsd/mpsd/mps"
)

// Culprits a server's log names. Just before a server handles a fatal GPU
// error it logs which client raised it ("Client {PID: C, Context: N}
// encountered a fatal GPU error."). The record comes through the log FIFO,
// which any member can write, naming anyone; and C is the pid the client
// told the server, which a client may choose. So the record is a hint. It
// names the fault's culprit (culprit.go) only on a daemon without
// multiuser, and only when facts no tenant writes confirm it:
//
//   - the fault itself is confirmed: an Xid on the instance's GPUs
//     confirmed the server's fault record (fault.xidConfirmed, verify.go;
//     a fault record read again after mpsd was away has none); the hint
//     came from that server's log before the fault's own record (MPS names
//     the culprit, then handles the fault), within culpritHintAge of the
//     recovery, and was read while mpsd watched the log;
//   - it is the only client the server's log named in that time (two, or
//     a record folded into another while it waited, name nobody: a member
//     who forges a record beside its own real fault only hides itself);
//   - the pid was a process of a running lease of the server's uid, as
//     mpsd's own readings say: the lease's cgroup held it as the hint was
//     read, or held it at a reading at most culpritSeenAge old and it has
//     ended since (a pid the lease held longer ago may be anyone's now).
//     A daemon without multiuser serves one uid per server, so only a
//     lease of the uid whose server faulted can be charged, never another
//     member's;
//   - that process ended: it had exited when the hint was read, or did so
//     within culpritExitWait of it (or, where the recovery begins later,
//     by then), before the recovery revokes anything. A real fault gives
//     every client of the server a sticky error; a forged fault record
//     leaves the process it names running.
//
// What is left to a member who writes the FIFO: a record naming a live
// process of the server's uid, written before a real fault whose server
// names no culprit itself (MPS names one for memory faults), is taken; a
// record beside the server's own names nobody.
//
// On a multiuser daemon the record is never taken: every member's clients
// share the server, a member's client can make the server's own record
// name another member's process (it tells the server its pid), and a real
// fault ends that process too. There only an Xid naming a process names a
// culprit. Otherwise the fault names no culprit and is charged as one that
// names nobody (culprit.go); the record is logged and counted as
// unverified.

const (
	// culpritHintAge is how old a hint may be when its fault's recovery
	// begins: its claim waits at most faultClaimWait for an Xid.
	culpritHintAge = faultClaimWait + 3*time.Second
	// culpritExitWait is how long after its hint the named client has to
	// end on its own.
	culpritExitWait = time.Second
	// culpritSeenAge is how old a reading of a lease's cgroup may be for
	// a process it held, gone when a record names it, to be taken for the
	// lease's (reconciliation reads every lease's cgroup at least every
	// reconLeasedAge probe intervals, 10 s by default).
	culpritSeenAge = 15 * time.Second
	// maxCulpritHints bounds the hints an instance keeps (one per
	// server: a second of a server is folded into the first).
	maxCulpritHints = 8
)

// culpritHint is a server's log naming the client of its next fault.
type culpritHint struct {
	ev mps.Event // the record (Client is the pid it names)
	at time.Time // when mpsd read it
	// lease and uid: the running lease the named pid was a process of
	// ("" when none).
	lease string
	uid   uint32
	// start is the process's start time when the hint was read; gone: it
	// had ended by then.
	start uint64
	gone  bool
	// records: the records the hint stands for (more than 1: it was
	// folded with others of the server, or the bound was hit).
	records int
}

// noteCulpritHint takes a FaultCulprit record of in's daemon dm: it finds
// the lease whose process the record names and keeps the hint for the
// recovery of the server's fault (nameLogCulprits).
func (d *Daemon) noteCulpritHint(in *instance, dm control, ev mps.Event) {
	if !ev.KnownServer {
		d.unverifiedRecord(in, ev, "it names no verified server of the daemon")
		return
	}
	if ev.InServerLog && dm.WrittenUnwatched(ev.LogOffset) {
		// Read again after mpsd was away: the process it names may have
		// ended long since, for any reason.
		in.log.Debug("MPS fault culprit record written while mpsd was away; not used", "server", ev.PID, "client", ev.Client)
		return
	}
	now := d.clock.Now()
	h := culpritHint{ev: ev, at: now, records: 1 + max(ev.Suppressed, 0)}
	d.mu.Lock()
	if d.foldCulpritHintLocked(in, h) {
		// A second name for the server's next fault: it names nobody now,
		// so nothing needs looking up (a member writing records in a
		// loop costs a lookup per server every culpritHintAge at most).
		d.mu.Unlock()
		return
	}
	multiuser := in.p.Multiuser
	suid, _ := in.mps.uidOf(ev.PID)
	var cands []*lease
	for _, l := range in.leases {
		if l.state == leaseRunning && suid >= 0 && l.uid == uint32(suid) {
			cands = append(cands, l)
		}
	}
	d.mu.Unlock()
	if multiuser {
		d.unverifiedRecord(in, ev, "on a multiuser daemon a client's own pid claim names the culprit: only an Xid naming a process does")
		return
	}
	// The pid's lease, from mpsd's records: a process its cgroup holds
	// now, or held at a reading at most culpritSeenAge old and has left
	// since (it ended, or is ending). A pid the lease held longer ago
	// names nobody: its process may have ended for any reason, and the
	// pid be another's.
	slices.SortFunc(cands, func(a, b *lease) int { return int(a.req.Seq - b.req.Seq) })
	var owner *lease
	for _, l := range cands {
		if ok, start, gone := d.leaseProcessAtHint(l, ev.Client); ok {
			owner, h.start, h.gone = l, start, gone
			break
		}
	}
	if owner != nil {
		h.lease, h.uid = owner.id, owner.uid
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.foldCulpritHintLocked(in, h) { // one came meanwhile
		return
	}
	if len(in.culpritHints) >= maxCulpritHints {
		// Bounded: the oldest goes, and the server of the newest can no
		// longer tell its culprit.
		in.culpritHints = in.culpritHints[1:]
		h.records++
	}
	in.culpritHints = append(in.culpritHints, h)
	in.log.Info("MPS names the client of a server's next fault (a hint until facts confirm it)", "server", ev.PID, "client", ev.Client, "lease", h.lease, "ended", h.gone)
}

// leaseProcessAtHint reports whether pid is a process of l as a hint
// naming it is read (ok), with its start time while it runs, or gone once
// it has ended.
func (d *Daemon) leaseProcessAtHint(l *lease, pid int) (ok bool, start uint64, gone bool) {
	if live, read := l.readPids(d.clock); read && slices.Contains(live, pid) {
		p, err := d.procs.open(pid)
		if err != nil {
			return true, 0, true // ended since the reading just now
		}
		defer p.close()
		return true, p.startTime(), !p.alive() // a zombie: ended, not yet reaped
	}
	// Listed by a reading at most culpritSeenAge old (this one included:
	// a process that left as the record came is remembered).
	now := d.clock.Now()
	seenAt, seen := l.seenAt(pid, now)
	if !seen {
		l.logger().Debug("culprit hint: pid not in the lease's cgroup, nor in a recent reading of it", "lease", l.id, "pid", pid)
		return false, 0, false
	}
	p, err := d.procs.open(pid)
	if err != nil {
		return true, 0, true // ended since the recent reading
	}
	defer p.close()
	// Out of the cgroup and still there: the process the reading listed,
	// exiting (the kernel takes an exiting process out of its cgroup
	// before the last of its threads is gone, which under load takes a
	// while), if it started before that reading; one started since took
	// the pid again. The recovery then waits for its end (endsWithin).
	ticks, err := d.procs.bootTicks()
	if err != nil {
		return false, 0, false
	}
	readAt := ticks - uint64(max(now.Sub(seenAt), 0)/(time.Second/userHZ))
	if p.startTime() > readAt {
		l.logger().Debug("culprit hint: pid taken again since the lease's reading listed it", "lease", l.id, "pid", pid, "start", p.startTime(), "read_at", readAt)
		return false, 0, false
	}
	return true, p.startTime(), !p.alive()
}

// foldCulpritHintLocked drops in's hints older than culpritHintAge, and
// folds h into a hint of the same server kept already (then reporting
// true): the server's log has named more than one client since. A hint's
// age is its newest record's: a record folded into an older hint must
// not leave with it while it is young enough to count against the next
// (the simulation found a forged record 4 s before a fault's own dropped
// with the 5.2 s old record it was folded into, and the fault's own taken
// as the only name).
func (d *Daemon) foldCulpritHintLocked(in *instance, h culpritHint) bool {
	in.culpritHints = slices.DeleteFunc(in.culpritHints, func(x culpritHint) bool { return h.at.Sub(x.at) > culpritHintAge })
	for i := range in.culpritHints {
		if in.culpritHints[i].ev.PID == h.ev.PID {
			in.culpritHints[i].records += h.records
			in.culpritHints[i].at = h.at
			return true
		}
	}
	return false
}

// nameLogCulprits names, for each server fault among pending that names
// no culprit yet, the culprit its server's log named, where the facts
// above confirm it; it waits up to culpritExitWait for the named process
// to end. It runs in in's supervisor before the recovery acts.
func (d *Daemon) nameLogCulprits(in *instance, pending []fault) {
	for i := range pending {
		d.mu.Lock()
		f := pending[i]
		if f.kind != faultServerFault || f.culprit.lease != "" || f.server <= 0 {
			d.mu.Unlock()
			continue
		}
		now := d.clock.Now()
		var hints []culpritHint
		records := 0
		for _, h := range in.culpritHints {
			if h.ev.PID == f.server && now.Sub(h.at) <= culpritHintAge {
				hints = append(hints, h)
				records += h.records
			}
		}
		// Used up: a later fault of the server needs hints of its own.
		in.culpritHints = slices.DeleteFunc(in.culpritHints, func(h culpritHint) bool { return h.ev.PID == f.server })
		d.mu.Unlock()
		if len(hints) == 0 {
			continue
		}
		h := hints[0]
		why := ""
		switch {
		case !f.xidConfirmed:
			why = "no Xid confirmed the fault it names a culprit of"
		case h.ev.InServerLog && f.fromServerLog && h.ev.LogOffset > f.logOffset:
			why = "the record came after the fault's own in the server's log (MPS names the culprit before it handles the fault)"
		case records > 1:
			why = fmt.Sprintf("the server's log named %d clients for one fault: none is taken for its culprit", records)
		case h.lease == "":
			why = fmt.Sprintf("pid %d is no process of a running lease of the server's uid", h.ev.Client)
		case !h.gone && !d.endsWithin(h.ev.Client, h.start, h.at.Add(culpritExitWait)):
			why = fmt.Sprintf("pid %d of lease %s still ran %s after the record named it as a fault's culprit", h.ev.Client, h.lease, culpritExitWait)
		}
		d.mu.Lock()
		if l := in.leases[h.lease]; why == "" && (l == nil || l.uid != h.uid) {
			why = fmt.Sprintf("lease %s is gone", h.lease)
		}
		if why == "" {
			pending[i].culprit = culpritID{lease: h.lease, uid: h.uid}
			pending[i].reason += fmt.Sprintf(", raised by lease %s (uid %d): the server's log named its process %d, which ended with the fault", h.lease, h.uid, h.ev.Client)
		} else {
			// Counted as a record not acted on; logged here, once per
			// confirmed fault (not behind the unverified records' gate).
			in.unverified += uint64(records)
		}
		d.mu.Unlock()
		if why != "" {
			in.log.Warn("the server's log named a culprit of the fault; not taken: nothing confirms it", "server", f.server, "client", h.ev.Client, "lease", h.lease, "why", why)
			continue
		}
		in.log.Warn("fault culprit named by the server's log and confirmed by its process's end", "server", f.server, "client", h.ev.Client, "lease", h.lease, "uid", h.uid)
	}
}

// endsWithin reports whether process pid, which had start time start,
// ends (or had ended) by deadline on mpsd's clock, waiting at most
// culpritExitWait.
func (d *Daemon) endsWithin(pid int, start uint64, deadline time.Time) bool {
	p, err := d.procs.open(pid)
	if err != nil {
		return true // gone
	}
	defer p.close()
	if p.startTime() != start {
		return true // the pid names another process: the one named ended
	}
	// In slices of a tenth of the wait, so that mpsd's stop is not held
	// up; at most culpritExitWait in all, whatever the clock says.
	for range 10 {
		wait := min(deadline.Sub(d.clock.Now()), culpritExitWait/10)
		if wait <= 0 || d.ctx.Err() != nil {
			break
		}
		if p.exitsWithin(wait) {
			return true
		}
	}
	return !p.alive()
}
