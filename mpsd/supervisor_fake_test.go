package mpsd

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/clock"
	"github.com/mpsd/mpsd/policy"
)

// The supervisor's bring-up on a fake control daemon and a fake clock:
// no process, no root, no sleep. Every wait of the code under test is a
// timer on the fake clock, which the test moves by exactly what the rule
// says.

var fakeT0 = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)

// fakeCore is a Daemon with what the supervisor's bring-up and the
// daemon's event reader use, on a fake clock and a fake starter, and one
// instance of group g on GPU 0.
func fakeCore(t *testing.T, wd policy.WatchdogConfig, outcomes ...error) (*Daemon, *instance, *clock.Fake, *fakeStarter) {
	t.Helper()
	clk := clock.NewFake(fakeT0)
	st := &fakeStarter{outcomes: outcomes, calls: make(chan string, 16)}
	log := slog.New(slog.DiscardHandler)
	d := &Daemon{clock: clk, starter: st, log: log, ctx: t.Context(),
		cfg:       &policy.Config{Watchdog: wd},
		instances: map[string]*instance{}, queues: map[string][]*lease{}, leases: map[string]*lease{},
		store: &store{kick: make(chan struct{}, 1)}}
	in := &instance{key: "g/0", group: "g", gpus: []gpu.Info{{Index: 0, UUID: "GPU-fake-0"}}, mps: newMPSModel(),
		leases: map[string]*lease{}, tried: make(chan struct{}), kick: make(chan struct{}, 1), done: make(chan struct{}),
		faults: map[string]int{}, restartsBy: map[string]int{}, serverLogOff: -1, logHandled: -1,
		pipeDir: "/nonexistent/pipe", log: log, p: policy.Instance{Group: "g", GPUs: []int{0}}}
	d.setInstanceLocked(in)
	t.Cleanup(func() {
		d.gmu.Lock()
		d.gclosed = true
		d.gmu.Unlock()
		for i := range st.next {
			_ = st.daemon(i).Close()
		}
		d.wg.Wait()
	})
	return d, in, clk, st
}

// fakeUp is fakeCore with its instance up on a started fake control
// daemon (returned), under ctx (mpsd's context: cancelling it is mpsd
// beginning to stop).
func fakeUp(t *testing.T, ctx context.Context) (*Daemon, *instance, *clock.Fake, *fakeControl) {
	t.Helper()
	wd := policy.WatchdogConfig{BackoffInitial: time.Second, BackoffMax: 4 * time.Second,
		QuarantineAfter: 3, QuarantineWindow: 10 * time.Minute, ProbeTimeout: time.Second, ProbeFailures: 2}
	d, in, clk, st := fakeCore(t, wd)
	d.ctx = ctx
	d.metrics = &metrics{requeues: map[string]uint64{}}
	done := make(chan struct{})
	go func() { defer close(done); d.bringUp(in, false) }()
	st.wantCall(t, "start")
	<-done
	return d, in, clk, st.daemon(0)
}

// waitsExactly checks that the code under test has armed a timer due in
// exactly want and starts nothing before it is due: it moves the clock to
// a nanosecond short of it, checks that no starter call came, then to it.
// ended closes if the code under test ends instead.
func waitsExactly(t *testing.T, clk *clock.Fake, st *fakeStarter, ended <-chan struct{}, want time.Duration, what string) {
	t.Helper()
	if !clk.WaitPending(1, ended) {
		t.Fatalf("%s: the code under test ended without waiting", what)
	}
	at, _ := clk.NextDeadline()
	if got := at.Sub(clk.Now()); got != want {
		t.Fatalf("%s waits %v, want %v", what, got, want)
	}
	clk.Advance(want - time.Nanosecond)
	select {
	case how := <-st.calls:
		t.Fatalf("%s: %s came before %v had passed", what, how, want)
	default:
	}
	clk.Advance(time.Nanosecond)
}

func (st *fakeStarter) wantCall(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-st.calls:
		if got != want {
			t.Fatalf("starter: %s, want %s", got, want)
		}
	case <-time.After(waitFor):
		t.Fatalf("starter: no %s within %v", want, waitFor)
	}
}

