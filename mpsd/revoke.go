package mpsd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
)

// revokeHow is what a revocation knows of its victims besides the leases.
type revokeHow struct {
	// dm and servers: the daemon whose servers the victims are clients
	// of, asked to terminate them first; nil when there is none to ask
	// (it is gone, or mpsd has just started).
	dm      control
	servers []int
	// force: an operator's requeue, which does not use up an attempt.
	force bool
	// finish: the victims are already revoking (a revocation the previous
	// mpsd began and recorded); it is finished, not begun.
	finish bool
	// end: the victims are not requeued but end with this error once
	// their processes are gone (mpsctl shutdown).
	end *api.Error
	// reasons, by lease id, overrides the reason for those victims: a
	// recovery of several faults tells each victim its own fault's.
	reasons map[string]string
	// spared, by lease id: victims of a fault another lease (its
	// culprit) caused; their requeue does not use up an attempt.
	spared map[string]bool
	// marked, when set, runs under Daemon.mu once the victims are marked
	// revoking, before the state write that records them (a recovery
	// notes that its faults need not be read again).
	marked func()
	// signal, when set (mpsctl cancel --signal), is sent to the victims'
	// processes once their launchers are told, and the revocation waits
	// up to its grace for them to end before MPS and the kill end the
	// rest; revoke records there what the signal did.
	signal *revokeSignal
}

// revokeSignal is a revocation's signal before its kill.
type revokeSignal struct {
	sig   unix.Signal
	grace time.Duration
	// Filled by revoke: the processes the signal reached, and whether
	// some were left when the grace ran out.
	signalled int
	left      bool
}

// revoke is the one revocation sequence, for recovery, an operator's
// requeue and the revocations a restart finds unfinished:
//
//  1. each victim still running is marked revoking (one that is not has
//     an owner of its end already: a release or another revocation);
//  2. the state file records it before anything is done, so that if
//     mpsd dies now the next one finishes the revocation instead of
//     taking a victim whose command died for a job that ended (until the
//     state writer starts, at mpsd's start, it is recorded with the
//     first write instead);
//  3. each victim's launcher is told (revoked);
//  4. MPS terminates the victims' clients of a live server;
//  5. each victim's cgroup is killed;
//  6. each is requeued, or ended (requeue); with how.end, ended with
//     that error.
//
// mpsd's own stop (SIGTERM) revokes nothing: daemons and workloads run
// on. A revocation it interrupts stays recorded as revoking, and the next
// mpsd finishes it through here. mpsctl shutdown revokes every running
// lease through here too, with how.end (shutdown.go). It returns the victims it took.
func (d *Daemon) revoke(victims []*lease, reason string, how revokeHow) int {
	d.mu.Lock()
	var taken []*lease
	why := map[*lease]string{}
	persist := false
	for _, l := range victims {
		if d.leases[l.id] != l {
			continue // ended meanwhile
		}
		r := reason
		if o, ok := how.reasons[l.id]; ok {
			r = o
		}
		if how.finish {
			if l.state == leaseRevoking {
				taken = append(taken, l)
				why[l] = r
			}
			continue
		}
		p, ok := l.markRevokedLocked(r, how.end, how.spared[l.id])
		if !ok {
			continue
		}
		persist = persist || p
		taken = append(taken, l)
		why[l] = r
	}
	if how.marked != nil {
		how.marked()
		persist = true
	}
	var written <-chan struct{}
	if persist {
		written = d.store.request()
	}
	d.mu.Unlock()
	if len(taken) == 0 {
		return 0
	}
	if written != nil {
		select {
		case <-d.storeRunning:
			select {
			case <-written:
			case <-d.ctx.Done():
			}
		default:
			// The state writer starts once every instance has had its
			// first try (what the saved state names must be adopted
			// before it is written over); until then the request is
			// written with everything else.
		}
	}
	for _, l := range taken {
		l.box.push(api.Event{Type: api.EventRevoked, Reason: why[l]})
	}
	if how.signal != nil {
		d.signalLeases(taken, how.signal)
		if d.ctx.Err() != nil {
			// mpsd stops in the grace: its stop revokes nothing more.
			// The revocation stays recorded, with its end, and the next
			// mpsd finishes it (restoreState).
			return len(taken)
		}
	}
	if dm := how.dm; dm != nil && !dm.Exited() {
		mine := map[int]bool{}
		for _, l := range taken {
			for _, pid := range l.livePids(d.clock) {
				mine[pid] = true
			}
		}
		for _, server := range how.servers {
			ctx, cancel := context.WithTimeout(d.ctx, time.Second)
			clients, err := dm.ClientList(ctx, server)
			cancel()
			if err != nil {
				continue
			}
			for _, c := range clients {
				if !mine[c] {
					continue
				}
				ctx, cancel := context.WithTimeout(d.ctx, 2*time.Second)
				_ = dm.TerminateClient(ctx, server, c)
				cancel()
			}
		}
	}
	var wg sync.WaitGroup
	for _, l := range taken {
		wg.Go(func() {
			if err := d.killLease(l); err != nil {
				// requeue leaves it on its instance, capacity and all,
				// until a retry of the kill succeeds.
				d.killFailed(l, "revoke", err)
				d.mu.Lock()
				l.killStuck = true
				d.mu.Unlock()
			}
		})
	}
	wg.Wait()
	d.requeue(taken, why, how.force)
	return len(taken)
}

