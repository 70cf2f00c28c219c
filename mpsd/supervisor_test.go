package mpsd

import (
	"context"
	"log/slog"
	"testing"

	"github.com/mpsd/mpsd/internal/clock"
)

// TestSupervisorNext covers every (lifecycle, fault pending, stop asked)
// case of the supervisor's decision table.
func TestSupervisorNext(t *testing.T) {
	type in struct {
		c           lifecycle
		fault, stop bool
	}
	want := map[in]supAction{
		{instStopped, false, false}:   supExit,
		{instStopped, true, false}:    supExit,
		{instStopped, false, true}:    supExit,
		{instStopped, true, true}:     supExit,
		{instStopping, false, true}:   supStop,
		{instStopping, true, true}:    supStop,
		{instRecovering, true, false}: supRecover,
		{instRecovering, true, true}:  supRecover,
	}
	cases := 0
	for c := instStarting; c <= instStopped; c++ {
		for _, fault := range []bool{false, true} {
			for _, stop := range []bool{false, true} {
				cases++
				w, ok := want[in{c, fault, stop}]
				if !ok {
					w = supWait
				}
				if got := supervisorNext(c, fault, stop); got != w {
					t.Errorf("supervisorNext(%s, fault pending %v, stop asked %v) = %s, want %s", c, fault, stop, got, w)
				}
			}
		}
	}
	if cases != 5*4 {
		t.Fatalf("covered %d cases, want 20: a lifecycle was added without its rows", cases)
	}
	// A starting instance's fault is the bring-up's to hand on: the
	// supervisor, busy with the bring-up, must not start a recovery of an
	// instance that has no daemon.
	if got := supervisorNext(instStarting, true, false); got != supWait {
		t.Errorf("starting with a fault pending = %s, want wait", got)
	}
	for _, a := range []supAction{supWait, supStop, supRecover, supExit, 9} {
		if a.String() == "" {
			t.Errorf("action %d has no name", a)
		}
	}
}

// TestKickCoalesces: kicks never block, and many kicks before the
// supervisor looks wake it once.
func TestKickCoalesces(t *testing.T) {
	in := &instance{kick: make(chan struct{}, 1)}
	for range 10 {
		in.kickLocked()
	}
	select {
	case <-in.kick:
	default:
		t.Fatal("no kick waiting after kickLocked")
	}
	select {
	case <-in.kick:
		t.Fatal("ten kicks woke the supervisor twice")
	default:
	}
	(&instance{}).kickLocked() // an instance without a supervisor: no block
}

// TestReportFaultCutsProbeShort: a fault reported while a probe is under
// way cancels the probe's context (its recovery waits for no probe
// timeout) and wakes the supervisor; the instance is recovering at once.
func TestReportFaultCutsProbeShort(t *testing.T) {
	d := &Daemon{clock: clock.Real{}, ctx: t.Context()}
	in := &instance{key: "g/0", life: instUp, faults: map[string]int{}, kick: make(chan struct{}, 1), logHandled: -1}
	ctx, cancel := context.WithCancel(t.Context())
	in.probeCancel = cancel
	d.reportFault(in, fault{kind: faultServerExit, reason: "test"})
	if ctx.Err() == nil {
		t.Error("the probe under way was not cut short")
	}
	if in.life != instRecovering {
		t.Errorf("instance is %s after a fault, want recovering", in.life)
	}
	if len(in.pending) != 1 || in.pending[0].kind != faultServerExit {
		t.Errorf("pending = %+v, want the fault for the supervisor", in.pending)
	}
	select {
	case <-in.kick:
	default:
		t.Error("the supervisor was not woken")
	}
	// More faults during the recovery wait beside it, each with its own
	// victims, and do not step the instance again.
	d.reportFault(in, fault{kind: faultServerFault, leases: []string{"l-7"}, reason: "lease l-7"})
	d.reportFault(in, fault{kind: faultHung, restart: restartDaemon, reason: "hung"})
	if len(in.pending) != 3 || in.life != instRecovering {
		t.Errorf("after two more faults: %d pending, life %s; want 3, recovering", len(in.pending), in.life)
	}
	// A stopping instance takes no fault.
	st := &instance{key: "g/1", life: instStopping, faults: map[string]int{}, kick: make(chan struct{}, 1)}
	d.reportFault(st, fault{kind: faultServerExit})
	if st.pending != nil || st.faults[faultServerExit] != 0 {
		t.Error("a stopping instance took a fault")
	}
}

