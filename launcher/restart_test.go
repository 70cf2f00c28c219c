package launcher

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

// The tests of mps-launch across mpsd restarts: requests that mpsd drops
// as it dies, streams that end before their first event, a queued lease
// resumed by id, a command held between its grant and its attach, and the
// exit status of giving up.

func dropName(how apitest.Drop) string {
	if how == apitest.DropReset {
		return "reset"
	}
	return "EOF"
}

// TestRunRetriesDroppedLeaseRequest: a lease request that mpsd resets or
// closes before its answer (it died with the request in flight) is sent
// again, on the first request and on a reconnect alike.
func TestRunRetriesDroppedLeaseRequest(t *testing.T) {
	for _, how := range []apitest.Drop{apitest.DropEOF, apitest.DropReset} {
		t.Run("first request/"+dropName(how), func(t *testing.T) {
			h := newHarness(t, nil)
			h.fake.DropLeases(how, 2)
			done := h.start(t.Context(), "/bin/true")
			h.fake.NextDrop(t)
			h.fake.NextDrop(t)
			lc := h.fake.NextLease(t)
			if lc.Request.ResumeLeaseID != "" {
				t.Errorf("request %+v resumes a lease it never had", lc.Request)
			}
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			if code := h.wait(done); code != 0 {
				t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
			}
			if s := h.read("stderr"); s != "" {
				t.Errorf("stderr %q, want nothing", s)
			}
		})
		t.Run("reconnect/"+dropName(how), func(t *testing.T) {
			h := newHarness(t, nil)
			done := h.start(t.Context(), "/bin/true")
			lc := h.fake.NextLease(t)
			lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 3, LeaseID: "lease-q"})
			h.fake.DropLeases(how, 3)
			lc.End() // mpsd dies; its successor drops the first tries
			for range 3 {
				h.fake.NextDrop(t)
			}
			again := h.fake.NextLease(t)
			if again.Request.ResumeLeaseID != "lease-q" || again.Request.Attempt != 1 {
				t.Errorf("reconnect request %+v, want resume of lease-q attempt 1", again.Request)
			}
			again.MustSend(t, apitest.Granted(again.Request, "lease-q", 1))
			if code := h.wait(done); code != 0 {
				t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
			}
		})
	}
}

// TestRunFirstRequestDroppedThenSocketGone: a first request that mpsd
// dropped proves the socket was there; the socket then missing a while (a
// restarting mpsd without socket activation removes and makes it again)
// is waited out, not taken for no mpsd at all.
func TestRunFirstRequestDroppedThenSocketGone(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.DropLeases(apitest.DropEOF, 1)
	done := h.start(t.Context(), "/bin/true")
	h.fake.NextDrop(t)
	away := h.fake.Socket + ".away"
	if err := os.Rename(h.fake.Socket, away); err != nil {
		t.Fatal(err)
	}
	// The socket is gone for a while: the launcher's tries meet ENOENT.
	select {
	case code := <-done:
		t.Fatalf("exit %d while the socket was away; stderr %s", code, h.read("stderr"))
	case <-time.After(300 * time.Millisecond):
	}
	if err := os.Rename(away, h.fake.Socket); err != nil {
		t.Fatal(err)
	}
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
	}
}

// TestRunRetriesStreamCutBeforeFirstEvent: a stream that ends, cleanly or
// in the middle of its body, before its first event means mpsd is not
// back: the launcher tries again, still as the same lease.
func TestRunRetriesStreamCutBeforeFirstEvent(t *testing.T) {
	h := newHarness(t, nil)
	done := h.start(t.Context(), "/bin/true")
	lc := h.fake.NextLease(t)
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 2, LeaseID: "lease-q"})
	lc.Cut()
	for i, end := range []func(*apitest.LeaseConn){(*apitest.LeaseConn).Cut, (*apitest.LeaseConn).End} {
		again := h.fake.NextLease(t)
		if again.Request.ResumeLeaseID != "lease-q" {
			t.Errorf("reconnect %d: request %+v, want resume of lease-q", i, again.Request)
		}
		end(again)
	}
	last := h.fake.NextLease(t)
	if last.Request.ResumeLeaseID != "lease-q" {
		t.Errorf("last reconnect: request %+v, want resume of lease-q", last.Request)
	}
	last.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, LeaseID: "lease-q"})
	last.MustSend(t, apitest.Granted(last.Request, "lease-q", 1))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
	}
}

