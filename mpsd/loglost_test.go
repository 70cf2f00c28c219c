package mpsd

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/mpsd/mpsd/policy"
)

// A daemon that died of its lost log charges nobody: its victims are all
// spared and the instance counts no failure, however often it happens; a
// charged fault handled with it is counted as before.
func TestUnchargedFaultChargesNobody(t *testing.T) {
	wd := policy.WatchdogConfig{QuarantineAfter: 2, QuarantineWindow: time.Minute}
	mk := func() *instance {
		in := &instance{log: slog.New(slog.NewTextHandler(io.Discard, nil)), leases: map[string]*lease{}}
		for i, id := range []string{"alice", "bob"} {
			in.leases[id] = &lease{id: id, uid: uint32(64001 + i), state: leaseRunning, req: policy.Request{Seq: uint64(i + 1)}}
		}
		return in
	}
	died := fault{kind: faultDaemonExit, restart: restartDaemon, uncharged: true, reason: "died of its lost log"}
	in := mk()
	now := time.Now()
	for i := range 3 {
		plan := in.planRecoveryLocked([]fault{died}, died, now.Add(time.Duration(i)*time.Second), wd)
		if len(plan.victims) != 2 || !plan.spared["alice"] || !plan.spared["bob"] {
			t.Fatalf("round %d: victims %v, spared %v; want both, both spared", i, simIDs(plan.victims), plan.spared)
		}
		if plan.quarantined || in.holds.quarantined || len(in.failures) != 0 || len(plan.barred) != 0 {
			t.Fatalf("round %d: quarantined %v, failures %d, barred %v; want nothing counted", i, in.holds.quarantined, len(in.failures), plan.barred)
		}
	}
	in = mk()
	crash := fault{kind: faultServerExit, restart: restartNone, reason: "server died"}
	plan := in.planRecoveryLocked([]fault{died, crash}, combineFaults([]fault{died, crash}), now, wd)
	if len(plan.spared) != 0 || len(in.failures) != 1 {
		t.Fatalf("with a charged fault: spared %v, failures %d; want none spared and the failure counted", plan.spared, len(in.failures))
	}
}
