package mpsd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Test uids of the cancel and drain tests: two members of group a, no
// admins.
const (
	cancelUIDAlice = 64710
	cancelUIDBob   = 64711
)

// cancelGroups: one instance (GPU 0) whose 10G fit one 8G lease at a time,
// so a second one queues; group b shares GPU 0.
const cancelGroups = `  a:
    users: [root, "64710", "64711"]
    memory: 10G
    gpus: ["0"]
  b:
    users: [root, "64710", "64711"]
    memory: 10G
    gpus: ["0"]
`

func leaseOf(t *testing.T, st api.Status, uid uint32, state string) api.LeaseStatus {
	t.Helper()
	for _, l := range st.Leases {
		if l.UID == uid && l.State == state {
			return l
		}
	}
	t.Fatalf("no %s lease of uid %d in %+v", state, uid, st.Leases)
	return api.LeaseStatus{}
}

// mpsctl cancel ends a lease for good, queued or running, at its owner's or
// an admin's request, and at nobody else's: the other member is refused
// and nothing changes; Bob cancels his own queued request; root cancels
// Alice's running lease. Each launcher exits 122 naming who cancelled it,
// the running command is gone, nothing is requeued.
func TestCancelEndsLeasesForGood(t *testing.T) {
	emutest.User(t, cancelUIDAlice)
	bobName := emutest.User(t, cancelUIDBob)
	e := newEnv(t, cancelGroups, "")
	e.start()
	e.waitStatus("instances ready", func(st api.Status) bool {
		return len(st.Instances) == 2 && st.Instances[0].State == api.InstanceReady && st.Instances[1].State == api.InstanceReady
	})
	work, _ := e.gate("never")
	alice := startProc(t, asUID(e.launch(append([]string{"--group", "a", "--mem", "8G", "--job", "J-alice", "--"}, work...)...), cancelUIDAlice))
	st := e.waitStatus("alice's lease running with its command", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	aliceLease := leaseOf(t, st, cancelUIDAlice, api.LeaseRunning)
	workPids := aliceLease.PIDs
	bob := startProc(t, asUID(e.launch("--group", "a", "--mem", "8G", "--job", "J-bob", "--", "true"), cancelUIDBob))
	st = e.waitStatus("bob's request queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })
	bobLease := leaseOf(t, st, cancelUIDBob, api.LeaseQueued)

	// Neither member may cancel the other's lease.
	for _, c := range []struct {
		uid   uint32
		lease string
	}{{cancelUIDBob, aliceLease.ID}, {cancelUIDAlice, bobLease.ID}} {
		r := e.mpsctl(c.uid, "cancel", c.lease)
		if r.code != 1 || !strings.Contains(r.stderr, "is not yours") {
			t.Errorf("cancel of %s as uid %d: exit %d, stderr %q; want 1 and a refusal", c.lease, c.uid, r.code, r.stderr)
		}
	}
	if st := e.d.Status(); countLeases(st, api.LeaseRunning) != 1 || countLeases(st, api.LeaseQueued) != 1 {
		t.Fatalf("refused cancels changed the leases: %+v", st.Leases)
	}

	// Bob cancels his own queued request.
	r := e.mpsctl(cancelUIDBob, "cancel", bobLease.ID)
	if want := fmt.Sprintf("cancelled lease %s (was queued)\n", bobLease.ID); r.code != 0 || r.stdout != want {
		t.Fatalf("bob's cancel of his queued lease: exit %d, stdout %q, stderr %q; want 0 and %q", r.code, r.stdout, r.stderr, want)
	}
	res := bob.wait(t)
	if res.code != 122 || !strings.Contains(res.stderr, fmt.Sprintf("lease %s cancelled by %s (uid %d) while it was queued", bobLease.ID, bobName, cancelUIDBob)) {
		t.Errorf("bob's launcher: exit %d, stderr %q; want 122 and who cancelled it", res.code, res.stderr)
	}

	// Root cancels Alice's running lease.
	r = e.mpsctl(0, "cancel", aliceLease.ID)
	if want := fmt.Sprintf("cancelled lease %s (was running; its processes were killed)\n", aliceLease.ID); r.code != 0 || r.stdout != want {
		t.Fatalf("root's cancel of alice's lease: exit %d, stdout %q, stderr %q; want 0 and %q", r.code, r.stdout, r.stderr, want)
	}
	res = alice.wait(t)
	if res.code != 122 || !strings.Contains(res.stderr, "cancelled by root (uid 0)") || strings.Contains(res.stderr, "requeued") {
		t.Errorf("alice's launcher: exit %d, stderr %q; want 122, root named, no requeue", res.code, res.stderr)
	}
	for _, pid := range workPids {
		if procRunning(pid) {
			t.Errorf("alice's command %d still runs after the cancel", pid)
		}
	}
	if st := e.d.Status(); len(st.Leases) != 0 {
		t.Errorf("leases after both cancels: %+v", st.Leases)
	}
	if r := e.mpsctl(0, "cancel", aliceLease.ID); r.code != 1 || !strings.Contains(r.stderr, "no lease "+aliceLease.ID) {
		t.Errorf("second cancel: exit %d, stderr %q; want 1 and no such lease", r.code, r.stderr)
	}
	// Both are in the history, cancelled, Bob's never having run.
	h := e.history(0)
	if len(h.Records) != 2 || h.Records[0].JobID != "J-bob" || h.Records[1].JobID != "J-alice" {
		t.Fatalf("history after both cancels: %+v; want bob's then alice's", h.Records)
	}
	for _, rec := range h.Records {
		if rec.Ended != api.EndedCancelled || !strings.Contains(rec.Reason, "cancelled by") || (rec.Granted != nil) != (rec.JobID == "J-alice") {
			t.Errorf("history record %+v; want ended cancelled naming who, granted only for alice's", rec)
		}
	}
}

// cancel --signal gives the workload its signal and the grace to end:
// Alice's command that ends on SIGTERM does so (its trap runs), one that
// ignores it is killed once the grace is over; both launchers exit 122.
func TestCancelSignalThenGrace(t *testing.T) {
	emutest.User(t, cancelUIDAlice)
	emutest.User(t, cancelUIDBob)
	e := newEnv(t, cancelGroups, "")
	e.start()
	e.waitStatus("instances ready", func(st api.Status) bool { return len(st.Instances) == 2 })
	trapped := filepath.Join(e.dir, "trapped")
	if err := os.WriteFile(trapped, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(trapped, 0o666); err != nil {
		t.Fatal(err)
	}
	graceful := startProc(t, asUID(e.launch("--group", "a", "--mem", "1G", "--", "/bin/sh", "-c",
		fmt.Sprintf(`trap 'echo term >> %s; exit 0' TERM; while :; do sleep 0.05; done`, trapped)), cancelUIDAlice))
	stubborn := startProc(t, asUID(e.launch("--group", "b", "--mem", "1G", "--", "/bin/sh", "-c",
		`trap '' TERM; while :; do sleep 0.05; done`), cancelUIDBob))
	st := e.waitStatus("both leases running with their commands", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 2 && len(st.Leases[0].PIDs) > 0 && len(st.Leases[1].PIDs) > 0
	})
	a, b := leaseOf(t, st, cancelUIDAlice, api.LeaseRunning), leaseOf(t, st, cancelUIDBob, api.LeaseRunning)

	r := e.mpsctl(cancelUIDAlice, "cancel", "--signal", "TERM", "--grace", "30s", a.ID)
	if r.code != 0 || !strings.Contains(r.stdout, "SIGTERM reached") || !strings.Contains(r.stdout, "all ended within the grace") {
		t.Fatalf("cancel --signal TERM of alice's lease: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if b, _ := os.ReadFile(trapped); !strings.Contains(string(b), "term") {
		t.Errorf("alice's command did not run its TERM trap: %q", b)
	}
	if res := graceful.wait(t); res.code != 122 || !strings.Contains(res.stderr, fmt.Sprintf("(uid %d)", cancelUIDAlice)) {
		t.Errorf("alice's launcher: exit %d, stderr %q; want 122 naming her", res.code, res.stderr)
	}

	began := time.Now()
	r = e.mpsctl(cancelUIDBob, "cancel", "--signal", "15", "--grace", "300ms", b.ID)
	if r.code != 0 || !strings.Contains(r.stdout, "the rest were killed after the grace") {
		t.Fatalf("cancel --signal 15 of bob's lease: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Errorf("the cancel answered after %s, before its grace", took)
	}
	if res := stubborn.wait(t); res.code != 122 {
		t.Errorf("bob's launcher: exit %d, stderr %q; want 122", res.code, res.stderr)
	}
	e.waitStatus("no lease left", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A drain records its reason, who drained and when; it reads draining
// while a lease runs on the instance and drained once it is empty; a
// second drain says it was drained already; the record survives a
// restart of mpsd; resume clears it. A group removed from the config with
// a lease still on its instance reads retiring. A drain without a reason
// is recorded as giving none, and mpsctl says so.
func TestDrainRecordedWithReason(t *testing.T) {
	emutest.User(t, cancelUIDAlice)
	emutest.User(t, cancelUIDBob)
	e := newEnv(t, cancelGroups, "")
	e.start()
	e.waitStatus("instances ready", func(st api.Status) bool { return len(st.Instances) == 2 })
	inst := func(st api.Status, group string) api.InstanceStatus {
		for _, in := range st.Instances {
			if in.Group == group {
				return in
			}
		}
		t.Fatalf("no instance of group %s in %+v", group, st.Instances)
		return api.InstanceStatus{}
	}

	if r := e.mpsctl(cancelUIDAlice, "drain", "--group", "a", "--reason", "mine"); r.code != 1 || !strings.Contains(r.stderr, "not an mpsd admin") {
		t.Fatalf("drain by a member: exit %d, stderr %q; want 1 and a refusal", r.code, r.stderr)
	}

	aWork, aOpen := e.gate("a")
	bWork, bOpen := e.gate("b")
	alice := startProc(t, asUID(e.launch(append([]string{"--group", "a", "--mem", "1G", "--"}, aWork...)...), cancelUIDAlice))
	bob := startProc(t, asUID(e.launch(append([]string{"--group", "b", "--mem", "1G", "--"}, bWork...)...), cancelUIDBob))
	e.waitStatus("both leases running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 2 })

	before := time.Now().Add(-time.Second)
	r := e.mpsctl(0, "drain", "--group", "a", "--reason", "fan replacement")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "drained gpu 0 (") || !strings.HasSuffix(r.stdout, "group a: state draining\n") {
		t.Fatalf("drain: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	in := inst(e.d.Status(), "a")
	if in.State != api.InstanceDraining || in.DrainReason != "fan replacement" || in.DrainedBy != "root" || in.DrainedAt.Before(before) || in.DrainedAt.After(time.Now()) {
		t.Fatalf("a drained with a lease on it: state %s, record %q by %q at %s", in.State, in.DrainReason, in.DrainedBy, in.DrainedAt)
	}
	r = e.mpsctl(0, "drain", "--gpu", "0", "--group", "a", "--reason", "fan replacement")
	if r.code != 0 || !strings.Contains(r.stdout, "drained already by root at ") || !strings.Contains(r.stdout, ": fan replacement; state draining") {
		t.Errorf("second drain: exit %d, stdout %q; want it to say drained already, by whom and why", r.code, r.stdout)
	}
	if r := e.mpsctl(0, "status"); !strings.Contains(r.stdout, "drained by root at ") || !strings.Contains(r.stdout, ": fan replacement") {
		t.Errorf("status does not show the drain's record:\n%s", r.stdout)
	}

	aOpen()
	if res := alice.wait(t); res.code != 0 {
		t.Fatalf("alice's launcher: exit %d, stderr %q", res.code, res.stderr)
	}
	e.waitStatus("a drained and empty", func(st api.Status) bool { return inst(st, "a").State == api.InstanceDrained })

	// Group b leaves the config while Bob's lease runs on its instance.
	e.writeConfig(`  a:
    users: [root, "64710", "64711"]
    memory: 10G
    gpus: ["0"]
`, "")
	e.waitStatus("b retiring", func(st api.Status) bool {
		for _, in := range st.Instances {
			if in.Group == "b" {
				return in.State == api.InstanceRetiring
			}
		}
		return false
	})
	bOpen()
	if res := bob.wait(t); res.code != 0 {
		t.Fatalf("bob's launcher: exit %d, stderr %q", res.code, res.stderr)
	}

	e.stop()
	e.start()
	in = e.waitStatus("a still drained after the restart", func(st api.Status) bool {
		return len(st.Instances) == 1 && st.Instances[0].State == api.InstanceDrained
	}).Instances[0]
	if in.DrainReason != "fan replacement" || in.DrainedBy != "root" || in.DrainedAt.Before(before) {
		t.Errorf("drain record after the restart: %q by %q at %s", in.DrainReason, in.DrainedBy, in.DrainedAt)
	}
	if r := e.mpsctl(0, "resume", "--group", "a"); r.code != 0 || !strings.Contains(r.stdout, "drain lifted") {
		t.Fatalf("resume: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	in = e.waitStatus("a ready", func(st api.Status) bool { return st.Instances[0].State == api.InstanceReady }).Instances[0]
	if in.DrainReason != "" || in.DrainedBy != "" || !in.DrainedAt.IsZero() {
		t.Errorf("drain record after the resume: %+v", in)
	}
	r = e.mpsctl(0, "drain", "--group", "a")
	if r.code != 0 || !strings.Contains(r.stderr, "no --reason given") {
		t.Errorf("drain without a reason: exit %d, stderr %q; want 0 and a note", r.code, r.stderr)
	}
	if in := e.d.Status().Instances[0]; in.State != api.InstanceDrained || in.DrainReason != "no reason given" || in.DrainedBy != "root" {
		t.Errorf("drain without a reason: state %s, record %q by %q", in.State, in.DrainReason, in.DrainedBy)
	}
}

// A cancel that mpsd stops in the middle of (here in its grace: Alice's
// command ignores SIGTERM) is finished by the next mpsd as a cancel: the
// saved revocation carries its end, so the lease is not requeued, her
// launcher exits 122 naming who cancelled it, and her command is gone.
// Bob's lease on the same GPU (group b) runs on untouched.
func TestCancelSurvivesMpsdRestart(t *testing.T) {
	emutest.User(t, cancelUIDAlice)
	emutest.User(t, cancelUIDBob)
	e := newEnv(t, cancelGroups, "")
	e.start()
	e.waitStatus("instances ready", func(st api.Status) bool { return len(st.Instances) == 2 })
	alice := startProc(t, asUID(e.launch("--group", "a", "--mem", "1G", "--", "/bin/sh", "-c",
		`trap '' TERM; while :; do sleep 0.05; done`), cancelUIDAlice))
	bWork, bOpen := e.gate("bob")
	bob := startProc(t, asUID(e.launch(append([]string{"--group", "b", "--mem", "1G", "--"}, bWork...)...), cancelUIDBob))
	st := e.waitStatus("both leases running with their commands", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 2 && len(st.Leases[0].PIDs) > 0 && len(st.Leases[1].PIDs) > 0
	})
	a := leaseOf(t, st, cancelUIDAlice, api.LeaseRunning)
	bobLease := leaseOf(t, st, cancelUIDBob, api.LeaseRunning)

	cancel := startProc(t, exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "cancel", "--signal", "TERM", "--grace", "10m", a.ID))
	waitCond(t, "the cancel's revocation saved with its end", func() bool {
		return strings.Contains(string(e.stateBytes()), `"end_code":"cancelled"`)
	}, nil)
	e.stop()
	if r := cancel.wait(t); r.code == 0 {
		t.Errorf("the cancel answered %q though mpsd stopped in its grace", r.stdout)
	}
	e.start()
	res := alice.wait(t)
	if res.code != 122 || !strings.Contains(res.stderr, "cancelled by root (uid 0)") || strings.Contains(res.stderr, "requeued") {
		t.Errorf("alice's launcher: exit %d, stderr %q; want 122, root named, no requeue", res.code, res.stderr)
	}
	for _, pid := range a.PIDs {
		if procRunning(pid) {
			t.Errorf("alice's command %d runs on after the restart finished the cancel", pid)
		}
	}
	st = e.waitStatus("alice's lease gone, bob's running", func(st api.Status) bool { return len(st.Leases) == 1 })
	if st.Leases[0].ID != bobLease.ID || st.Leases[0].Attempt != 1 {
		t.Errorf("after the restart: %+v; want bob's lease %s alone, at its first attempt", st.Leases, bobLease.ID)
	}
	bOpen()
	if r := bob.wait(t); r.code != 0 {
		t.Errorf("bob's launcher: exit %d, stderr %q", r.code, r.stderr)
	}
}

// A lease a revocation has (here root's requeue, whose kill fails for a
// while) is cancelled too: it ends once its processes are gone instead of
// being requeued, and Alice's launcher exits 122. Bob, another member,
// may not cancel it.
func TestCancelWhileRevoked(t *testing.T) {
	aliceName := emutest.User(t, cancelUIDAlice)
	emutest.User(t, cancelUIDBob)
	e := newEnv(t, cancelGroups, "")
	s := &stuckKills{check: func(bool) {}}
	s.target.Store("")
	e.opts.wrapCgroups = func(m cgroup.Manager) cgroup.Manager { s.Manager = m; return s }
	e.opts.killRetryInitial = 100e6 // 100ms
	e.start()
	e.waitStatus("instances ready", func(st api.Status) bool { return len(st.Instances) == 2 })
	work, _ := e.gate("alice")
	alice := startProc(t, asUID(e.launch(append([]string{"--group", "a", "--mem", "1G", "--"}, work...)...), cancelUIDAlice))
	st := e.waitStatus("alice's lease running with its command", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	a := st.Leases[0]
	s.target.Store(a.ID)
	s.fail.Store(true)
	if r := e.mpsctl(0, "requeue", a.ID); r.code != 0 {
		t.Fatalf("requeue: exit %d, stderr %q", r.code, r.stderr)
	}
	waitCond(t, "the requeue's kill failing", func() bool { return s.failed.Load() >= 2 }, nil)

	if r := e.mpsctl(cancelUIDBob, "cancel", a.ID); r.code != 1 || !strings.Contains(r.stderr, "is not yours") {
		t.Errorf("bob's cancel of alice's lease: exit %d, stderr %q; want 1 and a refusal", r.code, r.stderr)
	}
	r := e.mpsctl(cancelUIDAlice, "cancel", a.ID)
	if want := fmt.Sprintf("cancelled lease %s (was being revoked; it ends once its processes are gone, instead of being requeued)\n", a.ID); r.code != 0 || r.stdout != want {
		t.Fatalf("alice's cancel: exit %d, stdout %q, stderr %q; want %q", r.code, r.stdout, r.stderr, want)
	}
	s.fail.Store(false)
	res := alice.wait(t)
	if res.code != 122 || !strings.Contains(res.stderr, fmt.Sprintf("lease %s cancelled by %s (uid %d)", a.ID, aliceName, cancelUIDAlice)) {
		t.Errorf("alice's launcher: exit %d, stderr %q; want 122 naming her", res.code, res.stderr)
	}
	if strings.Contains(res.stderr, "requeued, attempt 2") {
		t.Errorf("alice's lease was requeued after its cancel: %q", res.stderr)
	}
	e.waitStatus("no lease left", func(st api.Status) bool { return len(st.Leases) == 0 })
}
