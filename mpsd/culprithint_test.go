package mpsd

import (
	"log/slog"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// A culprit named by a server's log only where facts confirm it
// (culprithint.go), decided on the fake core with real processes standing
// for the clients: Alice's (uid 1000) on her server, Bob's (uid 1001).
func TestLogNamedCulpritNeedsFacts(t *testing.T) {
	const server, aliceUID, bobUID = 100, 1000, 1001
	// spawn starts a process that runs until killed (or has ended, when
	// ended is set).
	spawn := func(t *testing.T, ended bool) *exec.Cmd {
		t.Helper()
		c := exec.Command("sleep", "60")
		if ended {
			c = exec.Command("true")
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		if ended {
			_ = c.Wait()
		} else {
			t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		}
		return c
	}
	// hint is the record naming client, at offset 10 of server.log (the
	// fault's own record is at 100).
	hint := func(client int, off int64) mps.Event {
		return mps.Event{Kind: mps.FaultCulprit, PID: server, Client: client, UID: -1, ExitStatus: -1, KnownServer: true,
			InServerLog: true, LogOffset: off, Message: "Client {PID: …, Context: 1} encountered a fatal GPU error."}
	}
	for _, tc := range []struct {
		name      string
		multiuser bool
		// hints: which processes the server's log names: "alice-ended"
		// (ended since a reading of her cgroup that listed it),
		// "alice-runs", "alice-ends" (in her cgroup; ends 50 ms after the
		// recovery begins), "alice-leaving" (listed by that reading, out
		// of her cgroup now, as an exiting process is; ends 50 ms after
		// the recovery begins), "bob-ended".
		hints []string
		// pidReused: the reading that listed alice-leaving was taken 2 s
		// before that process started (its pid was another's then).
		pidReused bool
		// hintAfter: the record comes after the fault's own in the log;
		// noXid: no Xid confirmed the fault; stale: the reading of
		// Alice's cgroup that listed her ended process is a minute old.
		hintAfter, noXid, stale bool
		want                    string // the culprit lease, "" none
		why                     string // the unverified reason logged, when none
	}{
		{name: "ended with the fault", hints: []string{"alice-ended"}, want: "alice"},
		{name: "ends within the wait", hints: []string{"alice-ends"}, want: "alice"},
		{name: "runs on", hints: []string{"alice-runs"}, why: "still ran 1s after the record named it"},
		{name: "two names", hints: []string{"alice-ended", "alice-runs"}, why: "named 2 clients for one fault"},
		{name: "another uid's process", hints: []string{"bob-ended"}, why: "no process of a running lease of the server's uid"},
		{name: "multiuser", multiuser: true, hints: []string{"alice-ended"}, why: "on a multiuser daemon"},
		{name: "no Xid", noXid: true, hints: []string{"alice-ends"}, why: "no Xid confirmed the fault"},
		{name: "after the fault's record", hintAfter: true, hints: []string{"alice-ends"}, why: "came after the fault's own"},
		{name: "long gone", stale: true, hints: []string{"alice-ended"}, why: "no process of a running lease of the server's uid"},
		{name: "leaving its cgroup as it exits", hints: []string{"alice-leaving"}, want: "alice"},
		{name: "a pid taken since the reading", pidReused: true, hints: []string{"alice-leaving"}, why: "no process of a running lease of the server's uid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, in, clk, _ := fakeCore(t, policy.WatchdogConfig{QuarantineAfter: 3, QuarantineWindow: time.Minute})
			d.procs = procFS{root: "/proc"}
			var logs syncBuffer
			in.log = slog.New(slog.NewTextHandler(&logs, nil))
			in.p.Multiuser = tc.multiuser
			in.mps.serverStarted(server, aliceUID)
			procs := map[string]*exec.Cmd{
				"alice-ended": spawn(t, true), "alice-runs": spawn(t, false),
				"alice-ends": spawn(t, false), "alice-leaving": spawn(t, false), "bob-ended": spawn(t, true)}
			read := clk.Now()
			switch {
			case tc.stale:
				read = read.Add(-time.Minute)
			case tc.pidReused:
				read = read.Add(-2 * time.Second)
			}
			// Alice's cgroup holds her two running processes; its last
			// reading listed the ended one too.
			alice := &lease{id: "alice", uid: aliceUID, state: leaseRunning, inst: in, pidsAt: read,
				pids: []int{procs["alice-ended"].Process.Pid, procs["alice-runs"].Process.Pid, procs["alice-ends"].Process.Pid, procs["alice-leaving"].Process.Pid},
				cg:   &pathCgroup{pids: []int{procs["alice-runs"].Process.Pid, procs["alice-ends"].Process.Pid}}}
			bob := &lease{id: "bob", uid: bobUID, state: leaseRunning, inst: in, pidsAt: read, pids: []int{procs["bob-ended"].Process.Pid}}
			in.leases = map[string]*lease{"alice": alice, "bob": bob}
			off := int64(10)
			if tc.hintAfter {
				off = 200
			}
			for _, h := range tc.hints {
				d.noteCulpritHint(in, newFakeControl(1, "/nonexistent/pipe"), hint(procs[h].Process.Pid, off))
				off++
			}
			pending := []fault{{kind: faultServerFault, server: server, reason: "a fault",
				fromServerLog: true, logOffset: 100, xidConfirmed: !tc.noXid}}
			if h := tc.hints[0]; h == "alice-ends" || h == "alice-leaving" {
				go func() {
					time.Sleep(50 * time.Millisecond)
					_ = procs[h].Process.Kill()
				}()
			} else {
				clk.Advance(culpritExitWait) // the wait is over
			}
			d.nameLogCulprits(in, pending)
			if got := pending[0].culprit.lease; got != tc.want {
				t.Fatalf("culprit %q; want %q\nlog:\n%s", got, tc.want, logs.String())
			}
			if tc.want != "" && !strings.Contains(pending[0].reason, "raised by lease alice (uid 1000)") {
				t.Errorf("reason %q does not name the culprit", pending[0].reason)
			}
			if tc.why != "" && !strings.Contains(logs.String(), tc.why) {
				t.Errorf("log does not say %q:\n%s", tc.why, logs.String())
			}
			if len(in.culpritHints) != 0 {
				t.Errorf("hints kept after the recovery used them: %+v", in.culpritHints)
			}
		})
	}
}

// A record folded into an older hint of its server keeps the hint as
// young as itself: a third record 6 s after the first and 2 s after the
// second still finds two names before it, and names nobody.
func TestCulpritHintAgesFromItsNewestRecord(t *testing.T) {
	d := &Daemon{}
	in := &instance{}
	t0 := fakeT0
	rec := func(client int, at time.Time) culpritHint {
		return culpritHint{ev: mps.Event{Kind: mps.FaultCulprit, PID: 100, Client: client}, at: at, records: 1}
	}
	if d.foldCulpritHintLocked(in, rec(1, t0)) {
		t.Fatal("the first record folded into nothing")
	}
	in.culpritHints = append(in.culpritHints, rec(1, t0))
	if !d.foldCulpritHintLocked(in, rec(2, t0.Add(4*time.Second))) {
		t.Fatal("a second record 4 s later was not folded into the first")
	}
	if !d.foldCulpritHintLocked(in, rec(3, t0.Add(6*time.Second))) {
		t.Fatalf("a third record 2 s after the second was not counted with it: hints %+v", in.culpritHints)
	}
	if len(in.culpritHints) != 1 || in.culpritHints[0].records != 3 {
		t.Fatalf("hints %+v; want one of 3 records", in.culpritHints)
	}
	// Past culpritHintAge after the newest record, it is gone.
	if d.foldCulpritHintLocked(in, rec(4, t0.Add(6*time.Second+culpritHintAge+time.Millisecond))) {
		t.Fatal("a record folded into a hint older than culpritHintAge")
	}
}
