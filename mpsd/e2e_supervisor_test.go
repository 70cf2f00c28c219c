package mpsd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Faults pending together are one recovery that takes every fault's own
// victims and tells each its own fault's reason: a fault limited to some
// leases does not hide another's, whatever order they came in.
func TestPendingFaultsKeepTheirVictims(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	e.start()
	gateA, openA := e.gate("a")
	gateB, openB := e.gate("b")
	gateC, openC := e.gate("c")
	pa := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateA...)...))
	pb := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateB...)...))
	pc := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateC...)...))
	e.waitStatus("three leases running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 3 })
	// a and b are named by a fault each; c by none.
	var a, b, c string
	e.d.mu.Lock()
	var in *instance
	for _, i := range e.d.instances {
		in = i
	}
	for _, l := range in.leases {
		switch cmd := strings.Join(l.command, " "); {
		case strings.Contains(cmd, "gate-a"):
			a = l.id
		case strings.Contains(cmd, "gate-b"):
			b = l.id
		case strings.Contains(cmd, "gate-c"):
			c = l.id
		}
	}
	if a == "" || b == "" || c == "" {
		e.d.mu.Unlock()
		t.Fatalf("leases a %q b %q c %q: not told apart by their commands", a, b, c)
	}
	// Both reported before the supervisor looks, as when they come
	// during a bring-up or another recovery.
	in.pending = append(in.pending,
		fault{kind: faultServerFault, leases: []string{a}, reason: "fault record naming a"},
		fault{kind: faultServerFault, leases: []string{b}, reason: "fault record naming b"})
	if _, err := in.step(instEvFault, "test"); err != nil {
		e.d.mu.Unlock()
		t.Fatal(err)
	}
	in.kickLocked()
	e.d.mu.Unlock()

	e.waitStatus("a and b requeued and running again", func(st api.Status) bool {
		n := 0
		for _, l := range st.Leases {
			if (l.ID == a || l.ID == b) && l.Attempt == 2 && l.State == api.LeaseRunning {
				n++
			}
		}
		return n == 2
	})
	openA()
	openB()
	openC()
	ra, rb, rc := pa.wait(t), pb.wait(t), pc.wait(t)
	for _, tc := range []struct {
		name string
		r    result
		want string
	}{
		{"a", ra, "(fault record naming a); requeued, attempt 2"},
		{"b", rb, "(fault record naming b); requeued, attempt 2"},
	} {
		if tc.r.code != 0 || !strings.Contains(tc.r.stderr, tc.want) {
			t.Errorf("lease %s's launcher: exit %d, stderr %q; want exit 0 and %q", tc.name, tc.r.code, tc.r.stderr, tc.want)
		}
	}
	if rc.code != 0 || strings.Contains(rc.stderr, "revoked") {
		t.Errorf("lease c, named by no fault: exit %d, stderr %q; want it untouched", rc.code, rc.stderr)
	}
}

// A revocation's event can reach the launcher later than its RevokeGrace
// (mpsd sends it once the revocation is recorded, and a state write on a
// loaded disk can take longer): the launcher whose command died of the
// fault asks for its release, mpsd refuses it because the lease is being
// revoked, and the launcher waits for the revocation and runs the
// requeued attempt instead of exiting with the command's failure.
func TestRevocationSlowerThanTheGrace(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	write := newHold(t)
	e.opts.writeHook = write.wait
	e.start()
	gate, open := e.gate("a")
	script := `[ "$MPSD_ATTEMPT" = 2 ] && exit 0; ` + strings.Join(gate[2:], " ") + `; exit 86`
	p := startProc(t, e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script))
	st := e.waitStatus("lease running", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	id := st.Leases[0].ID

	write.on.Store(true)
	e.d.mu.Lock()
	var in *instance
	for _, i := range e.d.instances {
		in = i
	}
	e.d.mu.Unlock()
	e.d.reportFault(in, fault{kind: faultAdmin, admin: true, restart: restartNone, reason: "test revocation"})
	write.waitReached(t, "no state write after the fault")
	// The command dies while the revocation's write is held: its
	// launcher's grace passes without a revoked event.
	open()
	e.waitLogLine("release refused: the lease is being revoked", id)
	write.open()

	r := p.wait(t)
	if r.code != 0 || !strings.Contains(r.stderr, "(test revocation); requeued, attempt 2") {
		t.Errorf("launcher: exit %d, stderr %q; want the requeued attempt's 0", r.code, r.stderr)
	}
}

