package mpsd

import (
	"errors"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

// TestLeaseStep covers every (state, event) pair of the lease's table:
// the legal ones give their next state and effects, every other one
// errIllegalTransition and leaves the state as it was.
func TestLeaseStep(t *testing.T) {
	type result struct {
		next leaseState
		eff  leaseEffects
	}
	legal := map[[2]uint8]result{
		{uint8(leaseQueued), uint8(leaseGrant)}:       {leaseRunning, effPersist | effTellGranted},
		{uint8(leaseQueued), uint8(leaseWithdraw)}:    {leaseEnded, 0},
		{uint8(leaseRunning), uint8(leaseRevoke)}:     {leaseRevoking, effPersist | effTellRevoked | effKill},
		{uint8(leaseRunning), uint8(leaseRelease)}:    {leaseReleasing, effKill},
		{uint8(leaseRevoking), uint8(leaseRequeue)}:   {leaseQueued, effFree | effPersist | effTellRequeued},
		{uint8(leaseRevoking), uint8(leaseDrop)}:      {leaseEnded, effFree | effPersist},
		{uint8(leaseReleasing), uint8(leaseReleased)}: {leaseEnded, effFree | effPersist},
	}
	pairs := 0
	for s := leaseQueued; s <= leaseEnded; s++ {
		for ev := leaseEvent(0); ev < numLeaseEvents; ev++ {
			pairs++
			next, eff, err := leaseStep(s, ev)
			want, ok := legal[[2]uint8{uint8(s), uint8(ev)}]
			switch {
			case ok && err != nil:
				t.Errorf("%s on %s: %v, want %s", s, ev, err, want.next)
			case ok && (next != want.next || eff != want.eff):
				t.Errorf("%s on %s = %s (effects %b), want %s (effects %b)", s, ev, next, eff, want.next, want.eff)
			case !ok && !errors.Is(err, errIllegalTransition):
				t.Errorf("%s on %s = %s, want errIllegalTransition", s, ev, next)
			case !ok && (next != s || eff != 0):
				t.Errorf("%s on %s (illegal) = %s (effects %b), want the state unchanged and no effects", s, ev, next, eff)
			}
		}
	}
	if pairs != 5*7 {
		t.Fatalf("covered %d pairs, want 35: a state or event was added without its rows", pairs)
	}
	// Only a revocation tells a launcher revoked, and only its end
	// requeued: the protocol's order comes from the table.
	for s := leaseQueued; s <= leaseEnded; s++ {
		for ev := leaseEvent(0); ev < numLeaseEvents; ev++ {
			if _, eff, err := leaseStep(s, ev); err == nil && eff&effTellRequeued != 0 && s != leaseRevoking {
				t.Errorf("%s on %s tells requeued, but only a revoking lease may be requeued", s, ev)
			}
		}
	}
	for _, s := range []leaseState{leaseQueued, leaseRunning, leaseRevoking, leaseReleasing, leaseEnded, 9} {
		if s.String() == "" {
			t.Errorf("state %d has no name", s)
		}
	}
}

// TestLeaseStepReports checks that lease.step refuses an illegal event,
// leaves the lease as it was and reports it to illegalTransition.
func TestLeaseStepReports(t *testing.T) {
	var got []error
	saved := illegalTransition
	illegalTransition = func(err error) { got = append(got, err) }
	defer func() { illegalTransition = saved }()
	l := &lease{id: "g-1", state: leaseQueued}
	if _, err := l.step(leaseRequeue, "test"); !errors.Is(err, errIllegalTransition) {
		t.Fatalf("requeue of a queued lease: %v, want errIllegalTransition", err)
	}
	if l.state != leaseQueued || len(got) != 1 {
		t.Fatalf("state %s, %d reports; want queued and 1", l.state, len(got))
	}
	for _, ev := range []leaseEvent{leaseGrant, leaseRevoke, leaseRequeue} {
		if _, err := l.step(ev, "test"); err != nil {
			t.Fatalf("%s: %v", ev, err)
		}
	}
	if l.state != leaseQueued || len(got) != 1 {
		t.Fatalf("after grant, revoke, requeue: state %s, %d reports; want queued and 1", l.state, len(got))
	}
}

// TestMailboxProtocol checks the server side of the launcher's rule that
// a requeued event follows a revoked one: a requeue told without it is
// reported, one after it is not, and a resume (reset) forgets what the
// launcher was told before.
func TestMailboxProtocol(t *testing.T) {
	var got []error
	saved := illegalTransition
	illegalTransition = func(err error) { got = append(got, err) }
	defer func() { illegalTransition = saved }()
	steps := []struct {
		ev    string // "granted", "revoked", "requeued", "queued", "reset"
		wantN int    // reports so far
	}{
		{"granted", 0}, {"revoked", 0}, {"requeued", 0}, {"queued", 0}, {"requeued", 0},
		{"granted", 0}, {"requeued", 1},
		{"revoked", 1}, {"reset", 1}, {"requeued", 2},
		{"reset", 2}, {"revoked", 2}, {"requeued", 2},
	}
	m := newMailbox(nil)
	for i, s := range steps {
		switch s.ev {
		case "reset":
			m.reset()
		default:
			m.push(api.Event{Type: api.EventType(s.ev), Attempt: 2})
		}
		if len(got) != s.wantN {
			t.Fatalf("step %d (%s): %d reports, want %d", i, s.ev, len(got), s.wantN)
		}
	}
}

// TestRevocationComing: a release is refused as revoking exactly when a
// revocation has the lease's attempt (it is past it, or revoking), or a
// fault pending on its instance (or being handled by its recovery) names
// it; a fault record waiting for its Xid that names it holds the answer.
func TestRevocationComing(t *testing.T) {
	named := fault{kind: faultServerFault, leases: []string{"l-1"}}
	other := fault{kind: faultServerFault, leases: []string{"l-2"}}
	all := fault{kind: faultServerExit}
	for _, tc := range []struct {
		name              string
		state             leaseState
		attempt, asked    int
		placed            bool
		pending, handling []fault
		claims            []fault
		want, wantClaim   bool
	}{
		{name: "revoking", state: leaseRevoking, attempt: 1, asked: 1, placed: true, want: true},
		{name: "running, nothing pending", state: leaseRunning, attempt: 1, asked: 1, placed: true},
		{name: "running, an older client names no attempt", state: leaseRunning, attempt: 2, placed: true},
		{name: "running, a fault of the whole instance pending", state: leaseRunning, attempt: 1, asked: 1, placed: true, pending: []fault{all}, want: true},
		{name: "running, a fault naming it pending", state: leaseRunning, attempt: 1, asked: 1, placed: true, pending: []fault{other, named}, want: true},
		{name: "running, a fault naming it being handled", state: leaseRunning, attempt: 1, asked: 1, placed: true, handling: []fault{named}, want: true},
		{name: "running, only faults naming others", state: leaseRunning, attempt: 1, asked: 1, placed: true,
			pending: []fault{other}, handling: []fault{other}, claims: []fault{other}},
		{name: "running, a record naming it waits for its Xid", state: leaseRunning, attempt: 1, asked: 1, placed: true,
			claims: []fault{other, named}, wantClaim: true},
		{name: "running again after the attempt asked was revoked", state: leaseRunning, attempt: 2, asked: 1, placed: true, want: true},
		{name: "queued again after the attempt asked was revoked", state: leaseQueued, attempt: 2, asked: 1, want: true},
		{name: "queued, never ran", state: leaseQueued, attempt: 1, asked: 1},
		{name: "releasing, a fault pending", state: leaseReleasing, attempt: 1, asked: 1, placed: true, pending: []fault{all}, claims: []fault{all}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &lease{id: "l-1", uid: 1000, state: tc.state, attempt: tc.attempt}
			if tc.placed {
				l.inst = &instance{pending: tc.pending, handling: tc.handling}
				for _, f := range tc.claims {
					l.inst.claims = append(l.inst.claims, &faultClaim{f: f, decided: make(chan struct{})})
				}
			}
			if got := l.revocationComingLocked(tc.asked); got != tc.want {
				t.Errorf("revocationComingLocked(%d) = %v, want %v", tc.asked, got, tc.want)
			}
			if got := l.claimNamingLocked() != nil; got != tc.wantClaim {
				t.Errorf("claimNamingLocked found one: %v, want %v", got, tc.wantClaim)
			}
		})
	}
}

