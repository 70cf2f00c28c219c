package mpsd

import (
	"errors"
	"fmt"
)

// leaseState is where a lease is in its life. Every change goes through
// lease.step, which looks the (state, event) pair up in leaseStep, the
// one table of legal edges:
//
//	| state     | event         | next      | effects                           |
//	|-----------|---------------|-----------|-----------------------------------|
//	| queued    | grant         | running   | persist, tell granted             |
//	| queued    | withdraw      | ended     | (the caller tells why, if anyone) |
//	| running   | revoke        | revoking  | persist, tell revoked, kill       |
//	| running   | release       | releasing | kill                              |
//	| revoking  | requeue       | queued    | free capacity, persist, tell requeued |
//	| revoking  | drop          | ended     | free capacity, persist            |
//	| releasing | released      | ended     | free capacity, persist            |
//
// Every other pair is illegal: step refuses it, logs it and reports it to
// illegalTransition (tests make that fail the test). A lease is placed on
// an instance (inst is set) exactly while it is running, revoking or
// releasing; ended is final.
type leaseState uint8

const (
	// leaseQueued: in its group's queue, new or requeued.
	leaseQueued leaseState = iota
	// leaseRunning: placed on an instance; its command may run.
	leaseRunning
	// leaseRevoking: a revocation (fault, operator, an unfinished one a
	// restart found) took it; it is requeued or ended once its
	// processes are gone. Saved, so that a restart finishes it.
	leaseRevoking
	// leaseReleasing: its launcher is gone; it ends for good once its
	// processes are (a resume finds it gone).
	leaseReleasing
	// leaseEnded: gone from the daemon.
	leaseEnded
)

func (s leaseState) String() string {
	switch s {
	case leaseQueued:
		return "queued"
	case leaseRunning:
		return "running"
	case leaseRevoking:
		return "revoking"
	case leaseReleasing:
		return "releasing"
	case leaseEnded:
		return "ended"
	}
	return fmt.Sprintf("leaseState(%d)", uint8(s))
}

// leaseEvent is what happens to a lease.
type leaseEvent uint8

const (
	// leaseGrant: placement put it on an instance.
	leaseGrant leaseEvent = iota
	// leaseWithdraw: it leaves the queue without running again (its
	// launcher left, its wait ran out, --no-wait, it can no longer fit,
	// its group is gone).
	leaseWithdraw
	// leaseRevoke: a revocation takes it off its instance.
	leaseRevoke
	// leaseRelease: its launcher left while it ran.
	leaseRelease
	// leaseRequeue: the revocation is done and it waits for its next run.
	leaseRequeue
	// leaseDrop: the revocation is done and it ends (its launcher left
	// meanwhile, or its requeue attempts are used up).
	leaseDrop
	// leaseReleased: the release is done.
	leaseReleased
	numLeaseEvents
)

func (e leaseEvent) String() string {
	switch e {
	case leaseGrant:
		return "grant"
	case leaseWithdraw:
		return "withdraw"
	case leaseRevoke:
		return "revoke"
	case leaseRelease:
		return "release"
	case leaseRequeue:
		return "requeue"
	case leaseDrop:
		return "drop"
	case leaseReleased:
		return "released"
	}
	return fmt.Sprintf("leaseEvent(%d)", uint8(e))
}

// leaseEffects are what a lease transition asks of the daemon.
type leaseEffects uint8

const (
	// effPersist: the state file must record the change.
	effPersist leaseEffects = 1 << iota
	// effTellGranted, effTellRevoked, effTellRequeued: the event the
	// launcher is sent. Only these transitions send them, so a launcher
	// is never told of a requeue that no revocation preceded.
	effTellGranted
	effTellRevoked
	effTellRequeued
	// effKill: the lease's processes are to be stopped.
	effKill
	// effFree: its capacity goes back to its instance.
	effFree
)

// errIllegalTransition: a lease or instance was asked for a change its
// table does not have. It is a bug of mpsd, never of a client.
var errIllegalTransition = errors.New("mpsd: illegal state transition")

// leaseStep is the lease's transition table (see leaseState): the next
// state and effects of ev in s, or errIllegalTransition. It is pure.
func leaseStep(s leaseState, ev leaseEvent) (leaseState, leaseEffects, error) {
	switch {
	case s == leaseQueued && ev == leaseGrant:
		return leaseRunning, effPersist | effTellGranted, nil
	case s == leaseQueued && ev == leaseWithdraw:
		return leaseEnded, 0, nil
	case s == leaseRunning && ev == leaseRevoke:
		return leaseRevoking, effPersist | effTellRevoked | effKill, nil
	case s == leaseRunning && ev == leaseRelease:
		return leaseReleasing, effKill, nil
	case s == leaseRevoking && ev == leaseRequeue:
		return leaseQueued, effFree | effPersist | effTellRequeued, nil
	case s == leaseRevoking && ev == leaseDrop:
		return leaseEnded, effFree | effPersist, nil
	case s == leaseReleasing && ev == leaseReleased:
		return leaseEnded, effFree | effPersist, nil
	}
	return s, 0, fmt.Errorf("%w: lease %s on %s", errIllegalTransition, s, ev)
}

// illegalTransition is told of every illegal transition after it is
// logged; tests set it to fail loudly (main_test.go).
var illegalTransition = func(error) {}

// step applies ev to l (under Daemon.mu) and returns the effects for the
// caller to carry out; an illegal ev leaves l as it is.
func (l *lease) step(ev leaseEvent, why string) (leaseEffects, error) {
	next, eff, err := leaseStep(l.state, ev)
	if err != nil {
		err = fmt.Errorf("lease %s (%s): %w", l.id, why, err)
		if l.log != nil {
			l.log.Error("illegal lease transition (a bug of mpsd)", "lease", l.id, "state", l.state.String(), "event", ev.String(), "why", why)
		}
		illegalTransition(err)
		return 0, err
	}
	l.state = next
	return eff, nil
}
