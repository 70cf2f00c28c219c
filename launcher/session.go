package launcher

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/api"
)

// The session's decisions, apart from their effects: state is what a run
// of mps-launch knows about its lease and its command, step turns one
// input (an event of the stream, the stream's loss, the command's exit,
// the end of a verdict's wait) into the next state and the actions that
// carry it out. step does no I/O, starts nothing and reads no clock (the
// input brings the time), so its tables (session_test.go) run without
// processes or sockets; run.go applies the actions, stream.go and
// children.go own the stream and the processes.

// phase is where the session's lease stands.
type phase uint8

const (
	// phaseQueued: no command runs; the request waits for a grant.
	phaseQueued phase = iota
	// phaseLaunching: a grant is being attached (or held, mpsd being
	// away), its command not yet released.
	phaseLaunching
	// phaseRunning: the command runs under the lease.
	phaseRunning
	// phaseRevoked: mpsd revoked the lease; its command (if still there)
	// is being killed by mpsd, and a requeue or an end follows. The
	// command's status says nothing then, not even a 0: a wrapper whose
	// CUDA clients MPS ended returns 0 from its wait.
	phaseRevoked
	// phaseVerdictPending: the command ended with a failure (or its
	// attach was refused) that may be mpsd's revocation; the verdict
	// waits for the event that would say so.
	phaseVerdictPending
	// phaseDetached: the session has no stream of the command's lease any
	// more (mpsd lost the lease, mpsd stayed away, or the stream broke the
	// protocol and was closed, which has mpsd release the lease and kill
	// the command); the command's end, whoever brings it, is the
	// session's end.
	phaseDetached
	// phaseDone: the session has ended.
	phaseDone
)