// TestRunResumesQueuedLease: a launcher that was queued when mpsd went
// resumes its lease by the id the queued event named, with what is left of
// --wait, so it keeps its place; if mpsd lost the lease (it had not yet
// written it down), it asks anew, saying so.
func TestRunResumesQueuedLease(t *testing.T) {
	t.Run("resumed", func(t *testing.T) {
		h := newHarness(t, nil)
		h.cfg.Wait = time.Hour
		done := h.start(t.Context(), "/bin/true")
		lc := h.fake.NextLease(t)
		lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 7, Group: "g", LeaseID: "lease-q"})
		lc.End()
		again := h.fake.NextLease(t)
		r := again.Request
		if r.ResumeLeaseID != "lease-q" || r.Attempt != 1 {
			t.Errorf("reconnect request %+v, want resume of lease-q attempt 1", r)
		}
		if r.WaitMillis <= 0 || r.WaitMillis >= time.Hour.Milliseconds() {
			t.Errorf("reconnect request waits %d ms, want what is left of the hour", r.WaitMillis)
		}
		again.MustSend(t, api.Event{Type: api.EventQueued, Position: 7, Group: "g", LeaseID: "lease-q"})
		again.MustSend(t, apitest.Granted(again.Request, "lease-q", 1))
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
		}
		// The wait is logged once: the resumed stream's queued event
		// says what the first one said.
		want := regexp.MustCompile(`^mps-launch: queued, position 7 in group g\nmps-launch: granted lease lease-q in group default after waiting \d+s\n$`)
		if s := h.read("stderr"); !want.MatchString(s) {
			t.Errorf("stderr %q, want it to match %q", s, want)
		}
	})
	t.Run("lost", func(t *testing.T) {
		h := newHarness(t, nil)
		done := h.start(t.Context(), "/bin/true")
		lc := h.fake.NextLease(t)
		lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 7, LeaseID: "lease-q"})
		h.fake.RefuseResume("lease-q", api.Error{Code: api.CodeNotFound, Message: "lease lease-q is not known to mpsd (it ended or was lost)"})
		lc.End()
		fresh := h.fake.NextLease(t)
		if fresh.Request.ResumeLeaseID != "" || fresh.Request.Attempt != 0 {
			t.Errorf("request after the loss %+v, want a new one", fresh.Request)
		}
		fresh.MustSend(t, apitest.Granted(fresh.Request, "lease-2", 1))
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
		}
		want := regexp.MustCompile(`^mps-launch: queued, position 7\n` +
			`mps-launch: lease lease-q was lost while mpsd was away; requesting a new one\n` +
			`mps-launch: granted lease lease-2 in group default after waiting \d+s\n$`)
		if got := h.read("stderr"); !want.MatchString(got) {
			t.Errorf("stderr %q, want it to match %q", got, want)
		}
	})
	t.Run("granted while away, revoked on resume", func(t *testing.T) {
		// mpsd granted the queued lease (and saved the grant) but died
		// before telling the launcher; the next mpsd found its server gone
		// and revokes it on the resumed stream. Nothing ran: the launcher
		// waits for the requeue and runs the command once, as attempt 2.
		h := newHarness(t, nil)
		h.cfg.Wait = time.Hour
		done := h.start(t.Context(), h.sh(`echo $MPSD_ATTEMPT >> marker`)...)
		lc := h.fake.NextLease(t)
		lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, Group: "g", LeaseID: "lease-q"})
		lc.End()
		again := h.fake.NextLease(t)
		if again.Request.ResumeLeaseID != "lease-q" {
			t.Fatalf("reconnect request %+v, want resume of lease-q", again.Request)
		}
		again.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "MPS server 7 of group g on GPU 0 died while mpsd was away"})
		again.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
		again.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, Group: "g", LeaseID: "lease-q"})
		again.MustSend(t, apitest.Granted(again.Request, "lease-q", 2))
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
		}
		if got := ranMarker(t, h); got != "2\n" {
			t.Errorf("the command ran as attempts %q, want once as attempt 2", got)
		}
		want := regexp.MustCompile(`^mps-launch: queued, position 1 in group g\n` +
			regexp.QuoteMeta("mps-launch: lease lease-q revoked (MPS server 7 of group g on GPU 0 died while mpsd was away); requeued, attempt 2\n") +
			`mps-launch: granted lease lease-q in group default after waiting \d+s\n$`)
		if got := h.read("stderr"); !want.MatchString(got) {
			t.Errorf("stderr %q, want it to match %q", got, want)
		}
	})
	t.Run("requeued", func(t *testing.T) {
		// Waiting for its second run, a lease resumes as attempt 2: mpsd
		// has nothing to tell it again.
		h := newHarness(t, nil)
		h.cfg.RevokeGrace = time.Hour
		h.cfg.Quiet = true
		done := h.start(t.Context(), h.sh(`[ "$MPSD_ATTEMPT" = 2 ]`)...)
		lc := h.fake.NextLease(t)
		lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
		a := h.fake.NextAttach(t)
		lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "server died"})
		if err := unix.Kill(a.PID, unix.SIGKILL); err != nil { // mpsd's cgroup kill
			t.Fatal(err)
		}
		lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
		lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, LeaseID: "lease-1"})
		lc.End()
		again := h.fake.NextLease(t)
		if again.Request.ResumeLeaseID != "lease-1" || again.Request.Attempt != 2 {
			t.Errorf("reconnect request %+v, want resume of lease-1 attempt 2", again.Request)
		}
		again.MustSend(t, apitest.Granted(again.Request, "lease-1", 2))
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want 0 from attempt 2; stderr %s", code, h.read("stderr"))
		}
	})
}