// A control daemon that fails to start is tried again after the
// watchdog's backoff, doubling up to its cap, and never sooner: the
// retries wait on the clock, not on a sleep. Each retry first looks for a
// daemon to adopt. The fifth start succeeds and
// the instance is up on that daemon.
func TestBringUpBacksOffOnTheClock(t *testing.T) {
	wd := policy.WatchdogConfig{BackoffInitial: time.Second, BackoffMax: 4 * time.Second}
	d, in, clk, st := fakeCore(t, wd, errFakeStart, errFakeStart, errFakeStart, errFakeStart, nil)
	done := make(chan struct{})
	go func() { defer close(done); d.bringUp(in, false) }()

	for i, backoff := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		if i > 0 {
			// A retry first looks for a daemon that came up meanwhile.
			st.wantCall(t, "adopt")
		}
		st.wantCall(t, "start")
		waitsExactly(t, clk, st, done, backoff, fmt.Sprintf("after failed start %d the retry", i+1))
	}
	st.wantCall(t, "adopt")
	st.wantCall(t, "start")
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("the bring-up did not end after a start succeeded")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if in.life != instUp || in.daemon != st.daemon(0) || in.startErr != "" {
		t.Fatalf("after the fifth start: life %s, daemon %v, start error %q; want up on the started daemon", in.life, in.daemon, in.startErr)
	}
}

// waitLife waits until the instance is in life c on daemon dm (nil: any).
func waitLife(t *testing.T, d *Daemon, in *instance, c lifecycle, dm control) {
	t.Helper()
	waitCond(t, fmt.Sprintf("instance %s", c), func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return in.life == c && (dm == nil || in.daemon == dm)
	}, nil)
}

// A control daemon that keeps dying: the first failure in the watchdog's
// window restarts it at once, each later one after the doubling backoff
// on the clock (never sooner), and the quarantine_after-th failure
// within the window quarantines the instance. The supervisor does all of
// it on fakes, in order.
func TestDaemonCrashLoopOnTheClock(t *testing.T) {
	wd := policy.WatchdogConfig{BackoffInitial: time.Second, BackoffMax: 4 * time.Second,
		QuarantineAfter: 3, QuarantineWindow: 10 * time.Minute, ProbeTimeout: time.Second, ProbeFailures: 2}
	d, in, clk, st := fakeCore(t, wd)
	go d.supervise(in)
	t.Cleanup(func() { <-in.done })
	st.wantCall(t, "adopt") // mpsd's start looks for a daemon to adopt first
	st.wantCall(t, "start")
	waitLife(t, d, in, instUp, st.daemon(0))

	for i, delay := range []time.Duration{0, time.Second, 2 * time.Second} {
		st.daemon(i).exit(1)
		if delay > 0 {
			// The recovery waits its backoff before the restart.
			waitsExactly(t, clk, st, in.done, delay, fmt.Sprintf("after failure %d the restart", i+1))
		}
		st.wantCall(t, "adopt")
		st.wantCall(t, "start")
		waitLife(t, d, in, instUp, st.daemon(i+1))
		d.mu.Lock()
		quarantined, restarts := in.holds.quarantined, in.restarts
		d.mu.Unlock()
		if want := i+1 >= wd.QuarantineAfter; quarantined != want || restarts != i+1 {
			t.Fatalf("after failure %d: quarantined %v, restarts %d; want %v, %d", i+1, quarantined, restarts, want, i+1)
		}
		if n := st.daemon(i).stopCount(); n != 1 {
			t.Fatalf("failure %d: the dead daemon was stopped %d times, want once (its servers with it)", i+1, n)
		}
	}
}

