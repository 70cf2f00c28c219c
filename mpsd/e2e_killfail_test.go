package mpsd

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
)

// stuckKills is a cgroup manager whose leases' Kill fails, without
// touching the processes, while fail is set for the lease named target:
// a lease whose processes would not die.
type stuckKills struct {
	cgroup.Manager
	target atomic.Value // lease id
	fail   atomic.Bool
	failed atomic.Int64
	// check runs at every Kill of the target, failing or not.
	check func(failing bool)
}

func (s *stuckKills) wrap(l cgroup.Lease, err error) (cgroup.Lease, error) {
	if err != nil {
		return nil, err
	}
	return stuckLease{Lease: l, s: s}, nil
}

func (s *stuckKills) Create(id cgroup.LeaseID, lim cgroup.Limits) (cgroup.Lease, error) {
	return s.wrap(s.Manager.Create(id, lim))
}

func (s *stuckKills) Open(id cgroup.LeaseID) (cgroup.Lease, error) {
	return s.wrap(s.Manager.Open(id))
}

type stuckLease struct {
	cgroup.Lease
	s *stuckKills
}

var errStuck = errors.New("test: processes would not die")

func (l stuckLease) Kill(ctx context.Context) error {
	if l.s.target.Load() == l.ID().Lease {
		failing := l.s.fail.Load()
		l.s.check(failing)
		if failing {
			l.s.failed.Add(1)
			return errStuck
		}
	}
	return l.Lease.Kill(ctx)
}

func gather(t *testing.T, e *testEnv) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := e.d.metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// A revocation whose kill fails keeps the lease on its instance with its
// capacity, so a lease that needs that capacity waits; the kill is retried
// with backoff, counted and shown as stuck, and only once it succeeds is
// the lease requeued and the capacity handed on.
func TestRevokeKillFailureHoldsCapacity(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	s := &stuckKills{}
	s.target.Store("")
	var mu sync.Mutex
	var bad []string
	s.check = func(failing bool) {
		// Called inside Kill: until the first attempt's kill has
		// succeeded, the lease is still held and not requeued.
		e.d.mu.Lock()
		defer e.d.mu.Unlock()
		for _, l := range e.d.leases {
			if l.id == s.target.Load() && ((l.attempt == 1 && l.inst == nil) || (failing && l.attempt != 1)) {
				mu.Lock()
				bad = append(bad, "lease left its instance (or was requeued) before its kill succeeded")
				mu.Unlock()
			}
		}
	}
	e.opts.wrapCgroups = func(m cgroup.Manager) cgroup.Manager { s.Manager = m; return s }
	e.opts.killRetryInitial = 100e6 // 100ms
	e.start()

	gateA, openA := e.gate("a")
	pa := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "12G", "--"}, gateA...)...))
	st := e.waitStatus("lease a running", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	a := st.Leases[0]
	s.target.Store(a.ID)
	s.fail.Store(true)

	e.d.mu.Lock()
	var in *instance
	for _, i := range e.d.instances {
		in = i
	}
	e.d.mu.Unlock()
	e.d.reportFault(in, fault{kind: faultAdmin, admin: true, restart: restartNone, reason: "test revocation"})

	e.waitStatus("the kill failed and was retried", func(api.Status) bool { return s.failed.Load() >= 3 })
	pb := startProc(t, e.launch("--sm", "10", "--mem", "12G", "--", "/bin/true"))
	st = e.waitStatus("lease b queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })
	for _, l := range st.Leases {
		if l.ID == a.ID && (l.State != api.LeaseRunning || l.Attempt != 1) {
			t.Fatalf("lease a %+v while its kill fails: want it running, attempt 1", l)
		}
	}
	if got := st.Instances[0].MemAllocatedBytes; got != 12<<30 {
		t.Fatalf("instance holds %d bytes while lease a's kill fails, want lease a's 12G", got)
	}
	for _, pid := range gateShells(t, a.PIDs) {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("lease a's pid %d: %v; the test's kill failure should have left it running", pid, err)
		}
	}
	fams := gather(t, e)
	if v, _ := value(fams, "mpsd_leases_kill_stuck", nil); v != 1 {
		t.Errorf("mpsd_leases_kill_stuck = %v, want 1", v)
	}
	if v, _ := value(fams, "mpsd_cgroup_kill_failures_total", map[string]string{"group": "inference"}); v < 3 {
		t.Errorf("mpsd_cgroup_kill_failures_total = %v, want >= 3", v)
	}

	s.fail.Store(false)
	e.waitStatus("lease a requeued", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.ID == a.ID && l.Attempt == 2 {
				return true
			}
		}
		return false
	})
	for _, pid := range a.PIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("lease a's first-attempt pid %d after the requeue: %v, want it gone", pid, err)
		}
	}
	if v, _ := value(gather(t, e), "mpsd_leases_kill_stuck", nil); v != 0 {
		t.Errorf("mpsd_leases_kill_stuck after the kill succeeded = %v, want 0", v)
	}
	openA()
	if r := pa.wait(t); r.code != 0 {
		t.Errorf("lease a's launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := pb.wait(t); r.code != 0 {
		t.Errorf("lease b's launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
}

// A lease whose launcher is gone and whose kill fails keeps its capacity
// (the next lease waits) until a retried kill succeeds; then it is
// released and the next lease runs.
func TestReleaseKillFailureRetried(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	s := &stuckKills{check: func(bool) {}}
	s.target.Store("")
	e.opts.wrapCgroups = func(m cgroup.Manager) cgroup.Manager { s.Manager = m; return s }
	e.opts.killRetryInitial = 100e6 // 100ms
	e.start()

	gateA, _ := e.gate("a")
	pa := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "12G", "--"}, gateA...)...))
	// The command itself runs (the trampoline became the shell): a
	// trampoline whose launcher dies before releasing it exits, its
	// cgroup empties, and the release has nothing to kill.
	st := e.waitStatus("lease a's command running", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(shellPIDs(st)) > 0
	})
	a := st.Leases[0]
	s.target.Store(a.ID)
	s.fail.Store(true)
	_ = pa.cmd.Process.Kill() // the launcher goes; mpsd releases the lease
	e.waitStatus("the release's kill failed and was retried", func(api.Status) bool { return s.failed.Load() >= 3 })

	pb := startProc(t, e.launch("--sm", "10", "--mem", "12G", "--", "/bin/true"))
	st = e.waitStatus("lease b queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })
	if got := st.Instances[0].MemAllocatedBytes; got != 12<<30 {
		t.Fatalf("instance holds %d bytes while lease a's kill fails, want lease a's 12G", got)
	}
	for _, pid := range gateShells(t, a.PIDs) {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("lease a's pid %d: %v; the test's kill failure should have left it running", pid, err)
		}
	}
	if v, _ := value(gather(t, e), "mpsd_leases_kill_stuck", nil); v != 1 {
		t.Errorf("mpsd_leases_kill_stuck = %v, want 1", v)
	}

	s.fail.Store(false)
	if r := pb.wait(t); r.code != 0 {
		t.Fatalf("lease b's launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, pid := range a.PIDs {
		// Its parent, the launcher, is gone: it may linger as a zombie.
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
			t.Errorf("lease a's pid %d still runs after the release: %s", pid, b)
		}
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}