func (p phase) String() string {
	switch p {
	case phaseQueued:
		return "queued"
	case phaseLaunching:
		return "launching"
	case phaseRunning:
		return "running"
	case phaseRevoked:
		return "revoked"
	case phaseVerdictPending:
		return "verdictPending"
	case phaseDetached:
		return "detached"
	case phaseDone:
		return "done"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// verdictWhy is what a pending verdict waits for.
type verdictWhy uint8

const (
	// verdictFailed: the command failed; a revoked event may be on its
	// way (mpsd kills the cgroup before it sends the event, and a CUDA
	// client dies of its lost server as fast as mpsd sees it go). Waits
	// RevokeGrace.
	verdictFailed verdictWhy = iota + 1
	// verdictAttach: the attach was refused because the lease ended
	// between its grant and the attach; the revoked event (or the error
	// that ends the lease) is on its way. Waits RevokeGrace.
	verdictAttach
	// verdictAway: the command failed while mpsd was away; the resumed
	// lease says whether a fault took it. Waits ReconnectTimeout +
	// RevokeGrace.
	verdictAway
	// verdictAsked: RevokeGrace passed after verdictFailed or
	// verdictAttach without a revoked event; the lease's release was asked
	// for, and mpsd's answer says whether a revocation has the lease (its
	// event can come later than RevokeGrace: mpsd sends it once the
	// revocation is recorded in its state file). Waits askWait.
	verdictAsked
	// verdictRevoking: mpsd refused the release because the lease is
	// being revoked (api.CodeRevoking); the revoked event is on its way.
	// Waits ReconnectTimeout.
	verdictRevoking
)

// maxAsks is how many times a verdict asks for the release when mpsd
// cannot be reached for its answer.
const maxAsks = 2

// askWait bounds the wait for the answer to a verdict's release
// (verdictAsked): the request's own timeout, and a margin.
const askWait = releaseTimeout + time.Second

// verdict is the session's end as it stands while it waits to learn
// whether mpsd's revocation explains it: the command's status (code) or
// the attach's failure (err), until when it waits, why, and the signal
// that killed the command while mpsd was away, to say so at the end. It
// replaces one timer that meant three things.
type verdict struct {
	code     int
	err      error
	until    time.Time
	why      verdictWhy
	killedBy string
	// asks counts the releases asked for (verdictAsked).
	asks int
}

// state is the session's knowledge of its lease and command.
type state struct {
	phase phase
	// lease is the last granted lease, kept after a revocation; leaseID
	// and attempt are what a reconnect resumes (the queued event's lease
	// or the granted one, and its run); granted: there was a grant.
	lease   *api.Lease
	leaseID string
	attempt int
	granted bool
	// child: a command process exists (running, or dying after a
	// revocation).
	child bool
	// revoked is the reason of the current lease's revocation.
	revoked string
	// pending is a grant that came before the revoked command was gone.
	pending *api.Lease
	// final ends the session once the revoked command is gone.
	final error
	// verdict is set in phaseVerdictPending.
	verdict *verdict
	// released: mpsd answered a verdict's release: the lease is gone.
	released bool
	// started: a command has been released to run under the session's
	// lease (any attempt); finished: it succeeded while mpsd was away, and
	// the session ends with 0 once the reconnect is over.
	started  bool
	finished bool
	// The last queued event's view, for the status line.
	position      int
	group, reason string
}

// inputKind names what happened.
type inputKind uint8

const (
	// inEvent: the stream carried ev.
	inEvent inputKind = iota + 1
	// inStreamLost: the stream ended with err (io.EOF, a cut, or an
	// ErrProtocol line); lost, when set, is the ErrLost error to give up
	// with (an empty stream once the outage is over).
	inStreamLost
	// inChildExit: the command exited with code (killedBy: the signal,
	// if one killed it); streamOpen: the stream is open; reconnecting: a
	// reconnect is under way.
	inChildExit
	// inVerdictDue: the verdict's wait is over.
	inVerdictDue
	// inFail: err ends the session, unless a command runs (it is the
	// user's: the session ends with it).
	inFail
	// inGiveUp: the wait for mpsd ends with err (a reconnect refused or
	// out of time); a command that failed while mpsd was away keeps its
	// own status, and a lease mpsd lost before anything ran under it is
	// asked for anew.
	inGiveUp
	// inSignal: sig arrived (one of those forwarded).
	inSignal
	// inLeaseNamed: a new stream's answer named its lease (leaseID),
	// before any event.
	inLeaseNamed
	// inReleaseAnswer: mpsd answered the release actAskRelease asked for
	// (err nil: the lease is gone).
	inReleaseAnswer
)

// input is one thing that happened to the session.
type input struct {
	kind inputKind
	now  time.Time
	ev   api.Event
	err  error
	lost error

	code         int
	killedBy     string
	streamOpen   bool
	reconnecting bool

	sig os.Signal

	leaseID string
}

// actionKind names an effect for run.go to carry out.
type actionKind uint8

const (
	// actSay prints line (after the prefix) on stderr.
	actSay actionKind = iota + 1
	// actShowQueue updates the status line from the queued view.
	actShowQueue
	// actLaunch attaches a trampoline to lease and releases it.
	actLaunch
	// actUnhold drops a held grant (its attach waits no more).
	actUnhold
	// actRequeued restarts the queue clock.
	actRequeued
	// actCloseStream closes the stream (releasing the lease).
	actCloseStream
	// actReconnect starts a reconnect (the stream is gone).
	actReconnect
	// actSignal forwards sig to the command.
	actSignal
	// actClearStatus clears the status line.
	actClearStatus
	// actEnd ends the session with code, or err when set.
	actEnd
	// actAskRelease asks mpsd, in the background, to release lease (the
	// attempt its command ran under); the answer comes back as
	// inReleaseAnswer.
	actAskRelease
)

// action is one effect of a step.
type action struct {
	kind  actionKind
	line  string
	lease *api.Lease
	sig   os.Signal
	code  int
	err   error
}

// timing is what step needs of the configuration.
type timing struct {
	revokeGrace, reconnectTimeout time.Duration
	quiet                         bool
}

// step is the session's decision for in: the next state and the actions.
func step(st state, in input, tm timing) (state, []action) {
	var acts []action
	say := func(format string, a ...any) {
		acts = append(acts, action{kind: actSay, line: fmt.Sprintf(format, a...)})
	}
	end := func(code int, err error) {
		st.phase = phaseDone
		acts = append(acts, action{kind: actEnd, code: code, err: err})
	}
	// detach leaves the command to its fate after err, the stream closed
	// (here or already): its end is the session's end. The line says what
	// becomes of it (detachedFate).
	detach := func(err error) {
		st.phase = phaseDetached
		say("%s; %s", message(err), detachedFate(err))
	}
	// fail ends the session with err, unless a command runs: it is the
	// user's, and the session ends with it, however it ends (detach).
	fail := func(err error) {
		acts = append(acts, action{kind: actCloseStream})
		switch {
		case st.child && st.revoked != "":
			st.final = err
		case st.child:
			detach(err)
		default:
			end(0, err)
		}
	}
	endVerdict := func() {
		v := st.verdict
		st.verdict = nil
		if v.killedBy != "" {
			say("the command was killed by %s while mpsd was away (exit status %d)", v.killedBy, v.code)
		}
		end(v.code, v.err)
	}
	// giveUp ends the wait for mpsd with err. A command that failed
	// while mpsd was away, when mpsd does not know the lease any more (or
	// cannot be reached), failed of its own: no revocation will come.
	giveUp := func(err error) {
		if !st.child && st.verdict != nil {
			endVerdict()
		} else {
			fail(err)
		}
	}
	launch := func(l *api.Lease) {
		acts = append(acts, action{kind: actUnhold}, action{kind: actLaunch, lease: l})
		st.lease, st.revoked, st.pending = l, "", nil
		st.leaseID, st.attempt, st.granted = l.ID, l.Attempt, true
		st.phase = phaseLaunching
	}

	switch in.kind {
	case inEvent:
		ev := in.ev
		switch ev.Type {
		case api.EventQueued:
			if ev.LeaseID != "" && st.lease == nil {
				// The queued request's own lease: a reconnect resumes it,
				// and with it the place in the queue.
				st.leaseID, st.attempt = ev.LeaseID, max(st.attempt, 1)
			}
			// While a revoked command is still dying its output may still
			// come; the status line waits until it is gone.
			if !st.child && st.verdict == nil {
				st.position, st.group, st.reason = ev.Position, ev.Group, ev.Reason
				acts = append(acts, action{kind: actShowQueue})
			}
		case api.EventGranted:
			switch {
			case (st.child || st.verdict != nil) && st.revoked == "":
				// A resumed stream confirms the lease the command ran under.
				if st.lease == nil || ev.Lease.ID != st.lease.ID {
					fail(fmt.Errorf("%w: granted lease %s while the command runs under lease %s",
						ErrProtocol, ev.Lease.ID, leaseIDOf(st.lease)))
					break
				}
				st.lease, st.attempt = ev.Lease, ev.Lease.Attempt
				if st.verdict != nil && st.verdict.why == verdictAway {
					// The stream resumed after the command failed, and
					// mpsd kept the lease: the failure was not its
					// revocation. Any other verdict was reached with this
					// stream open since the failure: its grant is the one
					// a resume confirmed before, which says nothing of the
					// failure (the release's answer or the revoked event
					// does; the chaos soak met a server killed between a
					// resume and the reading of its grant).
					endVerdict()
				}
			case st.child:
				// The revoked command is still dying: the grant waits.
				st.pending = ev.Lease
				st.leaseID, st.attempt, st.granted = ev.Lease.ID, ev.Lease.Attempt, true
			default:
				launch(ev.Lease)
			}
		case api.EventRevoked:
			if st.lease == nil {
				if st.leaseID == "" {
					fail(fmt.Errorf("%w: revoked before any lease was granted", ErrProtocol))
					break
				}
				// The queued lease this launcher resumed after mpsd
				// restarted: the previous mpsd granted (and saved) it
				// without telling us, and it is revoked now. Nothing of ours
				// ran; its requeue follows.
				st.revoked = ev.Reason
				st.phase = phaseRevoked
				break
			}
			st.revoked = ev.Reason
			st.phase = phaseRevoked
			// A held command's lease is gone: it waits for the requeued
			// grant.
			acts = append(acts, action{kind: actUnhold})
			// A grant that waited for the last command to die is the
			// lease's latest run, the one revoked now: it must not be
			// launched (the requeue that follows brings the next grant).
			st.pending = nil
			if st.verdict != nil {
				// The command's death (or the attach's failure) was mpsd's
				// revocation: not its end.
				st.verdict = nil
			}
		case api.EventRequeued:
			if st.revoked == "" {
				fail(fmt.Errorf("%w: requeued without a revocation", ErrProtocol))
				break
			}
			if !tm.quiet {
				say("lease %s revoked (%s); requeued, attempt %d", st.leaseID, st.revoked, ev.Attempt)
			}
			st.attempt = ev.Attempt
			acts = append(acts, action{kind: actRequeued})
		case api.EventError:
			err := &api.Error{Code: ev.Code, Message: ev.Message}
			acts = append(acts, action{kind: actCloseStream})
			switch {
			case st.child && st.revoked == "":
				detach(err)
			case st.child:
				st.final = err // once mpsd has killed the command
			default:
				end(0, err)
			}
		}

	case inStreamLost:
		acts = append(acts, action{kind: actCloseStream})
		if errors.Is(in.err, ErrProtocol) {
			fail(in.err)
			break
		}
		if in.lost != nil {
			// mpsd keeps answering without ever saying anything: no
			// better than not answering.
			giveUp(in.lost)
			break
		}
		if !st.child && st.verdict != nil {
			// The command failed and the stream ended before a revocation
			// came: mpsd is stopping, perhaps in the middle of revoking
			// the lease. The resumed lease says whether it was; if mpsd
			// does not know it any more, the failure was the command's
			// own.
			v := *st.verdict
			v.why, v.until = verdictAway, in.now.Add(tm.reconnectTimeout+tm.revokeGrace)
			st.verdict = &v
		}
		acts = append(acts, action{kind: actReconnect})

	case inChildExit:
		st.child = false
		code := in.code
		if st.revoked == "" {
			if code == 0 && in.reconnecting {
				// Done, but mpsd is away and still counts the lease: the
				// launcher resumes it only to close it, which frees its
				// share at once, then exits 0.
				st.finished = true
				break
			}
			if code == 0 || (!in.streamOpen && !in.reconnecting) {
				end(code, nil)
				break
			}
			st.phase = phaseVerdictPending
			if in.reconnecting {
				// mpsd is away (restarting): if a fault took the command's
				// server while it was, the resumed lease says so.
				st.verdict = &verdict{code: code, killedBy: in.killedBy, why: verdictAway,
					until: in.now.Add(tm.reconnectTimeout + tm.revokeGrace)}
				break
			}
			// A failure may be mpsd's kill after a revocation whose event
			// is on its way: give the event a moment before taking the
			// failure as the command's own.
			st.verdict = &verdict{code: code, why: verdictFailed, until: in.now.Add(tm.revokeGrace)}
			break
		}
		switch {
		case st.final != nil:
			end(0, st.final)
		case st.pending != nil:
			launch(st.pending)
		}

	case inVerdictDue:
		v := st.verdict
		switch {
		case v == nil:
		case (v.why == verdictFailed || v.why == verdictAttach) && st.lease != nil:
			// No revoked event within RevokeGrace. Before the failure is
			// taken as the command's own, mpsd is asked to release the
			// lease: it does, and the failure was the command's, or it
			// refuses because a revocation has the lease, whose event is
			// still on its way.
			nv := *v
			nv.why, nv.until, nv.asks = verdictAsked, in.now.Add(askWait), v.asks+1
			st.verdict = &nv
			acts = append(acts, action{kind: actAskRelease, lease: st.lease})
		case v.why == verdictRevoking:
			say("mpsd said it was revoking lease %s, but no revocation came within %s", leaseIDOf(st.lease), tm.reconnectTimeout)
			endVerdict()
		default:
			endVerdict()
		}

	case inReleaseAnswer:
		v := st.verdict
		if v == nil || v.why != verdictAsked {
			break // the revocation came meanwhile, or the stream ended
		}
		var ae *api.Error
		if errors.As(in.err, &ae) && ae.Code == api.CodeCancelled {
			// A cancel ended the command: the session ends as cancelled.
			st.verdict = nil
			end(0, ae)
			break
		}
		if errors.As(in.err, &ae) && ae.Code == api.CodeRevoking {
			nv := *v
			nv.why, nv.until = verdictRevoking, in.now.Add(tm.reconnectTimeout)
			st.verdict = &nv
			break
		}
		if errors.Is(in.err, ErrUnreachable) && v.asks < maxAsks {
			// mpsd did not answer (it is going away, say, while it held
			// the answer): no word either way. The stream's loss, if it
			// is going, makes the resumed lease tell; else it is asked
			// again after another grace.
			nv := *v
			nv.why, nv.until = verdictFailed, in.now.Add(tm.revokeGrace)
			st.verdict = &nv
			break
		}
		// Released (or refused for another reason: gone, or its processes
		// not dead yet): no revocation has the lease.
		st.released = in.err == nil
		endVerdict()

	case inLeaseNamed:
		if st.leaseID == "" && st.lease == nil {
			// A reconnect before the first event resumes it: mpsd may
			// have granted it, and attached the trampoline, just before
			// it went.
			st.leaseID, st.attempt = in.leaseID, max(st.attempt, 1)
		}

	case inFail:
		fail(in.err)

	case inGiveUp:
		var ae *api.Error
		if errors.As(in.err, &ae) && ae.Code == api.CodeNotFound && st.leaseID != "" && !st.started && !st.child && st.verdict == nil {
			// mpsd does not know the lease it had queued (or granted, and
			// the command was held): it was lost with what mpsd had not
			// yet written when it went. Nothing ran under it, so it is
			// simply asked for again.
			if !tm.quiet {
				say("lease %s was lost while mpsd was away; requesting a new one", st.leaseID)
			}
			acts = append(acts, action{kind: actUnhold}, action{kind: actReconnect})
			st.lease, st.leaseID, st.attempt, st.revoked, st.pending = nil, "", 0, "", nil
			st.phase = phaseQueued
			break
		}
		giveUp(in.err)

	case inSignal:
		switch {
		case st.child:
			acts = append(acts, action{kind: actSignal, sig: in.sig})
		case st.finished:
			end(0, nil) // the command's status; only mpsd's release was waited for
		case in.sig == syscall.SIGINT, in.sig == syscall.SIGTERM, in.sig == syscall.SIGHUP, in.sig == syscall.SIGQUIT:
			// No command to tell: the request is abandoned (closing the
			// stream gives up the place in the queue).
			acts = append(acts, action{kind: actClearStatus})
			code := ExitFailure
			if n, ok := in.sig.(syscall.Signal); ok {
				code = 128 + int(n)
			}
			end(code, nil)
		}
	}
	return st, acts
}

// attachRefused is the state after the attach of lease's trampoline was
// refused because the lease ended meanwhile (a fault revoked it): the
// revoked event, or the error ending the lease, is on its way; if none
// comes within RevokeGrace, err stands.
func attachRefused(st state, err error, now time.Time, tm timing) state {
	st.phase = phaseVerdictPending
	st.verdict = &verdict{code: ExitFailure, err: err, why: verdictAttach, until: now.Add(tm.revokeGrace)}
	return st
}

// detachedFate is what becomes of the running command once the session
// gives up its lease's stream after err, for the line that says so: an
// mpsd that is there releases a lease whose stream closes, killing its
// cgroup, so only a lease mpsd does not know leaves the command running
// for good.
func detachedFate(err error) string {
	var ae *api.Error
	switch {
	case errors.Is(err, ErrLost):
		// mpsd is away: one that comes back waits for this launcher for
		// its reconnect grace, then releases the lease.
		return "the command runs on without a lease, until an mpsd that comes back ends it"
	case errors.As(err, &ae) && ae.Code == api.CodeNotFound:
		// mpsd does not know the lease (it lost it): nothing of it is
		// left to release.
		return "the command keeps running without a lease"
	case errors.As(err, &ae):
		// mpsd ended the lease's stream itself, or refused to resume it:
		// it may still hold the lease, and release it (killing the
		// command) once it gives up on the lease's stream.
		return "the command runs on without a lease, unless mpsd ends it"
	}
	// A protocol violation: mpsd is there, and the stream this launcher
	// closes is the lease.
	return "mpsd ends the command as it releases the lease"
}

func leaseIDOf(l *api.Lease) string {
	if l == nil {
		return "(none)"
	}
	return l.ID
}
