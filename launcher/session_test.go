package launcher

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

// The step function's tables: (state, input) → (state, actions), without
// processes or sockets. Each row is one decision of the session that
// run_test.go and restart_test.go prove end to end with a real
// trampoline.

var (
	t0     = time.Unix(1_000_000, 0)
	tmTest = timing{revokeGrace: time.Second, reconnectTimeout: time.Minute}
)

func grant(id string, attempt int) *api.Lease { return &api.Lease{ID: id, Attempt: attempt} }

func evGranted(l *api.Lease) input {
	return input{kind: inEvent, now: t0, ev: api.Event{Type: api.EventGranted, Lease: l}}
}
func evRevoked(reason string) input {
	return input{kind: inEvent, now: t0, ev: api.Event{Type: api.EventRevoked, Reason: reason}}
}
func evRequeued(attempt int) input {
	return input{kind: inEvent, now: t0, ev: api.Event{Type: api.EventRequeued, Attempt: attempt}}
}
func evQueued(pos int, id string) input {
	return input{kind: inEvent, now: t0, ev: api.Event{Type: api.EventQueued, Position: pos, Group: "g", LeaseID: id}}
}
func childExit(code int, streamOpen, reconnecting bool) input {
	return input{kind: inChildExit, now: t0, code: code, streamOpen: streamOpen, reconnecting: reconnecting}
}

// running is the state of a command running under lease-1, attempt 1.
func running() state {
	l := grant("lease-1", 1)
	return state{phase: phaseRunning, lease: l, leaseID: l.ID, attempt: 1, granted: true, child: true}
}

// failedVerdict is the state of lease-1's command that exited 3 and waits
// for its verdict (why).
func failedVerdict(why verdictWhy) state {
	s := running()
	s.child, s.phase, s.verdict = false, phaseVerdictPending, &verdict{code: 3, why: why, until: t0}
	return s
}

func kinds(acts []action) []actionKind {
	var ks []actionKind
	for _, a := range acts {
		ks = append(ks, a.kind)
	}
	return ks
}

func endOf(acts []action) (action, bool) {
	for _, a := range acts {
		if a.kind == actEnd {
			return a, true
		}
	}
	return action{}, false
}

