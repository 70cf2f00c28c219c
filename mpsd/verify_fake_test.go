package mpsd

import (
	"testing"
	"time"

	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/mps"
)

// An Xid that took the instance down covers the fault records of the
// servers it took down, not those of a server started after it. Alice's
// server (uid 1000) runs when a device Xid takes the instance down; its
// fault record that follows is the Xid's fault. Bob's server (uid 1001)
// starts after it, and its client faults within the Xid's evidence
// window: that record is a fault of its own and waits for its own Xid
// (a claim), not dropped as the first Xid's (the chaos soak met a
// culprit's fault dropped so, its leases released as if their commands
// had ended by themselves).
func TestXidCoversOnlyTheServersItTookDown(t *testing.T) {
	d, in, clk, dm := fakeUp(t, t.Context())
	const alice, bob = 100, 200
	dm.events <- mps.Event{Kind: mps.ServerStarted, PID: alice, UID: 1000, Time: clk.Now(), ExitStatus: -1, Source: mps.SourcePidfd}
	waitCond(t, "alice's server known", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := in.mps.servers[alice]
		return ok
	}, nil)
	d.xidConfirms(gpu.XidEvent{GPU: 0, UUID: "GPU-fake-0", Xid: 79, Level: gpu.LevelDevice, Time: clk.Now()}, map[*instance]bool{in: true})
	clk.Advance(time.Second)
	dm.events <- mps.Event{Kind: mps.ServerStarted, PID: bob, UID: 1001, Time: clk.Now(), ExitStatus: -1, Source: mps.SourcePidfd}
	dm.events <- mps.Event{Kind: mps.ServerFault, PID: alice, UID: -1, Time: clk.Now(), ExitStatus: -1, KnownServer: true}
	dm.events <- mps.Event{Kind: mps.ServerFault, PID: bob, UID: -1, Time: clk.Now(), ExitStatus: -1, KnownServer: true}
	// Events are handled in order: once a later one is, both records are.
	const later = 300
	dm.events <- mps.Event{Kind: mps.ServerStarted, PID: later, UID: 1001, Time: clk.Now(), ExitStatus: -1, Source: mps.SourcePidfd}
	waitCond(t, "the records handled", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := in.mps.servers[later]
		return ok
	}, nil)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(in.claims) != 1 || in.claims[0].ev.PID != bob {
		var pids []int
		for _, c := range in.claims {
			pids = append(pids, c.ev.PID)
		}
		t.Fatalf("claims for servers %v; want one, bob's (%d): alice's record is the Xid's fault", pids, bob)
	}
}