// cancelPoll is how often a revocation with a signal looks whether its
// victims' processes have ended within the grace.
const cancelPoll = 50 * time.Millisecond

// signalLeases sends s.sig to the processes of leases (each proven a
// member of its lease's cgroup) and waits, up to s.grace on the daemon's
// clock, until none is left, or mpsd stops.
func (d *Daemon) signalLeases(leases []*lease, s *revokeSignal) {
	cgs := make([]cgroup.Lease, 0, len(leases))
	for _, l := range leases {
		// Under cgMu, as the kill: an attach that moved a process into
		// the cgroup and finds it was not the one it checked moves it
		// back under the same lock, so no stranger is signalled.
		l.cgMu.Lock()
		if l.cg != nil {
			cgs = append(cgs, l.cg)
			n, err := l.cg.Signal(s.sig)
			s.signalled += n
			if err != nil {
				d.log.Warn("signal before a revocation's kill failed; the kill ends the processes", "cgroup", l.cg.Path(), "signal", s.sig.String(), "err", err)
			}
		}
		l.cgMu.Unlock()
	}
	if s.signalled == 0 {
		// Nothing to wait for (no process, or no cgroup: a pod's lease,
		// whose container's processes MPS and the kill end).
		s.left = len(cgs) == 0
		return
	}
	deadline := d.clock.Now().Add(s.grace)
	for {
		s.left = false
		for _, cg := range cgs {
			if p, err := cg.Pids(); err == nil && len(p) > 0 {
				s.left = true
				break
			}
		}
		wait := deadline.Sub(d.clock.Now())
		if !s.left || wait <= 0 {
			return
		}
		t := d.clock.NewTimer(min(wait, cancelPoll))
		select {
		case <-t.C():
		case <-d.ctx.Done():
			t.Stop()
			return
		}
	}
}

// markRevokedLocked takes a running lease for a revocation (revoke's
// step 1): it is revoking, with its reason, how it ends (nil: requeued)
// and whether its requeue is spared. ok is false when it is not running:
// its end has an owner already (a release or another revocation).
// persist: the state file must record the change. Daemon.mu is held.
func (l *lease) markRevokedLocked(reason string, end *api.Error, spare bool) (persist, ok bool) {
	if l.state != leaseRunning {
		return false, false
	}
	eff, err := l.step(leaseRevoke, reason)
	if err != nil {
		return false, false
	}
	l.revokedFor, l.endWith, l.spareNext = reason, end, spare
	l.logger().Info("lease revoked", l.logAttrs("attempt", l.attempt, "reason", reason)...)
	return eff&effPersist != 0, true
}

