package mpsd

import (
	"fmt"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/policy"
)

// lifecycle is where an instance's MPS control daemon is in its life.
// Every change goes through instance.step, which looks the (lifecycle,
// event) pair up in instanceStep, the one table of legal edges:
//
//	| lifecycle  | event     | next       | effects                              |
//	|------------|-----------|------------|--------------------------------------|
//	| starting   | up        | up         | schedule                             |
//	| starting   | fault     | recovering | revoke (a daemon is there: adopted)  |
//	| up         | fault     | recovering | revoke                               |
//	| up         | stop      | stopping   | stop daemon                          |
//	| recovering | recovered | up         | schedule                             |
//	| stopping   | restart   | starting   | bring up                             |
//	| stopping   | gone      | stopped    | —                                    |
//	| starting   | gone      | stopped    | — (left the config, no daemon yet)   |
//
// Every other pair is illegal: step refuses it, logs it and reports it to
// illegalTransition. A fault while a bring-up has no daemon yet is not an
// event of the table: it waits in pending for the bring-up (reportFault).
// Besides its lifecycle an instance has holds, which close it to new
// placements whatever its lifecycle (see placementState).
type lifecycle uint8

const (
	// instStarting: a bring-up owns it: the daemon is being started or
	// adopted (with retries), or has been and its first events are being
	// read.
	instStarting lifecycle = iota
	// instUp: the daemon answers and takes clients.
	instUp
	// instRecovering: a recovery owns it: leases are being revoked, the
	// daemon or servers restarted.
	instRecovering
	// instStopping: it is empty and its daemon is being stopped, to be
	// started again (a start option changed) or for good (it left the
	// config).
	instStopping
	// instStopped: gone from the config and stopped; not in
	// Daemon.instances any more.
	instStopped
)

func (c lifecycle) String() string {
	switch c {
	case instStarting:
		return "starting"
	case instUp:
		return "up"
	case instRecovering:
		return "recovering"
	case instStopping:
		return "stopping"
	case instStopped:
		return "stopped"
	}
	return fmt.Sprintf("lifecycle(%d)", uint8(c))
}

// instEvent is what happens to an instance.
type instEvent uint8

const (
	// instEvUp: the bring-up has a daemon and its first events are read.
	instEvUp instEvent = iota
	// instEvFault: a recovery begins.
	instEvFault
	// instEvRecovered: the recovery and every fault that came during it
	// are handled.
	instEvRecovered
	// instEvStop: the last lease ended and a hold asks for a stop.
	instEvStop
	// instEvRestart: the daemon is stopped; a new one starts.
	instEvRestart
	// instEvGone: the daemon is stopped for good (or, while starting,
	// none ever answered and the instance left the config).
	instEvGone
	numInstEvents
)

func (e instEvent) String() string {
	switch e {
	case instEvUp:
		return "up"
	case instEvFault:
		return "fault"
	case instEvRecovered:
		return "recovered"
	case instEvStop:
		return "stop"
	case instEvRestart:
		return "restart"
	case instEvGone:
		return "gone"
	}
	return fmt.Sprintf("instEvent(%d)", uint8(e))
}

// instEffects are what an instance transition asks of the daemon.
type instEffects uint8

const (
	// effSchedule: the instance may take leases again: run its group's queue.
	effSchedule instEffects = 1 << iota
	// effRevoke: the recovery revokes the leases the fault hit.
	effRevoke
	// effStopDaemon: the daemon is to be stopped.
	effStopDaemon
	// effBringUp: a bring-up starts a daemon.
	effBringUp
)

// instanceStep is the instance's transition table (see lifecycle). It is
// pure.
func instanceStep(c lifecycle, ev instEvent) (lifecycle, instEffects, error) {
	switch {
	case c == instStarting && ev == instEvUp:
		return instUp, effSchedule, nil
	case (c == instStarting || c == instUp) && ev == instEvFault:
		return instRecovering, effRevoke, nil
	case c == instUp && ev == instEvStop:
		return instStopping, effStopDaemon, nil
	case c == instRecovering && ev == instEvRecovered:
		return instUp, effSchedule, nil
	case c == instStopping && ev == instEvRestart:
		return instStarting, effBringUp, nil
	case (c == instStopping || c == instStarting) && ev == instEvGone:
		// From starting: it left the config with no lease before any
		// daemon answered (retireIfEmptyLocked); there is none to stop.
		return instStopped, 0, nil
	}
	return c, 0, fmt.Errorf("%w: instance %s on %s", errIllegalTransition, c, ev)
}