// ranMarker is what the command wrote to marker, each time it ran.
func ranMarker(t *testing.T, h *harness) string {
	t.Helper()
	b, err := os.ReadFile(h.path("marker"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// TestRunHoldsCommandUntilAttach: a lease granted just before mpsd went
// away keeps its command unstarted and retries the attach: at once while
// the stream stays open, through the resumed lease's grant after a
// restart.
func TestRunHoldsCommandUntilAttach(t *testing.T) {
	for _, how := range []apitest.Drop{apitest.DropEOF, apitest.DropReset} {
		t.Run("stream open/"+dropName(how), func(t *testing.T) {
			h := newHarness(t, nil)
			done := h.start(t.Context(), h.sh("echo ran >> marker")...)
			lc := h.fake.NextLease(t)
			h.fake.DropAttaches(how, 2)
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			h.fake.NextDrop(t)
			h.fake.NextDrop(t)
			if a := h.fake.NextAttach(t); a.LeaseID != "lease-1" {
				t.Errorf("attach %+v", a)
			}
			if code := h.wait(done); code != 0 {
				t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
			}
			if got := ranMarker(t, h); got != "ran\n" {
				t.Errorf("the command ran %q, want once", got)
			}
			if s := h.read("stderr"); s != "" {
				t.Errorf("stderr %q, want nothing", s)
			}
		})
	}
	t.Run("mpsd restarts", func(t *testing.T) {
		h := newHarness(t, nil)
		done := h.start(t.Context(), h.sh("echo ran >> marker")...)
		lc := h.fake.NextLease(t)
		h.fake.DropAttaches(apitest.DropReset, 1<<20)
		lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
		// Two attaches dropped: the launcher holds the command and
		// retries; it has neither started it nor given up.
		h.fake.NextDrop(t)
		h.fake.NextDrop(t)
		if got := ranMarker(t, h); got != "" {
			t.Fatalf("the command ran (%q) although no attach succeeded", got)
		}
		select {
		case code := <-done:
			t.Fatalf("mps-launch gave up (exit %d) while mpsd was away; stderr %s", code, h.read("stderr"))
		default:
		}
		lc.End() // the dying mpsd's stream ends too
		again := h.fake.NextLease(t)
		if again.Request.ResumeLeaseID != "lease-1" || again.Request.Attempt != 1 {
			t.Errorf("reconnect request %+v, want resume of lease-1 attempt 1", again.Request)
		}
		h.fake.DropAttaches(0, 0) // the new mpsd serves attaches
		again.MustSend(t, apitest.Granted(again.Request, "lease-1", 1))
		if a := h.fake.NextAttach(t); a.LeaseID != "lease-1" {
			t.Errorf("attach %+v", a)
		}
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
		}
		if got := ranMarker(t, h); got != "ran\n" {
			t.Errorf("the command ran %q, want once", got)
		}
	})
	t.Run("revoked while held", func(t *testing.T) {
		// A fault takes the lease while the launcher holds it: the
		// requeued grant is the one that runs.
		h := newHarness(t, nil)
		h.cfg.Quiet = true
		done := h.start(t.Context(), h.sh(`echo "$MPSD_ATTEMPT" >> marker`)...)
		lc := h.fake.NextLease(t)
		h.fake.DropAttaches(apitest.DropEOF, 1<<20)
		lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
		h.fake.NextDrop(t)
		lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "server died"})
		lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
		h.fake.DropAttaches(0, 0)
		lc.MustSend(t, apitest.Granted(lc.Request, "lease-2", 2))
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
		}
		if got := ranMarker(t, h); got != "2\n" {
			t.Errorf("the command ran as attempts %q, want 2 only", got)
		}
	})
}

