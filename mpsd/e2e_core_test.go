package mpsd

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/mps"
)

// A device-level Xid makes the recovery shut the instance's servers down
// itself. The exit of such a server is no fault: seen only after the
// instance had reopened and granted the requeued lease again (as under
// load), it was taken for a crash of the new attempt's server, which
// revoked that attempt moments after its grant (what a launcher still
// reaping the first attempt's command reported as "requeued without a
// revocation"). The test holds the old server's exit back until the next
// attempt runs (the recovery waits a bounded time for it), then lets it
// through and checks, once it is handled (the server is gone from the
// status), that the Xid was the only fault and the lease still runs.
func TestServerShutDownAfterXidIsNoFault(t *testing.T) {
	e := newEnvGPUs(t, 1, `  a:
    users: [root]
    memory: 20G
    requeue_attempts: 10
`, `watchdog:
  probe_interval: 250ms
  probe_timeout: 200ms
  probe_failures: 2
  backoff_initial: 50ms
  backoff_max: 1s
  quarantine_after: 100
  quarantine_window: 1m`)
	faults := make(chan fault, 64)
	var hold sync.Map // server pid → chan struct{} its exit waits on
	e.opts.eventHook = func(in *instance, ev mps.Event) {
		if ev.Kind != mps.ServerExited {
			return
		}
		if ch, ok := hold.Load(ev.PID); ok {
			select {
			case <-ch.(chan struct{}):
			case <-time.After(waitFor):
			}
		}
	}
	e.opts.faultHook = func(in *instance, f fault) {
		select {
		case faults <- f:
		default:
		}
	}
	e.start()
	sim := e.sim
	select {
	case <-sim.XidWatched():
	case <-time.After(waitFor):
		t.Fatal("mpsd does not watch Xid events")
	}
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch("--group", "a", "--sm", "30", "--mem", "1G", "--", client, "--duration", "60s"))
	connected := func(attempt int) func(api.Status) bool {
		return func(st api.Status) bool {
			in := instanceOf(st, "a", 0)
			return len(st.Leases) == 1 && st.Leases[0].State == api.LeaseRunning && st.Leases[0].Attempt == attempt &&
				in.State == api.InstanceReady && len(in.ServerPIDs) == 1 && e.mpsClients(in) == 1
		}
	}
	st := e.waitStatus("the client connected to its server", connected(1))
	for round := 1; round <= 3; round++ {
		old := instanceOf(st, "a", 0).ServerPIDs[0]
		release := make(chan struct{})
		hold.Store(old, release)
		if err := sim.InjectXid(0, 79, 0); err != nil {
			t.Fatal(err)
		}
		e.waitStatus("the next attempt granted", func(st api.Status) bool {
			return len(st.Leases) == 1 && st.Leases[0].State == api.LeaseRunning && st.Leases[0].Attempt == round+1
		})
		close(release)
		st = e.waitStatus("the next attempt connected to a new server", func(st api.Status) bool {
			return connected(round+1)(st) && !slices.Contains(instanceOf(st, "a", 0).ServerPIDs, old)
		})
		var kinds []string
		for len(faults) > 0 {
			kinds = append(kinds, (<-faults).kind)
		}
		if !slices.Equal(kinds, []string{faultXid}) {
			t.Fatalf("round %d: faults %v, want the Xid only (the old server's exit was taken for a fault)", round, kinds)
		}
		if in := instanceOf(st, "a", 0); in.Restarts != round {
			t.Fatalf("round %d: %d restarts, want %d", round, in.Restarts, round)
		}
	}
	_ = p.cmd.Process.Kill()
	p.waitQuiet(waitFor)
}

// An error of Run after it has started goroutines (here: the metrics
// address is taken) goes through the stop sequence: Run returns it only
// once every goroutine it started has ended, and starts nothing more.
func TestRunErrorAfterStartStops(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	e := newEnv(t, oneGroup, "")
	b, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "metrics:\n  listen: \"\"", "metrics:\n  listen: "+taken.Addr().String(), 1)
	if cfg == string(b) {
		t.Fatal("the test config has no metrics.listen to set")
	}
	if err := os.WriteFile(e.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(e.opts)
	if err != nil {
		t.Fatalf("mpsd.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(waitFor):
		t.Fatalf("Run did not return within %s with the metrics address taken", waitFor)
	}
	if err == nil || !strings.Contains(err.Error(), "metrics listener") {
		t.Fatalf("Run: %v, want the metrics listener's error", err)
	}
	if d.ctx.Err() == nil {
		t.Error("Run returned with its goroutines' context still live")
	}
	if d.spawn(func() {}) {
		t.Error("Run returned without its final wait: it would still start goroutines")
	}
}

// An operator's requeue goes through the one revocation sequence: the
// state file records the lease as revoking before its processes are
// killed (as a fault's revocation does), so an mpsd that dies in between
// leaves the next one a revocation to finish, not a lease to re-adopt.
func TestAdminRequeueRecordsRevokingFirst(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	s := &stuckKills{}
	s.target.Store("")
	saved := make(chan savedLease, 1)
	s.check = func(bool) {
		st, err := decodeState(e.stateBytes())
		if err != nil {
			return
		}
		for _, sl := range st.Leases {
			if sl.ID == s.target.Load() {
				select {
				case saved <- sl:
				default:
				}
			}
		}
	}
	e.opts.wrapCgroups = func(m cgroup.Manager) cgroup.Manager { s.Manager = m; return s }
	e.start()
	gate, open := e.gate("a")
	p := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gate...)...))
	st := e.waitStatus("the lease running", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	id := st.Leases[0].ID
	s.target.Store(id)
	e.admin(t, "requeue", id)
	select {
	case sl := <-saved:
		if !sl.Revoking || sl.Instance == "" || sl.Attempt != 1 {
			t.Errorf("state file when the requeue's kill ran: %+v; want the lease on its instance, attempt 1, revoking", sl)
		}
	case <-time.After(waitFor):
		t.Fatal("the requeue killed nothing, or the state file did not name the lease")
	}
	e.waitStatus("the lease running again", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && st.Leases[0].Attempt == 2
	})
	open()
	if r := p.wait(t); r.code != 0 || !strings.Contains(r.stderr, "administrator requeued") {
		t.Fatalf("launcher: exit %d, stderr %q; want 0 after the requeue", r.code, r.stderr)
	}
}