// A release names the attempt whose command ended: one that comes after
// that attempt was revoked and requeued (its launcher's verdict raced the
// revoked event) releases nothing and is answered revoking, so the
// requeued run is neither dropped nor killed; an attempt the lease never
// reached is a conflict.
func TestReleaseNamesItsAttempt(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	e.start()
	c := leaseClient(e.socket)
	defer c.CloseIdleConnections()
	h, l, _, err := grantLease(c, `{"sm":10,"mem_bytes":1073741824}`)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	e.admin(t, "requeue", l.ID)
	e.waitStatus("the lease running its second attempt", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].Attempt == 2 && st.Leases[0].State == api.LeaseRunning
	})
	release := func(attempt int) api.ErrorCode {
		t.Helper()
		body := fmt.Sprintf(`{"attempt":%d}`, attempt)
		resp, err := c.Post("http://mpsd"+api.ReleasePath(l.ID), api.ContentTypeJSON, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return ""
		}
		var ae *api.Error
		if !errors.As(api.DecodeError(resp.StatusCode, resp.Body), &ae) {
			t.Fatalf("release of attempt %d: status %d without an error document", attempt, resp.StatusCode)
		}
		return ae.Code
	}
	if code := release(1); code != api.CodeRevoking {
		t.Errorf("release of the revoked attempt 1: %q, want %q", code, api.CodeRevoking)
	}
	if code := release(3); code != api.CodeConflict {
		t.Errorf("release of attempt 3, never reached: %q, want %q", code, api.CodeConflict)
	}
	st := e.waitStatus("the lease still running", func(st api.Status) bool { return len(st.Leases) == 1 })
	if st.Leases[0].Attempt != 2 || st.Leases[0].State != api.LeaseRunning {
		t.Fatalf("lease after the refused releases: %+v", st.Leases[0])
	}
	if code := release(2); code != "" {
		t.Errorf("release of the running attempt 2: %q, want it done", code)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A release that comes while a fault record naming its lease has just been
// confirmed by an Xid, and is being reported, waits for the report: the
// record is no longer among the claims waiting for an Xid, and its fault
// is not pending yet, so a look at either alone would release the lease
// as "its command ended" although the fault killed the command. It is
// answered revoking, and the launcher runs the requeued attempt.
func TestReleaseWhileARecordIsConfirmed(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	report := newHold(t)
	e.opts.faultHook = func(_ *instance, f fault) {
		if f.kind == faultServerFault {
			report.wait()
		}
	}
	e.start()
	forge := e.buildTestProgram("mpsforge")
	client := filepath.Join(e.emu, "mpsemu-client")
	script := `[ "$MPSD_ATTEMPT" = 2 ] && exit 0; exec "$0" --duration 1m`
	p := startProc(t, e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script, client))
	st := e.waitStatus("a client on a live MPS server", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Instances) == 1 && len(st.Instances[0].ServerPIDs) > 0
	})
	id, inst := st.Leases[0].ID, st.Instances[0]
	fifo := filepath.Join(e.dir, "run", "inference", inst.GPUUUID, "pipe", "log")
	e.forge(forge, 0, fifo, "server", inst.ServerPIDs[0], "Server is handling a fatal GPU error.")
	e.waitLogLine("MPS fault record waits for an Xid to confirm it")

	// The Xid confirms the record; its report is held before the fault
	// is pending.
	report.on.Store(true)
	if err := e.sim.InjectXid(0, 13, 0); err != nil {
		t.Fatal(err)
	}
	report.waitReached(t, "the confirmed record was not reported")
	c := leaseClient(e.socket)
	defer c.CloseIdleConnections()
	answered := make(chan api.ErrorCode, 1)
	go func() {
		resp, err := c.Post("http://mpsd"+api.ReleasePath(id), api.ContentTypeJSON, strings.NewReader(`{"attempt":1}`))
		if err != nil {
			answered <- api.ErrorCode("request failed: " + err.Error())
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			answered <- ""
			return
		}
		var ae *api.Error
		if errors.As(api.DecodeError(resp.StatusCode, resp.Body), &ae) {
			answered <- ae.Code
			return
		}
		answered <- api.ErrorCode(fmt.Sprintf("status %d", resp.StatusCode))
	}()
	// Answered at once, it would have looked at nothing: it must wait.
	select {
	case code := <-answered:
		t.Fatalf("the release was answered %q while the confirmed record was being reported; want it held", code)
	case <-time.After(300 * time.Millisecond):
	}
	report.open()
	select {
	case code := <-answered:
		if code != api.CodeRevoking {
			t.Errorf("release after the report: %q, want %q", code, api.CodeRevoking)
		}
	case <-time.After(waitFor):
		t.Fatal("the release was not answered after the report")
	}
	r := p.wait(t)
	if r.code != 0 || !strings.Contains(r.stderr, "requeued, attempt 2") {
		t.Errorf("launcher: exit %d, stderr %q; want the requeued attempt's 0", r.code, r.stderr)
	}
}

// errnoRunner fails every control command with errno while fail is set.
type errnoRunner struct {
	errno syscall.Errno
	fail  atomic.Bool
}

func (r *errnoRunner) Start(cmd *exec.Cmd) error {
	if r.fail.Load() {
		return &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: r.errno}
	}
	return cmd.Start()
}