// requeue ends the revocation of leases whose processes are gone: each is
// taken off its instance and put back at the head of its group's queue
// with the next attempt number, or ends when its requeue attempts are
// used up (force: an operator's requeue, and a victim of another lease's
// fault, do not count against them) or its launcher left meanwhile. One whose kill failed stays on its
// instance, holding its capacity, until a retry of the kill succeeds;
// only then is it requeued.
//
// why is each victim's reason, as its revocation told it.
// requeueCharge decides, for a revoked lease about to be requeued, whether
// the requeue is spared (force, or its revocation was another lease's
// fault: it uses up no attempt) and whether the lease has no attempt left
// for a charged one. It takes the revocation's spare.
func (l *lease) requeueCharge(force bool) (spare, exhausted bool) {
	spare = force || l.spareNext
	l.spareNext = false
	return spare, !spare && l.charged() >= l.requeue
}

func (d *Daemon) requeue(victims []*lease, why map[*lease]string, force bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	groups := map[string]bool{}
	for _, l := range victims {
		if d.leases[l.id] != l || l.state != leaseRevoking {
			continue // ended meanwhile
		}
		reason := why[l]
		if l.killStuck {
			l.killStuck = false // retryKillLocked's to set while it runs
			d.retryKillLocked(l, func() { d.requeue([]*lease{l}, map[*lease]string{l: reason}, force) })
			continue
		}
		spare, exhausted := l.requeueCharge(force)
		ev := leaseRequeue
		if l.abandoned || exhausted || l.endWith != nil {
			ev = leaseDrop
		}
		eff, err := l.step(ev, reason)
		if err != nil {
			continue
		}
		log := l.logger() // the instance's, before it is left
		if in := l.inst; in != nil && eff&effFree != 0 {
			in.p.Release(&l.req)
			delete(in.leases, l.id)
			l.lastGPUs = gpuIndexes(in)
			l.inst = nil
			l.memUsed, l.memOverSince = nil, time.Time{} // read anew where it runs next
			// An operator's requeue of a retiring instance's last lease
			// (or a kill retried after its recovery) empties it.
			d.retireIfEmptyLocked(in)
		}
		groups[l.group] = true
		switch {
		// Each end's log line is written once the history has it. A
		// lease given an end (a cancel's, a shutdown's) ends as that end,
		// even if its launcher left during the revocation.
		case l.endWith != nil:
			delete(d.leases, l.id)
			d.endedLocked(l, endedByError(l.endWith), l.endWith.Message, log, "lease ended after its revocation", "attempt", l.attempt, "code", l.endWith.Code, "launcher_gone", l.abandoned)
			l.box.push(api.Event{Type: api.EventError, Code: l.endWith.Code, Message: l.endWith.Message})
			d.noteAwayEndLocked(l, l.endWith.Code, l.endWith.Message)
		case l.abandoned:
			delete(d.leases, l.id)
			d.endedLocked(l, api.EndedLauncherGone, "its launcher left while it was revoked: "+reason, log, "lease ended after its revocation: its launcher left", "attempt", l.attempt)
		case exhausted:
			delete(d.leases, l.id)
			msg := fmt.Sprintf("lease revoked: %s; no requeue attempts left (%d used)", reason, l.charged())
			d.endedLocked(l, api.EndedExhausted, msg, log, "lease ended after its revocation: no requeue attempts left", "attempt", l.attempt)
			l.box.push(api.Event{Type: api.EventError, Code: api.CodeAttemptsExhausted, Message: msg})
			d.noteAwayEndLocked(l, api.CodeAttemptsExhausted, msg)
		default:
			l.attempt++
			if spare {
				l.spared++
			}
			l.cgMu.Lock()
			l.cgAttempt = l.attempt // no child of the revoked attempt joins
			l.cgMu.Unlock()
			l.req.Requeued = true
			l.queuedAt = d.clock.Now()
			l.position, l.waitReason = 0, ""
			if eff&effTellRequeued != 0 {
				l.box.push(api.Event{Type: api.EventRequeued, Attempt: l.attempt})
			}
			d.metrics.requeues[l.group]++
			d.queues[l.group] = append(d.queues[l.group], l)
			log.Info("lease requeued", l.logAttrs("attempt", l.attempt)...)
		}
	}
	if len(groups) > 0 {
		d.store.request()
	}
	for g := range groups {
		d.scheduleLocked(g)
	}
}

// charged is how many of the lease's requeues used up an attempt.
func (l *lease) charged() int { return l.attempt - 1 - l.spared }
