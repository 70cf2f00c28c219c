package mpsd

import (
	"context"
	"testing"
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
	d := &Daemon{ctx: t.Context()}
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
	if in.pending == nil || in.pending.kind != faultServerExit {
		t.Errorf("pending = %+v, want the fault for the supervisor", in.pending)
	}
	select {
	case <-in.kick:
	default:
		t.Error("the supervisor was not woken")
	}
	// A second fault during the recovery waits, the strongest restart
	// kept, and does not step the instance again.
	d.reportFault(in, fault{kind: faultHung, restart: restartDaemon, reason: "hung"})
	d.reportFault(in, fault{kind: faultXid, restart: restartServer, reason: "xid"})
	if in.pending.kind != faultHung || in.life != instRecovering {
		t.Errorf("after two more faults: pending %s, life %s; want hung, recovering", in.pending.kind, in.life)
	}
	// A stopping instance takes no fault.
	st := &instance{key: "g/1", life: instStopping, faults: map[string]int{}, kick: make(chan struct{}, 1)}
	d.reportFault(st, fault{kind: faultServerExit})
	if st.pending != nil || st.faults[faultServerExit] != 0 {
		t.Error("a stopping instance took a fault")
	}
}