// TestLeaseReadRemembersLeft: a pid one reading of a lease's cgroup listed
// and the next does not is remembered with the time of the reading that
// listed it, for culpritSeenAge, and at most maxLeftPids of them; a pid no
// reading listed is not.
func TestLeaseReadRemembersLeft(t *testing.T) {
	l := &lease{}
	t0 := time.Now()
	l.readLocked([]int{1, 2, 3}, t0)
	l.readLocked([]int{2, 3, 4}, t0.Add(time.Second))
	if at, ok := l.left[1]; !ok || !at.Equal(t0) {
		t.Fatalf("pid 1 left at %v (%v), want the first reading's time", at, ok)
	}
	if _, ok := l.left[2]; ok {
		t.Fatal("pid 2, still listed, counted as left")
	}
	if _, ok := l.seenAt(1, t0.Add(time.Second)); !ok {
		t.Fatal("seenAt forgot pid 1, which left just now")
	}
	// The age is on the caller's clock (mpsd's), not the wall clock's.
	if _, ok := l.seenAt(1, t0.Add(culpritSeenAge+time.Second)); ok {
		t.Fatal("seenAt knows pid 1 on a clock past culpritSeenAge after the reading that listed it")
	}
	if _, ok := l.seenAt(5, t0.Add(time.Second)); ok {
		t.Fatal("seenAt knows pid 5, which no reading listed")
	}
	l.readLocked([]int{2, 3, 4}, t0.Add(culpritSeenAge+2*time.Second))
	if _, ok := l.left[1]; ok {
		t.Fatal("pid 1 kept past culpritSeenAge")
	}
	many := make([]int, 2*maxLeftPids)
	for i := range many {
		many[i] = 1000 + i
	}
	l.readLocked(many, t0)
	l.readLocked(nil, t0)
	if len(l.left) != maxLeftPids {
		t.Fatalf("%d pids remembered, want the bound %d", len(l.left), maxLeftPids)
	}
}
