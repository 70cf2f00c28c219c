package mpsd

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"github.com/mpsd/mpsd/internal/clock"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// A server's crash that mpsd sees as it stops is left to the next mpsd,
// which has no pidfd of that server: the saved server list keeps it, so
// the next mpsd finds it gone and revokes the leases of its uid (Alice's,
// not Bob's). Before, the model forgot the server at its exit and the
// state file no longer listed it: the next mpsd revoked nothing, and the
// crash's victims were released as if their commands had ended by
// themselves (the chaos soak met it: three jobs ended with their CUDA
// error, 806).
func TestCrashSeenWhileStoppingIsSaved(t *testing.T) {
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	d, in, clk, dm := fakeUp(t, ctx)
	const aliceUID, bobUID, server = 1000, 1001, 100
	// Granted once the instance is up: Alice's and Bob's leases run.
	d.mu.Lock()
	in.p.Budget = policy.Usage{SM: 100, Mem: 1 << 40, Clients: 48}
	for i, uid := range []uint32{aliceUID, bobUID} {
		id := []string{"g-alice", "g-bob"}[i]
		l := &lease{id: id, group: "g", uid: uid, state: leaseRunning, attempt: 1, requeue: 2, inst: in, box: newMailbox(d.log), log: d.log,
			req: policy.Request{Group: "g", UID: uid, SM: 10, Mem: 1 << 30, GPUs: 1, Procs: 1, Seq: uint64(i + 1)}}
		in.p.Assign(&l.req)
		in.leases[l.id], d.leases[l.id] = l, l
	}
	d.mu.Unlock()
	fakeServerUp(t, d, in, clk, dm, server, aliceUID)

	stop() // mpsd stops; then the server is killed
	dm.events <- mps.Event{Kind: mps.ServerExited, PID: server, UID: -1, Time: clk.Now(), ExitStatus: -1, Signal: syscall.SIGKILL, Source: mps.SourcePidfd}
	waitCond(t, "the crash left for the next mpsd in the saved servers", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, live := in.mps.uidOf(server)
		_, saved := in.mps.saved()[server]
		return !live && saved
	}, nil)

	d.mu.Lock()
	saved := in.mps.saved()
	leases := in.leases
	d.mu.Unlock()
	if uid, ok := saved[server]; !ok || uid != aliceUID {
		t.Fatalf("saved servers %v; want the crashed server %d of uid %d kept for the next mpsd", saved, server, aliceUID)
	}
	// The next mpsd: a new model, the daemon without that server.
	next := newMPSModel()
	lost, victims := lostWhileAway(saved, next, leases, false)
	if !slices.Equal(lost, []int{server}) || !slices.Equal(victims, []string{"g-alice"}) {
		t.Fatalf("the next mpsd finds lost %v, victims %v; want [%d] and alice's lease only", lost, victims, server)
	}
}