func TestStep(t *testing.T) {
	protoErr := func(sub string) func(*testing.T, state, []action) {
		return func(t *testing.T, st state, acts []action) {
			t.Helper()
			a, ok := endOf(acts)
			if !ok || !errors.Is(a.err, ErrProtocol) || !strings.Contains(a.err.Error(), sub) || st.phase != phaseDone {
				t.Errorf("want an end with a protocol violation %q; got %+v, phase %s", sub, acts, st.phase)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		st    state
		in    input
		phase phase
		acts  []actionKind
		check func(*testing.T, state, []action)
	}{
		{name: "queued event shows the queue and names the lease to resume",
			st: state{}, in: evQueued(3, "lease-q"), phase: phaseQueued, acts: []actionKind{actShowQueue},
			check: func(t *testing.T, st state, _ []action) {
				if st.leaseID != "lease-q" || st.attempt != 1 || st.position != 3 || st.group != "g" {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "a stream that names its lease makes a reconnect resume it",
			st: state{}, in: input{kind: inLeaseNamed, leaseID: "lease-n"}, phase: phaseQueued, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if st.leaseID != "lease-n" || st.attempt != 1 || st.lease != nil {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "a stream naming a lease while one runs changes nothing",
			st: running(), in: input{kind: inLeaseNamed, leaseID: "lease-n"}, phase: phaseRunning, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if st.leaseID != "lease-1" {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "queued event while a revoked command dies leaves the status line alone",
			st: func() state { s := running(); s.phase, s.revoked = phaseRevoked, "xid 79"; return s }(),
			in: evQueued(1, ""), phase: phaseRevoked, acts: nil},
		{name: "grant launches",
			st: state{}, in: evGranted(grant("lease-1", 1)), phase: phaseLaunching, acts: []actionKind{actUnhold, actLaunch},
			check: func(t *testing.T, st state, acts []action) {
				if acts[1].lease.ID != "lease-1" || st.lease.ID != "lease-1" || !st.granted || st.revoked != "" {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "grant while the command runs confirms its lease",
			st: running(), in: evGranted(grant("lease-1", 1)), phase: phaseRunning, acts: nil},
		{name: "grant of another lease while the command runs breaks the protocol; closing the stream has mpsd end the command",
			st: running(), in: evGranted(grant("lease-2", 1)), phase: phaseDetached, acts: []actionKind{actCloseStream, actSay},
			check: func(t *testing.T, _ state, acts []action) {
				if want := "protocol violation: granted lease lease-2 while the command runs under lease lease-1; mpsd ends the command as it releases the lease"; acts[1].line != want {
					t.Errorf("line %q, want %q", acts[1].line, want)
				}
			}},
		{name: "revoked before any grant breaks the protocol",
			st: state{}, in: evRevoked("x"), acts: []actionKind{actCloseStream, actEnd}, check: protoErr("revoked before any lease was granted")},
		{name: "a resumed queued lease revoked before its grant was told waits for the requeue",
			st: state{leaseID: "lease-q", attempt: 1}, in: evRevoked("server died while mpsd was away"), phase: phaseRevoked, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if st.revoked != "server died while mpsd was away" {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "requeued without a revocation breaks the protocol",
			st: state{lease: grant("lease-1", 1)}, in: evRequeued(2), acts: []actionKind{actCloseStream, actEnd}, check: protoErr("requeued without a revocation")},
		{name: "revoked while the command runs",
			st: running(), in: evRevoked("xid 79"), phase: phaseRevoked, acts: []actionKind{actUnhold},
			check: func(t *testing.T, st state, _ []action) {
				if st.revoked != "xid 79" || !st.child {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "requeued after a revocation says so",
			st: func() state { s := running(); s.phase, s.revoked = phaseRevoked, "xid 79"; return s }(),
			in: evRequeued(2), phase: phaseRevoked, acts: []actionKind{actSay, actRequeued},
			check: func(t *testing.T, st state, acts []action) {
				if acts[0].line != "lease lease-1 revoked (xid 79); requeued, attempt 2" || st.attempt != 2 {
					t.Errorf("line %q, attempt %d", acts[0].line, st.attempt)
				}
			}},
		{name: "grant while the revoked command dies waits",
			st: func() state { s := running(); s.phase, s.revoked = phaseRevoked, "xid 79"; return s }(),
			in: evGranted(grant("lease-1", 2)), phase: phaseRevoked, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if st.pending == nil || st.pending.Attempt != 2 || st.attempt != 2 {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "the revoked command's exit launches the pending grant",
			st: func() state {
				s := running()
				s.phase, s.revoked, s.pending = phaseRevoked, "xid 79", grant("lease-1", 2)
				return s
			}(),
			in: childExit(137, true, false), phase: phaseLaunching, acts: []actionKind{actUnhold, actLaunch},
			check: func(t *testing.T, st state, acts []action) {
				if acts[1].lease.Attempt != 2 || st.revoked != "" || st.pending != nil {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "the revoked command's exit with no grant yet waits for the requeue",
			st: func() state { s := running(); s.phase, s.revoked = phaseRevoked, "xid 79"; return s }(),
			in: childExit(137, true, false), phase: phaseRevoked, acts: nil},
		{name: "the revoked command's exit 0 waits for the requeue too: a wrapper's wait returns 0 once MPS ended its clients",
			st: func() state { s := running(); s.phase, s.revoked = phaseRevoked, "memory limit exceeded"; return s }(),
			in: childExit(0, true, false), phase: phaseRevoked, acts: nil},
		{name: "the revoked command's exit after an error event ends with the error",
			st: func() state {
				s := running()
				s.phase, s.revoked, s.final = phaseRevoked, "xid 79", &api.Error{Code: api.CodeAttemptsExhausted, Message: "no more"}
				return s
			}(),
			in: childExit(137, false, false), phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if ExitCode(acts[0].err) != ExitTempFail {
					t.Errorf("end %+v, want attempts exhausted (75)", acts[0])
				}
			}},
		{name: "success ends at once",
			st: running(), in: childExit(0, true, false), phase: phaseDone, acts: []actionKind{actEnd}},
		{name: "success while mpsd is away waits for the lease's hand-back",
			st: running(), in: childExit(0, false, true), phase: phaseRunning, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if !st.finished || st.child {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "failure waits RevokeGrace for a revocation",
			st: running(), in: childExit(3, true, false), phase: phaseVerdictPending, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if v := st.verdict; v == nil || v.code != 3 || v.why != verdictFailed || !v.until.Equal(t0.Add(time.Second)) {
					t.Errorf("verdict %+v", st.verdict)
				}
			}},
		{name: "failure while mpsd is away waits for the resumed lease",
			st: running(), in: func() input { in := childExit(137, false, true); in.killedBy = "SIGKILL"; return in }(),
			phase: phaseVerdictPending, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if v := st.verdict; v == nil || v.why != verdictAway || v.killedBy != "SIGKILL" || !v.until.Equal(t0.Add(time.Minute+time.Second)) {
					t.Errorf("verdict %+v", st.verdict)
				}
			}},
		{name: "failure of a detached command is its own",
			st: func() state { s := running(); s.phase = phaseDetached; return s }(),
			in: childExit(3, false, false), phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if acts[0].code != 3 || acts[0].err != nil {
					t.Errorf("end %+v", acts[0])
				}
			}},
		{name: "a revocation during the verdict's wait makes the failure mpsd's",
			st: func() state {
				s := running()
				s.child, s.phase, s.verdict = false, phaseVerdictPending, &verdict{code: 137, why: verdictFailed, until: t0}
				return s
			}(),
			in: evRevoked("server died"), phase: phaseRevoked, acts: []actionKind{actUnhold},
			check: func(t *testing.T, st state, _ []action) {
				if st.verdict != nil {
					t.Errorf("verdict %+v kept", st.verdict)
				}
			}},
		{name: "no revocation within the grace: mpsd is asked to release the lease",
			st: failedVerdict(verdictFailed),
			in: input{kind: inVerdictDue, now: t0}, phase: phaseVerdictPending, acts: []actionKind{actAskRelease},
			check: func(t *testing.T, st state, acts []action) {
				if v := st.verdict; v == nil || v.why != verdictAsked || v.code != 3 || !v.until.Equal(t0.Add(askWait)) || acts[0].lease == nil || acts[0].lease.ID != "lease-1" || acts[0].lease.Attempt != 1 {
					t.Errorf("verdict %+v, acts %+v", st.verdict, acts)
				}
			}},
		{name: "the release done: the failure was the command's own",
			st: failedVerdict(verdictAsked), in: input{kind: inReleaseAnswer, now: t0}, phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, st state, acts []action) {
				if acts[0].code != 3 || acts[0].err != nil || !st.released || st.verdict != nil {
					t.Errorf("end %+v, state %+v", acts[0], st)
				}
			}},
		{name: "the release refused for a revocation: its event is waited for",
			st:    failedVerdict(verdictAsked),
			in:    input{kind: inReleaseAnswer, now: t0, err: &api.Error{Code: api.CodeRevoking, Message: "lease lease-1 is being revoked"}},
			phase: phaseVerdictPending, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if v := st.verdict; v == nil || v.why != verdictRevoking || v.code != 3 || !v.until.Equal(t0.Add(time.Minute)) || st.released {
					t.Errorf("verdict %+v", st.verdict)
				}
			}},
		{name: "the release refused for a cancel: the session ends as cancelled",
			st: failedVerdict(verdictAsked), in: input{kind: inReleaseAnswer, now: t0, err: &api.Error{Code: api.CodeCancelled, Message: "lease lease-1 cancelled by root (uid 0)"}},
			phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, st state, acts []action) {
				var ae *api.Error
				if !errors.As(acts[0].err, &ae) || ae.Code != api.CodeCancelled || ExitCode(acts[0].err) != ExitCancelled || st.verdict != nil {
					t.Errorf("end %+v, state %+v", acts[0], st)
				}
			}},
		{name: "the release refused otherwise (unreachable, not found, still ending): the failure was the command's own",
			st: failedVerdict(verdictAsked), in: input{kind: inReleaseAnswer, now: t0, err: &api.Error{Code: api.CodeNotFound, Message: "no lease"}},
			phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, st state, acts []action) {
				if acts[0].code != 3 || acts[0].err != nil || st.released {
					t.Errorf("end %+v, state %+v", acts[0], st)
				}
			}},
		{name: "the release found mpsd unreachable: asked again after another grace",
			st: func() state { s := failedVerdict(verdictAsked); s.verdict.asks = 1; return s }(),
			in: input{kind: inReleaseAnswer, now: t0, err: ErrUnreachable}, phase: phaseVerdictPending, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if v := st.verdict; v == nil || v.why != verdictFailed || !v.until.Equal(t0.Add(time.Second)) || v.asks != 1 {
					t.Errorf("verdict %+v", st.verdict)
				}
			}},
		{name: "the second ask counts",
			st: func() state { s := failedVerdict(verdictFailed); s.verdict.asks = 1; return s }(),
			in: input{kind: inVerdictDue, now: t0}, phase: phaseVerdictPending, acts: []actionKind{actAskRelease},
			check: func(t *testing.T, st state, _ []action) {
				if v := st.verdict; v == nil || v.why != verdictAsked || v.asks != 2 {
					t.Errorf("verdict %+v", st.verdict)
				}
			}},
		{name: "mpsd unreachable for the second ask too: the failure was the command's own",
			st: func() state { s := failedVerdict(verdictAsked); s.verdict.asks = maxAsks; return s }(),
			in: input{kind: inReleaseAnswer, now: t0, err: ErrUnreachable}, phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, st state, acts []action) {
				if acts[0].code != 3 || acts[0].err != nil || st.released {
					t.Errorf("end %+v, state %+v", acts[0], st)
				}
			}},
		{name: "no answer to the release in time: the failure was the command's own",
			st: failedVerdict(verdictAsked), in: input{kind: inVerdictDue, now: t0}, phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if acts[0].code != 3 {
					t.Errorf("end %+v", acts[0])
				}
			}},
		{name: "the revocation mpsd announced comes: the failure was mpsd's",
			st: failedVerdict(verdictRevoking), in: evRevoked("server died"), phase: phaseRevoked, acts: []actionKind{actUnhold},
			check: func(t *testing.T, st state, _ []action) {
				if st.verdict != nil || st.revoked != "server died" {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "the resumed lease's grant read after the failure, with the stream open since: it says nothing of the failure",
			st: failedVerdict(verdictRevoking), in: evGranted(grant("lease-1", 1)), phase: phaseVerdictPending, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if st.verdict == nil || st.verdict.why != verdictRevoking {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "a grant read while the release is asked for decides nothing either",
			st: failedVerdict(verdictFailed), in: evGranted(grant("lease-1", 1)), phase: phaseVerdictPending, acts: nil},
		{name: "the resumed lease's grant after the failure while mpsd was away: mpsd kept the lease, the failure was the command's",
			st: failedVerdict(verdictAway), in: evGranted(grant("lease-1", 1)), phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if acts[0].code != 3 {
					t.Errorf("end %+v", acts[0])
				}
			}},
		{name: "the revocation mpsd announced never comes: the command's status, and a word why",
			st: failedVerdict(verdictRevoking), in: input{kind: inVerdictDue, now: t0}, phase: phaseDone, acts: []actionKind{actSay, actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if acts[0].line != "mpsd said it was revoking lease lease-1, but no revocation came within 1m0s" || acts[1].code != 3 {
					t.Errorf("acts %+v", acts)
				}
			}},
		{name: "a release's answer after the revocation came changes nothing",
			st: func() state {
				s := running()
				s.child, s.phase, s.revoked = false, phaseRevoked, "server died"
				return s
			}(),
			in: input{kind: inReleaseAnswer, now: t0, err: &api.Error{Code: api.CodeRevoking}}, phase: phaseRevoked, acts: nil},
		{name: "a release's answer after the stream ended changes nothing: the resumed lease says",
			st: failedVerdict(verdictAway), in: input{kind: inReleaseAnswer, now: t0}, phase: phaseVerdictPending, acts: nil,
			check: func(t *testing.T, st state, _ []action) {
				if st.verdict == nil || st.verdict.why != verdictAway || st.released {
					t.Errorf("state %+v", st)
				}
			}},
		{name: "stream lost while the release is asked: the wait lasts the outage",
			st: failedVerdict(verdictAsked), in: input{kind: inStreamLost, now: t0, err: io.EOF}, phase: phaseVerdictPending,
			acts: []actionKind{actCloseStream, actReconnect},
			check: func(t *testing.T, st state, _ []action) {
				if v := st.verdict; v.why != verdictAway || !v.until.Equal(t0.Add(time.Minute+time.Second)) {
					t.Errorf("verdict %+v", v)
				}
			}},
		{name: "the verdict's end says a kill while mpsd was away",
			st: func() state {
				s := running()
				s.child, s.phase = false, phaseVerdictPending
				s.verdict = &verdict{code: 137, why: verdictAway, killedBy: "SIGKILL", until: t0}
				return s
			}(),
			in: input{kind: inVerdictDue, now: t0}, phase: phaseDone, acts: []actionKind{actSay, actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if acts[0].line != "the command was killed by SIGKILL while mpsd was away (exit status 137)" || acts[1].code != 137 {
					t.Errorf("acts %+v", acts)
				}
			}},
		{name: "the resumed lease confirmed during the wait: the failure was the command's",
			st: func() state {
				s := running()
				s.child, s.phase, s.verdict = false, phaseVerdictPending, &verdict{code: 3, why: verdictAway, until: t0}
				return s
			}(),
			in: evGranted(grant("lease-1", 1)), phase: phaseDone, acts: []actionKind{actEnd}},
		{name: "a refused attach's verdict asks for the release too",
			st: attachRefused(state{lease: grant("lease-1", 1), leaseID: "lease-1", attempt: 1, granted: true},
				&api.Error{Code: api.CodeConflict, Message: "lease ended"}, t0, tmTest),
			in: input{kind: inVerdictDue, now: t0}, phase: phaseVerdictPending, acts: []actionKind{actAskRelease}},
		{name: "a refused attach's verdict ends with its error once mpsd released the lease",
			st: func() state {
				s := attachRefused(state{lease: grant("lease-1", 1), leaseID: "lease-1", attempt: 1, granted: true},
					&api.Error{Code: api.CodeConflict, Message: "lease ended"}, t0, tmTest)
				s.verdict.why = verdictAsked
				return s
			}(),
			in: input{kind: inReleaseAnswer, now: t0}, phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				var ae *api.Error
				if !errors.As(acts[0].err, &ae) || ae.Code != api.CodeConflict {
					t.Errorf("end %+v", acts[0])
				}
			}},
		{name: "stream lost while the command runs: reconnect",
			st: running(), in: input{kind: inStreamLost, now: t0, err: io.EOF}, phase: phaseRunning, acts: []actionKind{actCloseStream, actReconnect}},
		{name: "stream lost during a failure's wait: the wait lasts the outage",
			st: func() state {
				s := running()
				s.child, s.phase, s.verdict = false, phaseVerdictPending, &verdict{code: 3, why: verdictFailed, until: t0}
				return s
			}(),
			in: input{kind: inStreamLost, now: t0, err: io.EOF}, phase: phaseVerdictPending, acts: []actionKind{actCloseStream, actReconnect},
			check: func(t *testing.T, st state, _ []action) {
				if v := st.verdict; v.why != verdictAway || !v.until.Equal(t0.Add(time.Minute+time.Second)) {
					t.Errorf("verdict %+v", v)
				}
			}},
		{name: "a bad line while queued ends the session",
			st: state{}, in: input{kind: inStreamLost, now: t0, err: errors.Join(ErrProtocol, errors.New("bad line"))},
			phase: phaseDone, acts: []actionKind{actCloseStream, actCloseStream, actEnd}},
		{name: "error event while queued ends the session",
			st:    state{},
			in:    input{kind: inEvent, now: t0, ev: api.Event{Type: api.EventError, Code: api.CodeWaitTimeout, Message: "waited 1s"}},
			phase: phaseDone, acts: []actionKind{actCloseStream, actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if ExitCode(acts[1].err) != ExitTempFail {
					t.Errorf("end %+v, want a temporary error", acts[1])
				}
			}},
		{name: "error event while the command runs detaches it",
			st:    running(),
			in:    input{kind: inEvent, now: t0, ev: api.Event{Type: api.EventError, Code: api.CodeInternal, Message: "broken"}},
			phase: phaseDetached, acts: []actionKind{actCloseStream, actSay}},
		{name: "giving up on mpsd while queued ends with the loss",
			st: state{}, in: input{kind: inGiveUp, now: t0, err: ErrLost}, phase: phaseDone, acts: []actionKind{actCloseStream, actEnd}},
		{name: "giving up on mpsd during a failure's wait: the failure is the command's own",
			st: func() state {
				s := running()
				s.child, s.phase, s.verdict = false, phaseVerdictPending, &verdict{code: 3, why: verdictAway, until: t0}
				return s
			}(),
			in: input{kind: inGiveUp, now: t0, err: ErrLost}, phase: phaseDone, acts: []actionKind{actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if acts[0].code != 3 || acts[0].err != nil {
					t.Errorf("end %+v", acts[0])
				}
			}},
		{name: "a signal goes to the command",
			st: running(), in: input{kind: inSignal, now: t0, sig: syscall.SIGUSR1}, phase: phaseRunning, acts: []actionKind{actSignal}},
		{name: "SIGTERM while queued abandons the request",
			st: state{}, in: input{kind: inSignal, now: t0, sig: syscall.SIGTERM}, phase: phaseDone, acts: []actionKind{actClearStatus, actEnd},
			check: func(t *testing.T, _ state, acts []action) {
				if acts[1].code != 128+int(syscall.SIGTERM) {
					t.Errorf("end %+v, want 143", acts[1])
				}
			}},
		{name: "SIGUSR1 while queued is ignored",
			st: state{}, in: input{kind: inSignal, now: t0, sig: syscall.SIGUSR1}, phase: phaseQueued, acts: nil},
		{name: "a signal after the command finished while mpsd was away ends with its 0",
			st: state{finished: true, started: true}, in: input{kind: inSignal, now: t0, sig: syscall.SIGINT}, phase: phaseDone, acts: []actionKind{actEnd}},
		{name: "a queued lease mpsd lost is asked for anew",
			st:    state{leaseID: "lease-q", attempt: 1},
			in:    input{kind: inGiveUp, now: t0, err: &api.Error{Code: api.CodeNotFound, Message: "no lease lease-q"}},
			phase: phaseQueued, acts: []actionKind{actSay, actUnhold, actReconnect},
			check: func(t *testing.T, st state, acts []action) {
				if acts[0].line != "lease lease-q was lost while mpsd was away; requesting a new one" || st.leaseID != "" || st.attempt != 0 {
					t.Errorf("line %q, state %+v", acts[0].line, st)
				}
			}},
		{name: "a lease mpsd lost after its command ran is not asked for anew",
			st:    func() state { s := running(); s.started, s.child = true, false; return s }(),
			in:    input{kind: inGiveUp, now: t0, err: &api.Error{Code: api.CodeNotFound, Message: "no lease lease-1"}},
			phase: phaseDone, acts: []actionKind{actCloseStream, actEnd}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, acts := step(tc.st, tc.in, tmTest)
			if got := kinds(acts); !slices.Equal(got, tc.acts) {
				t.Errorf("actions %v, want %v (%+v)", got, tc.acts, acts)
			}
			if tc.check == nil || tc.phase != 0 {
				if st.phase != tc.phase {
					t.Errorf("phase %s, want %s", st.phase, tc.phase)
				}
			}
			if tc.check != nil {
				tc.check(t, st, acts)
			}
		})
	}
}

// TestStepRevokedDropsPendingGrant is the chaos soak's sequence: a grant
// that arrives while the previous command is still dying waits; a
// revocation of that grant's attempt must drop it, or the command's exit
// launches it (clearing the revocation) and the requeue that follows is
// taken for a protocol violation.
func TestStepRevokedDropsPendingGrant(t *testing.T) {
	st := running()
	var acts []action
	for i, in := range []input{
		evRevoked("xid 79"),            // attempt 1 revoked; its command is being killed
		evRequeued(2),                  // requeued
		evGranted(grant("lease-1", 2)), // attempt 2 granted while attempt 1's command dies
		evRevoked("xid 79 again"),      // attempt 2 revoked before it ran
		childExit(137, true, false),    // attempt 1's command is gone
		evRequeued(3),                  // requeued again: not a violation
		evGranted(grant("lease-1", 3)), // attempt 3 granted
	} {
		st, acts = step(st, in, tmTest)
		if a, ok := endOf(acts); ok {
			t.Fatalf("input %d (%v %s) ended the session: %+v", i, in.kind, in.ev.Type, a)
		}
		switch i {
		case 3:
			if st.pending != nil {
				t.Fatalf("after the second revocation the grant of attempt %d still waits", st.pending.Attempt)
			}
		case 4:
			if slices.Contains(kinds(acts), actLaunch) {
				t.Fatalf("the revoked attempt 2 was launched: %+v", acts)
			}
		}
	}
	if got := kinds(acts); !slices.Equal(got, []actionKind{actUnhold, actLaunch}) || acts[1].lease.Attempt != 3 {
		t.Fatalf("last actions %+v, want attempt 3 launched", acts)
	}
	if st.phase != phaseLaunching || st.attempt != 3 {
		t.Errorf("phase %s attempt %d, want launching 3", st.phase, st.attempt)
	}
}

// TestStepDetachedLine: the line that says the session gave up its
// lease's stream while the command runs tells what becomes of the
// command. A live mpsd releases a lease whose stream closes, killing its
// cgroup: only where mpsd does not know the lease does it keep running.
func TestStepDetachedLine(t *testing.T) {
	protocol := fmt.Errorf("%w: bad line", ErrProtocol)
	lost := fmt.Errorf("%w: unreachable for 1m0s: %w", ErrLost, ErrUnreachable)
	for _, tc := range []struct {
		name string
		in   input
		want string
	}{
		{"a bad line on the stream", input{kind: inStreamLost, now: t0, err: protocol},
			"protocol violation: bad line; mpsd ends the command as it releases the lease"},
		{"requeued without a revocation", evRequeued(2),
			"protocol violation: requeued without a revocation; mpsd ends the command as it releases the lease"},
		{"mpsd away for the outage window", input{kind: inGiveUp, now: t0, err: lost},
			"gave up on mpsd: unreachable for 1m0s: cannot reach mpsd; the command runs on without a lease, until an mpsd that comes back ends it"},
		{"the resumed lease unknown to mpsd", input{kind: inGiveUp, now: t0, err: &api.Error{Code: api.CodeNotFound, Message: "no lease lease-1"}},
			"no lease lease-1; the command keeps running without a lease"},
		{"the resume refused otherwise", input{kind: inGiveUp, now: t0, err: &api.Error{Code: api.CodeOverLimit, Message: "at the connection cap"}},
			"at the connection cap; the command runs on without a lease, unless mpsd ends it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := running()
			st.started = true
			st, acts := step(st, tc.in, tmTest)
			var said []string
			for _, a := range acts {
				if a.kind == actSay {
					said = append(said, a.line)
				}
			}
			if !slices.Equal(said, []string{tc.want}) || st.phase != phaseDetached || !slices.Contains(kinds(acts), actCloseStream) {
				t.Errorf("said %q, phase %s, actions %v; want %q, detached, the stream closed", said, st.phase, kinds(acts), tc.want)
			}
		})
	}
}
