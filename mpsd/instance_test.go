package mpsd

import (
	"errors"
	"testing"

	"github.com/mpsd/mpsd/mps"

	"github.com/mpsd/mpsd/policy"
)

// TestInstanceStep covers every (lifecycle, event) pair of the
// instance's table: the legal ones give their next lifecycle and effects,
// every other one errIllegalTransition and leaves it as it was.
func TestInstanceStep(t *testing.T) {
	type result struct {
		next lifecycle
		eff  instEffects
	}
	legal := map[[2]uint8]result{
		{uint8(instStarting), uint8(instEvUp)}:          {instUp, effSchedule},
		{uint8(instStarting), uint8(instEvFault)}:       {instRecovering, effRevoke},
		{uint8(instUp), uint8(instEvFault)}:             {instRecovering, effRevoke},
		{uint8(instUp), uint8(instEvStop)}:              {instStopping, effStopDaemon},
		{uint8(instRecovering), uint8(instEvRecovered)}: {instUp, effSchedule},
		{uint8(instStopping), uint8(instEvRestart)}:     {instStarting, effBringUp},
		{uint8(instStopping), uint8(instEvGone)}:        {instStopped, 0},
		{uint8(instStarting), uint8(instEvGone)}:        {instStopped, 0},
	}
	pairs := 0
	for c := instStarting; c <= instStopped; c++ {
		for ev := instEvent(0); ev < numInstEvents; ev++ {
			pairs++
			next, eff, err := instanceStep(c, ev)
			want, ok := legal[[2]uint8{uint8(c), uint8(ev)}]
			switch {
			case ok && err != nil:
				t.Errorf("%s on %s: %v, want %s", c, ev, err, want.next)
			case ok && (next != want.next || eff != want.eff):
				t.Errorf("%s on %s = %s (effects %b), want %s (effects %b)", c, ev, next, eff, want.next, want.eff)
			case !ok && !errors.Is(err, errIllegalTransition):
				t.Errorf("%s on %s = %s, want errIllegalTransition", c, ev, next)
			case !ok && (next != c || eff != 0):
				t.Errorf("%s on %s (illegal) = %s (effects %b), want it unchanged and no effects", c, ev, next, eff)
			}
		}
	}
	if pairs != 5*6 {
		t.Fatalf("covered %d pairs, want 30: a lifecycle or event was added without its rows", pairs)
	}
	// Stopped is final; nothing but a recovery's end leaves recovering.
	for ev := instEvent(0); ev < numInstEvents; ev++ {
		if _, _, err := instanceStep(instStopped, ev); err == nil {
			t.Errorf("stopped on %s is legal; stopped must be final", ev)
		}
	}
	for _, c := range []lifecycle{instStarting, instUp, instRecovering, instStopping, instStopped, 9} {
		if c.String() == "" {
			t.Errorf("lifecycle %d has no name", c)
		}
	}
}

// TestInstanceStepReports checks that instance.step refuses an illegal
// event, leaves the instance as it was and reports it.
func TestInstanceStepReports(t *testing.T) {
	var got []error
	saved := illegalTransition
	illegalTransition = func(err error) { got = append(got, err) }
	defer func() { illegalTransition = saved }()
	in := &instance{key: "g/0"}
	if _, err := in.step(instEvRecovered, "test"); !errors.Is(err, errIllegalTransition) {
		t.Fatalf("recovered while starting: %v, want errIllegalTransition", err)
	}
	if in.life != instStarting || len(got) != 1 {
		t.Fatalf("lifecycle %s, %d reports; want starting and 1", in.life, len(got))
	}
}

// TestPlacementState is the one derivation of what placement sees: every
// hold closes an instance whatever its lifecycle (quarantine first), and
// only an up instance without holds is ready.
func TestPlacementState(t *testing.T) {
	open := map[lifecycle][2]policy.InstanceState{ // restarts 0, restarts > 0
		instStarting:   {policy.InstanceStarting, policy.InstanceRecovering},
		instUp:         {policy.InstanceReady, policy.InstanceReady},
		instRecovering: {policy.InstanceRecovering, policy.InstanceRecovering},
		instStopping:   {policy.InstanceStarting, policy.InstanceRecovering},
		instStopped:    {policy.InstanceStarting, policy.InstanceRecovering},
	}
	for c := instStarting; c <= instStopped; c++ {
		for mask := range 16 {
			h := holds{drained: mask&1 != 0, quarantined: mask&2 != 0, retiring: mask&4 != 0, restartPending: mask&8 != 0}
			for i, restarts := range []int{0, 3} {
				want := open[c][i]
				switch {
				case h.quarantined:
					want = policy.InstanceQuarantined
				case mask != 0:
					want = policy.InstanceDraining
				}
				if got := placementState(c, h, restarts); got != want {
					t.Errorf("%s with holds %+v, %d restarts: %s, want %s", c, h, restarts, got, want)
				}
			}
		}
	}
}

// TestServerShutDownByRecoveryIsNoFault is the server side of a launcher
// ending with "protocol violation: requeued without a revocation": a
// recovery after a device Xid shuts the instance's servers down itself,
// but their exits are seen asynchronously. The instance used to reopen at
// once, grant a requeued lease of the same uid, and then take the late
// exit of the old server for a crash of the new lease's server, revoking
// the new attempt moments after its grant. A launcher still reaping the
// previous attempt's command held that grant, and the second revocation
// it saw was then forgotten when it launched the held grant. A server the
// recovery shut down counts no clients, whatever was granted since;
// another server's exit still counts them.
func TestServerShutDownByRecoveryIsNoFault(t *testing.T) {
	m := newMPSModel()
	m.serverStarted(100, 1000)
	m.serverStarted(200, 1000)
	leases := map[string]*lease{"g-1": {id: "g-1", uid: 1000, state: leaseRunning}}
	done := m.shuttingDown(100)
	if v := m.serverExited(mps.Event{PID: 100, ExitStatus: 0}, leases, false); v.kind != exitShutDown || len(v.candidates) != 0 {
		t.Errorf("exit of a server the recovery shut down: %s with %d candidates, want shut down with none", v.kind, len(v.candidates))
	}
	select {
	case <-done:
	default:
		t.Error("the recovery waiting for the server's exit was not told of it")
	}
	if _, ok := m.shutDown[100]; ok {
		t.Error("the shut-down server is still expected")
	}
	if v := m.serverExited(mps.Event{PID: 200, ExitStatus: -1, Signal: 9}, leases, false); v.kind != exitCrash || len(v.candidates) != 1 {
		t.Errorf("exit of a server nobody shut down: %s with %d candidates, want a crash with its lease", v.kind, len(v.candidates))
	}
	if len(m.servers) != 0 {
		t.Errorf("servers %v after both exits; want none", m.servers)
	}
}