// A fault read from server.log stays to be read again, in what the state
// file keeps, until its recovery has marked its victims revoking: an mpsd
// killed in between would otherwise lose it (the chaos soak met it: a
// recovery waited for the culprit the server's log named while mpsd was
// killed; the next mpsd, whose state file had the line handled and the
// lease running, took the culprit's job for one whose command had ended,
// exit 70). Here the recovery waits on Alice's named process, which runs
// on, for up to a second.
func TestFaultLineKeptUntilVictimsRevoking(t *testing.T) {
	d, in, clk, dm := fakeUp(t, t.Context())
	d.procs = procFS{root: "/proc"}
	const aliceUID, server, line = 1000, 100, 4096
	fakeServerUp(t, d, in, clk, dm, server, aliceUID)
	runs := exec.Command("sleep", "60")
	if err := runs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runs.Process.Kill(); _ = runs.Wait() })
	d.mu.Lock()
	in.p.Budget = policy.Usage{SM: 100, Mem: 1 << 40, Clients: 48}
	l := &lease{id: "g-alice", group: "g", uid: aliceUID, state: leaseRunning, attempt: 1, requeue: 2, inst: in, box: newMailbox(d.log), log: d.log,
		pids: []int{runs.Process.Pid}, pidsAt: clk.Now(), req: policy.Request{Group: "g", UID: aliceUID, SM: 10, Mem: 1 << 30, GPUs: 1, Procs: 1, Seq: 1}}
	in.p.Assign(&l.req)
	in.leases[l.id], d.leases[l.id] = l, l
	in.logHandled = 0
	d.mu.Unlock()

	saved := func() int64 {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.snapshotLocked().ServerLogs[in.key]
	}
	// The server's log names Alice's process, which runs on: the
	// recovery's check of that culprit holds it for culpritExitWait
	// before it marks anything (the fault is confirmed, the process one of
	// the lease's, so the check waits for its end).
	d.noteCulpritHint(in, dm, mps.Event{Kind: mps.FaultCulprit, PID: server, Client: runs.Process.Pid, UID: -1, ExitStatus: -1, KnownServer: true})
	d.reportFault(in, fault{kind: faultServerFault, server: server, fromServerLog: true, logOffset: line, xidConfirmed: true, reason: "a fault"})
	if got := saved(); got != line {
		t.Fatalf("while the fault waits for its recovery, the state file keeps server.log from %d; want %d (the fault's line)", got, line)
	}
	// The supervisor's recovery step (supervisor.go), run here.
	d.mu.Lock()
	pending := in.pending
	in.pending, in.handling, in.handlingMarked = nil, pending, false
	d.mu.Unlock()
	done := make(chan struct{})
	go func() { defer close(done); d.recoverOnce(in, pending) }()
	if got := saved(); got != line {
		t.Fatalf("while its recovery has not marked its victims, the state file keeps server.log from %d; want %d", got, line)
	}
	<-done
	d.mu.Lock()
	state, handled := l.state, in.handlingMarked
	d.mu.Unlock()
	if state == leaseRunning || !handled {
		t.Fatalf("after the recovery: alice's lease %v, victims marked %v; want revoked and marked", state, handled)
	}
	if got := saved(); got != line+1 {
		t.Fatalf("once the victims are marked, the state file keeps server.log from %d; want %d", got, line+1)
	}
}

// A fault record waiting for its Xid keeps its line in the state file: a
// later record marked handled (any member can write one into the log
// FIFO) does not move the saved offset past it, so an mpsd killed while
// the claim waits leaves the line to the next one; once the claim expires
// unconfirmed, the offset moves on.
func TestFaultLineKeptWhileItsClaimWaits(t *testing.T) {
	d, in, clk, dm := fakeUp(t, t.Context())
	const aliceUID, server, line = 1000, 100, 4096
	fakeServerUp(t, d, in, clk, dm, server, aliceUID)
	d.mu.Lock()
	in.logHandled = 0
	d.mu.Unlock()
	dm.events <- mps.Event{Kind: mps.ServerFault, PID: server, UID: -1, ExitStatus: -1, KnownServer: true, InServerLog: true, LogOffset: line}
	waitCond(t, "the fault record waits for an Xid", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(in.claims) == 1
	}, nil)
	d.unverifiedRecord(in, mps.Event{Kind: mps.ServerFault, PID: 4242, InServerLog: true, LogOffset: 2 * line}, "a member's record")
	saved := func() int64 {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.snapshotLocked().ServerLogs[in.key]
	}
	if got := saved(); got != line {
		t.Fatalf("while the claim waits, the state file keeps server.log from %d; want %d (the claim's line)", got, line)
	}
	clk.Advance(faultClaimWait)
	waitCond(t, "the claim expired and its line is passed", func() bool { return saved() == 2*line+1 }, nil)
}

// fakeServerUp has the fake control daemon dm start server pid of uid, as
// its pidfd would tell it, and waits for in's model to know it.
func fakeServerUp(t *testing.T, d *Daemon, in *instance, clk *clock.Fake, dm *fakeControl, pid, uid int) {
	t.Helper()
	dm.events <- mps.Event{Kind: mps.ServerStarted, PID: pid, UID: uid, Time: clk.Now(), ExitStatus: -1, Source: mps.SourcePidfd}
	waitCond(t, fmt.Sprintf("server %d of uid %d known", pid, uid), func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, live := in.mps.uidOf(pid)
		return live
	}, nil)
}