// A fault reported while a recovery waits out its backoff is not lost
// and does not cut the wait short: once the daemon is back it is handled
// as a recovery of its own, which counts as the next failure of the
// window (and backs off by the next step).
func TestFaultDuringBackoffHandledAfter(t *testing.T) {
	wd := policy.WatchdogConfig{BackoffInitial: time.Second, BackoffMax: 8 * time.Second,
		QuarantineAfter: 5, QuarantineWindow: 10 * time.Minute, ProbeTimeout: time.Second, ProbeFailures: 2}
	d, in, clk, st := fakeCore(t, wd)
	go d.supervise(in)
	t.Cleanup(func() { <-in.done })
	st.wantCall(t, "adopt")
	st.wantCall(t, "start")
	waitLife(t, d, in, instUp, st.daemon(0))

	// The first failure restarts at once.
	st.daemon(0).exit(1)
	st.wantCall(t, "adopt")
	st.wantCall(t, "start")
	waitLife(t, d, in, instUp, st.daemon(1))

	// The second waits 1s; a server's death is reported meanwhile.
	st.daemon(1).exit(1)
	if !clk.WaitPending(1, in.done) {
		t.Fatal("the supervisor ended")
	}
	d.reportFault(in, fault{kind: faultServerExit, restart: restartNone, reason: "a server died during the backoff"})
	select {
	case how := <-st.calls:
		t.Fatalf("%s before the backoff passed: the new fault cut the wait short", how)
	default:
	}
	clk.Advance(time.Second)
	st.wantCall(t, "adopt")
	st.wantCall(t, "start")
	// The fault reported during the wait is the third failure: its
	// recovery waits 2s (it restarts no daemon) and reopens the instance.
	waitCond(t, "the fault reported during the backoff to be handled", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return in.restarts == 3
	}, nil)
	if !clk.WaitPending(1, in.done) {
		t.Fatal("the supervisor ended")
	}
	if at, _ := clk.NextDeadline(); at.Sub(clk.Now()) != 2*time.Second {
		t.Fatalf("the third failure's recovery waits %v, want 2s", at.Sub(clk.Now()))
	}
	clk.Advance(2 * time.Second)
	waitLife(t, d, in, instUp, st.daemon(2))
	d.mu.Lock()
	defer d.mu.Unlock()
	if got := in.restartsBy[faultServerExit]; got != 1 || len(in.pending) != 0 {
		t.Fatalf("server exits handled %d, pending %d; want the one reported during the backoff handled", got, len(in.pending))
	}
}

// mpsd restarts and finds the control daemon its saved lease ran on gone:
// the new daemon's bring-up reports the lease's loss before the instance
// is up, so that it never looks up with the lease on it (a lease whose
// command that loss killed would then be taken by the reaper of
// re-adopted leases for one that ended on its own: released as "command
// ended while its launcher was away", not requeued; the chaos soak met
// that race). The lease is revoked and requeued.
func TestOrphanedLeaseReportedBeforeUp(t *testing.T) {
	wd := policy.WatchdogConfig{BackoffInitial: time.Second, BackoffMax: 4 * time.Second,
		QuarantineAfter: 3, QuarantineWindow: 10 * time.Minute, ProbeTimeout: time.Second, ProbeFailures: 2}
	d, in, _, st := fakeCore(t, wd)
	d.metrics = &metrics{requeues: map[string]uint64{}}
	l := &lease{id: "g-1", group: "g", uid: 1000, state: leaseRunning, attempt: 1, requeue: 2, inst: in, box: newMailbox(d.log), log: d.log,
		req: policy.Request{Group: "g", UID: 1000, SM: 10, Mem: 1 << 30, GPUs: 1, Procs: 1, Seq: 1}}
	in.p.Budget = policy.Usage{SM: 100, Mem: 1 << 40, Clients: 48}
	in.p.Assign(&l.req)
	in.leases[l.id], d.leases[l.id] = l, l
	var lifeAtReport []lifecycle
	d.opts.faultHook = func(in *instance, f fault) {
		d.mu.Lock()
		defer d.mu.Unlock()
		lifeAtReport = append(lifeAtReport, in.life)
	}
	done := make(chan struct{})
	go func() { defer close(done); d.bringUp(in, true) }()
	st.wantCall(t, "adopt") // none there: the saved one is gone
	st.wantCall(t, "start")
	<-done
	d.mu.Lock()
	reported := slices.Clone(lifeAtReport)
	d.mu.Unlock()
	if len(reported) != 1 || reported[0] == instUp {
		t.Fatalf("the lost daemon's fault was reported with the instance %v; want once, before it is up", reported)
	}
	waitCond(t, "the lease requeued", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return l.state == leaseQueued && l.attempt == 2
	}, nil)
	d.mu.Lock()
	defer d.mu.Unlock()
	if in.life != instRecovering || len(in.pending) != 1 || in.pending[0].kind != faultDaemonExit {
		t.Fatalf("after the bring-up: %s with %d faults pending; want recovering from the daemon's loss", in.life, len(in.pending))
	}
}