// TestCombineFaults: faults pending together are one recovery with the
// strongest restart, an operator's only if all were, and each lease is a
// victim of the first fault that names it: a fault limited to some
// leases hides no other fault's victims.
func TestCombineFaults(t *testing.T) {
	faultX := fault{kind: faultServerFault, leases: []string{"l-x"}, reason: "fault record naming l-x"}
	faultY := fault{kind: faultServerFault, leases: []string{"l-y"}, reason: "fault record naming l-y"}
	ended := fault{kind: faultServerFault, leases: []string{"l-a"}, reason: "fault record"}
	exit := fault{kind: faultServerExit, reason: "server died"}
	admin := fault{kind: faultAdmin, restart: restartDaemon, admin: true, reason: "admin"}

	if got := combineFaults([]fault{faultX, admin}); got.kind != faultAdmin || got.restart != restartDaemon || got.admin {
		t.Errorf("server_fault + admin restart = %s restart %s admin %v; want admin_restart, control_daemon, not an operator's only", got.kind, got.restart, got.admin)
	}
	if got := combineFaults([]fault{admin, admin}); !got.admin {
		t.Error("two operator restarts counted towards quarantine")
	}
	if got := combineFaults([]fault{faultX, faultY}); got.kind != faultServerFault || got.reason != faultX.reason {
		t.Errorf("two lease-limited faults = %s %q; want the first", got.kind, got.reason)
	}

	for _, tc := range []struct {
		name   string
		fs     []fault
		lease  string
		victim bool
		reason string
	}{
		{"the second record's lease", []fault{faultX, faultY}, "l-y", true, faultY.reason},
		{"the first record's lease", []fault{faultX, faultY}, "l-x", true, faultX.reason},
		{"a third lease", []fault{faultX, faultY}, "l-z", false, ""},
		{"named lease", []fault{ended, exit}, "l-a", true, ended.reason},
		{"other lease of the dead server", []fault{ended, exit}, "l-b", true, exit.reason},
		{"lease the record alone does not name", []fault{ended}, "l-b", false, ""},
	} {
		f, ok := faultVictim(tc.fs, tc.lease)
		if ok != tc.victim || f.reason != tc.reason {
			t.Errorf("%s: victim %v (%q), want %v (%q)", tc.name, ok, f.reason, tc.victim, tc.reason)
		}
	}
}

// TestUnhandledFaultReadAgain: a server.log fault left pending when mpsd
// stops moves the saved offset back to its line, so the next mpsd reads
// it again, even though its report had moved the offset past it.
func TestUnhandledFaultReadAgain(t *testing.T) {
	d := &Daemon{clock: clock.Real{}, ctx: t.Context()}
	in := &instance{key: "g/0", life: instStarting, faults: map[string]int{}, kick: make(chan struct{}, 1), logHandled: 100,
		log: slog.New(slog.DiscardHandler)}
	d.reportFault(in, fault{kind: faultServerFault, fromServerLog: true, logOffset: 500})
	if in.logHandled != 501 {
		t.Fatalf("logHandled %d after the report, want 501", in.logHandled)
	}
	in.unhandledLocked(in.pending[0])
	if in.logHandled != 500 {
		t.Errorf("logHandled %d after mpsd stopped with the fault pending, want 500 (its line)", in.logHandled)
	}
}

// TestProbeClock: one tick wakes every waiter at once; a waiter after the
// tick waits for the next one.
func TestProbeClock(t *testing.T) {
	var c probeClock
	a, b := c.next(), c.next()
	c.tick()
	for i, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Errorf("waiter %d not woken by the tick", i)
		}
	}
	later := c.next()
	select {
	case <-later:
		t.Error("a waiter after the tick was woken by it")
	default:
	}
	c.tick()
	<-later
}