// gaveUp is the line of a launcher that gave up on mpsd: how long it was
// unreachable, and the last failure.
func gaveUp(last string) *regexp.Regexp {
	// A launch that was queued logged its wait first (stderr is no
	// terminal).
	return regexp.MustCompile(`^(mps-launch: queued, position \d+[^\n]*\n)?mps-launch: gave up on mpsd: unreachable for (\d+ms|\d+s): ` + last + `\n$`)
}

// TestRunGivesUpOnMpsd: mpsd away for longer than ReconnectTimeout ends
// the launch with ExitTempFail, which a batch system requeues, and a line
// saying for how long mpsd was unreachable; the command never runs.
func TestRunGivesUpOnMpsd(t *testing.T) {
	const window = 300 * time.Millisecond
	hint := regexp.QuoteMeta(" (is mpsd running? --socket or $MPSD_SOCKET names another socket)")
	for _, tc := range []struct {
		name string
		// run drives the fake; it returns the expected last failure (a
		// regular expression).
		run func(t *testing.T, h *harness) string
		// onLease, if set, serves every lease stream.
		onLease func(*apitest.LeaseConn)
	}{
		{name: "requests reset", run: func(t *testing.T, h *harness) string {
			lc := h.fake.NextLease(t)
			lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, LeaseID: "lease-q"})
			h.fake.DropLeases(apitest.DropReset, 1<<20)
			lc.End()
			return `cannot reach mpsd at \S+: connection reset before mpsd answered` + hint
		}},
		{name: "streams without events", onLease: func(*apitest.LeaseConn) {}, run: func(t *testing.T, h *harness) string {
			return `the lease stream ended before its first event`
		}},
		{name: "attach held", run: func(t *testing.T, h *harness) string {
			lc := h.fake.NextLease(t)
			h.fake.DropAttaches(apitest.DropEOF, 1<<20)
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			t.Cleanup(func() { lc.WaitReleased(t) })
			return `attach pid \d+ to lease lease-1: cannot reach mpsd at \S+: mpsd closed the connection before answering` + hint
		}},
		{name: "stale socket", run: func(t *testing.T, h *harness) string {
			return `cannot reach mpsd at \S+: connection refused` + hint
		}},
		{name: "socket away, marker there", run: func(t *testing.T, h *harness) string {
			return `cannot reach mpsd at \S+: no such file or directory` + hint
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.onLease)
			h.cfg.ReconnectTimeout = window
			switch tc.name {
			case "stale socket":
				// What a killed mpsd leaves: its socket, with no one
				// listening, and the live marker.
				h.cfg.Socket = staleSocket(t, h.dir)
			case "socket away, marker there":
				// A restarting mpsd between the removal of its old
				// socket and its listening on the new one.
				h.cfg.Socket = filepath.Join(h.dir, "away.sock")
				if err := os.WriteFile(api.LiveMarker(h.cfg.Socket), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			done := h.start(t.Context(), h.sh("echo ran > marker")...)
			last := tc.run(t, h)
			if code := h.wait(done); code != ExitTempFail {
				t.Errorf("exit %d, want %d; stderr %s", code, ExitTempFail, h.read("stderr"))
			}
			if took := time.Since(start); took < window {
				t.Errorf("gave up after %s, before the %s window", took, window)
			}
			if got := h.read("stderr"); !gaveUp(last).MatchString(got) {
				t.Errorf("stderr %q, want it to match %q", got, gaveUp(last))
			}
			if got := ranMarker(t, h); got != "" {
				t.Errorf("the command ran (%q)", got)
			}
		})
	}
}