// step applies ev to in (under Daemon.mu); an illegal ev leaves it as it is.
func (in *instance) step(ev instEvent, why string) (instEffects, error) {
	next, eff, err := instanceStep(in.life, ev)
	if err != nil {
		err = fmt.Errorf("instance %s (%s): %w", in.key, why, err)
		if in.log != nil {
			in.log.Error("illegal instance transition (a bug of mpsd)", "state", in.life.String(), "event", ev.String(), "why", why)
		}
		illegalTransition(err)
		return 0, err
	}
	in.life = next
	return eff, nil
}

// holds close an instance to new placements whatever its lifecycle.
type holds struct {
	// drained: mpsctl drain; until mpsctl resume.
	drained bool
	// quarantined: it failed too often; until mpsctl resume (saved).
	quarantined bool
	// retiring: gone from the config; it stops once empty.
	retiring bool
	// restartPending: a start option changed; it restarts once empty.
	restartPending bool
	// unreconciled: adopted after an mpsd restart, and not reconciled
	// since: the unleased clients holding its servers are not known yet
	// (adoptReconciled).
	unreconciled bool
}

// placementState is the state placement, status and metrics see: the one
// place it is derived.
func placementState(c lifecycle, h holds, restarts int) policy.InstanceState {
	switch {
	case h.quarantined:
		return policy.InstanceQuarantined
	case h.drained || h.retiring || h.restartPending:
		return policy.InstanceDraining
	case c == instRecovering || (c != instUp && restarts > 0):
		return policy.InstanceRecovering
	case c != instUp || h.unreconciled:
		return policy.InstanceStarting
	default:
		return policy.InstanceReady
	}
}

// shownState is the state status and mpsd's summary show: placement's,
// with a draining instance told apart as drained (an operator's drain, no
// lease left, and no client of no lease on its servers at the last
// reconciliation, which has run since mpsd took it up: nothing of anyone
// on its GPUs through it, which is then safe to reset) or retiring (gone
// from the config, stopping once empty).
func (in *instance) shownState() string {
	st := in.placementState()
	if st != policy.InstanceDraining {
		return st.String()
	}
	switch {
	case in.holds.retiring:
		return api.InstanceRetiring
	case in.holds.drained && len(in.leases) == 0 && !in.holds.unreconciled && !in.mps.held():
		return api.InstanceDrained
	}
	return st.String()
}

// drainRecord is an operator's drain: why, who and when.
type drainRecord struct {
	reason, by string
	at         time.Time
}

// noDrainReason is the reason of a drain that gave none.
const noDrainReason = "no reason given"

func (in *instance) placementState() policy.InstanceState {
	return placementState(in.life, in.holds, in.restarts)
}

// policyViewAt is the instance as placement sees it at now (bars lapse
// with time; callers read the clock once for all the instances they view).
func (in *instance) policyViewAt(now time.Time) policy.Instance {
	p := in.p
	p.State = in.placementState()
	if !p.Multiuser { // a shared server serves every uid: nothing to keep off
		p.ServerUp, p.ServerUID, p.ServerHeld, p.ServerContested = in.mps.serving(in.placedUID())
	}
	p.ServerFault = in.mps.faulted()
	if len(in.barred) > 0 {
		p.Barred = in.barredUIDs(now)
	}
	return p
}

// placedUID is the uid of in's placed leases, false when it has none: the
// one uid of p.Running (Assign and Release keep it with in.leases), so a
// view costs no walk of the leases; the earliest placed lease's (by
// request sequence) when they are of several uids, as after an adoption or
// a reload of multiuser, so that the answer does not depend on a map's
// order.
func (in *instance) placedUID() (uint32, bool) {
	if len(in.p.Running) == 1 {
		return in.p.Running[0].UID, true
	}
	var first *lease
	for _, l := range in.leases {
		if first == nil || l.req.Seq < first.req.Seq {
			first = l
		}
	}
	if first == nil {
		return 0, false
	}
	return first.uid, true
}

// daemonUp: the instance has a daemon that answered (up, or recovering
// from a fault that left the daemon running or restarted it).
func (in *instance) daemonUp() bool {
	return in.daemon != nil && (in.life == instUp || in.life == instRecovering)
}