// hold lets a test's hook stop mpsd at one point: while on, wait tells
// reached and blocks until open (or waitFor).
type hold struct {
	on      atomic.Bool
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHold(t *testing.T) *hold {
	h := &hold{reached: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(h.open)
	return h
}

func (h *hold) wait() {
	if !h.on.Load() {
		return
	}
	select {
	case h.reached <- struct{}{}:
	default:
	}
	select {
	case <-h.release:
	case <-time.After(waitFor):
	}
}

// waitReached waits until a hook is held, failing with what otherwise.
func (h *hold) waitReached(t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.reached:
	case <-time.After(waitFor):
		t.Fatal(what)
	}
}

func (h *hold) open() {
	h.on.Store(false)
	h.once.Do(func() { close(h.release) })
}

// startServing is start for an mpsd that will not be ready (an instance
// cannot come up): it returns once the API is served.
func (e *testEnv) startServing() {
	e.t.Helper()
	if e.sim != nil && e.d != nil {
		e.simulate()
	}
	d, err := New(e.opts)
	if err != nil {
		e.t.Fatalf("mpsd.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.d, e.cancel, e.done = d, cancel, make(chan error, 1)
	go func() { e.done <- d.Run(ctx) }()
	deadline := time.Now().Add(waitFor)
	for !d.serving.Load() {
		select {
		case err := <-e.done:
			e.cancel = nil
			e.t.Fatalf("mpsd stopped before it served: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("mpsd not serving after %s", waitFor)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Leases on an instance that has no control daemon (mpsd came back to
// find its daemon gone, or cannot adopt it, and no start succeeds) are
// revoked as soon as a fault names them: the daemon found gone is that
// fault itself; an Xid is one while the daemon is there but not adopted.
// The recovery that would revoke them runs only once a daemon is up,
// which may be never, and their launchers would wait for it. The lease is
// requeued, and runs again once a daemon is back.
func TestFaultWithoutADaemonRevokesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name       string
		killDaemon bool          // the daemon dies while mpsd is away
		errno      syscall.Errno // every control command fails with it once mpsd is back
		xid        uint64        // raised once mpsd is back, when not 0
		why        string        // in the revocation's reason
	}{
		// The control binary cannot be run (EACCES): no new daemon.
		{"the daemon found gone", true, syscall.EACCES, 0, "was gone or hung when mpsd started, and no new one starts"},
		// mpsd out of descriptors: the live daemon is not adopted, and
		// nothing is revoked for that alone.
		{"an Xid while the daemon is not adopted", false, syscall.EMFILE, 79, "Xid 79"},
		// mpsd out of descriptors while the daemon is gone: its starts
		// say nothing of MPS, and the leases are revoked only once a new
		// daemon runs ("" below).
		{"mpsd out of descriptors", true, syscall.EMFILE, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvGPUs(t, 1, oneGroup, "watchdog:\n  backoff_initial: 50ms\n  backoff_max: 200ms\n")
			runner := &errnoRunner{errno: tc.errno}
			e.opts.mpsRunner = runner
			e.start()
			gate, open := e.gate("a")
			defer open()
			script := `[ "$MPSD_ATTEMPT" = 2 ] && exit 0; ` + strings.Join(gate[2:], " ") + `; exit 1`
			p := startProc(t, e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script))
			st := e.waitStatus("lease running", func(st api.Status) bool {
				return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
			})
			id, daemon := st.Leases[0].ID, st.Instances[0].DaemonPID

			// mpsd stops (the lease runs on); no control command works
			// when it is back, so no daemon is adopted or started.
			e.stop()
			if tc.killDaemon {
				if err := syscall.Kill(daemon, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				emutest.WaitGone(daemon)
			}
			runner.fail.Store(true)
			e.startServing()
			e.waitLogLine("instance start failed")
			if tc.xid != 0 {
				if st := e.d.Status(); countLeases(st, api.LeaseRunning) != 1 {
					t.Fatalf("leases after the restart: %+v; want the one running", st.Leases)
				}
				if err := e.sim.InjectXid(0, tc.xid, 0); err != nil {
					t.Fatal(err)
				}
			}
			if tc.why == "" {
				// Nothing is revoked while mpsd cannot tell: several
				// failed starts later, the lease still runs.
				e.waitLogLine("instance start failed", "attempt=3")
				if st := e.d.Status(); countLeases(st, api.LeaseRunning) != 1 {
					t.Fatalf("leases while mpsd is out of descriptors: %+v; want the one running", st.Leases)
				}
				runner.fail.Store(false)
				e.waitLogLine("lease revoked", id, "was gone or hung when mpsd started; a new one runs")
			} else {
				// Revoked while no daemon can start, and requeued to wait
				// for one.
				e.waitLogLine("lease revoked", id, tc.why)
				e.waitStatus("the lease requeued", func(st api.Status) bool {
					return len(st.Leases) == 1 && st.Leases[0].Attempt == 2 && st.Leases[0].State == api.LeaseQueued
				})
				runner.fail.Store(false)
			}
			r := p.wait(t)
			if r.code != 0 || !strings.Contains(r.stderr, "requeued, attempt 2") {
				t.Errorf("launcher: exit %d, stderr %q; want the requeued attempt's 0", r.code, r.stderr)
			}
		})
	}
}