// --wait and --no-wait bound the wait for an mpsd that never answered:
// mps-launch waits that long for a lease, mpsd's absence included.
func TestRunWaitBoundsFirstContact(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    func(*Options)
		reason string
	}{
		{"--no-wait", func(o *Options) { o.NoWait = true }, "--no-wait was given"},
		{"--wait", func(o *Options) { o.Wait = 200 * time.Millisecond }, "--wait 200ms ran out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.cfg.ReconnectTimeout = time.Hour // only the flag may end the wait
			h.cfg.Socket = staleSocket(t, h.dir)
			tc.set(&h.cfg.Options)
			done := h.start(t.Context(), h.sh("echo ran > marker")...)
			if code := h.wait(done); code != ExitTempFail {
				t.Errorf("exit %d, want %d; stderr %s", code, ExitTempFail, h.read("stderr"))
			}
			want := regexp.MustCompile(`^mps-launch: gave up on mpsd: unreachable for \S+, and ` + regexp.QuoteMeta(tc.reason) + `: cannot reach mpsd at \S+: connection refused`)
			if got := h.read("stderr"); !want.MatchString(got) {
				t.Errorf("stderr %q, want it to match %q", got, want)
			}
			if got := ranMarker(t, h); got != "" {
				t.Errorf("the command ran (%q)", got)
			}
		})
	}
}

// staleSocket makes what a stopped or killed mpsd leaves in dir: a unix
// socket file that nothing listens on, and its live marker.
func staleSocket(t *testing.T, dir string) string {
	t.Helper()
	path := refusingSocket(t, dir)
	if err := os.WriteFile(api.LiveMarker(path), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// refusingSocket makes a unix socket file in dir that nothing listens on.
func refusingSocket(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "stale.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunCommandDoneWhileMpsdAway: a command that succeeds while mpsd is
// away ends the launch with 0, but only once the launcher has given its
// lease back to the restarted mpsd (resumed, then closed), so that its
// share is free at once; if mpsd does not come back, still 0.
func TestRunCommandDoneWhileMpsdAway(t *testing.T) {
	t.Run("mpsd back", func(t *testing.T) {
		h := newHarness(t, nil)
		stdinR, stdinW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer stdinR.Close()
		defer stdinW.Close()
		h.cfg.Stdin = stdinR
		done := h.start(t.Context(), h.sh("read line; exit 0")...)
		lc := h.fake.NextLease(t)
		lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
		a := h.fake.NextAttach(t)
		h.fake.DropLeases(apitest.DropReset, 1<<20) // mpsd is away
		lc.End()
		h.fake.NextDrop(t)
		if _, err := stdinW.WriteString("go\n"); err != nil {
			t.Fatal(err)
		}
		waitExited(t, a.PID)
		select {
		case code := <-done:
			t.Fatalf("exit %d before the lease was given back", code)
		case <-time.After(100 * time.Millisecond):
		}
		h.fake.DropLeases(0, 0) // mpsd is back
		again := h.fake.NextLease(t)
		if again.Request.ResumeLeaseID != "lease-1" {
			t.Errorf("reconnect request %+v, want resume of lease-1", again.Request)
		}
		again.WaitReleased(t)
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want the command's 0; stderr %s", code, h.read("stderr"))
		}
	})
	t.Run("mpsd gone", func(t *testing.T) {
		h := newHarness(t, nil)
		h.cfg.ReconnectTimeout = 200 * time.Millisecond
		done := h.start(t.Context(), h.sh("sleep 0.1")...)
		lc := h.fake.NextLease(t)
		lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
		h.fake.NextAttach(t)
		h.fake.DropLeases(apitest.DropReset, 1<<20)
		lc.End()
		if code := h.wait(done); code != 0 {
			t.Errorf("exit %d, want the command's 0; stderr %s", code, h.read("stderr"))
		}
		if s := h.read("stderr"); s != "" {
			t.Errorf("stderr %q, want nothing", s)
		}
	})
}

// waitExited waits until pid is gone (reaped), failing the test after
// apitest.Wait.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(apitest.Wait)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still there after %s", pid, apitest.Wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
