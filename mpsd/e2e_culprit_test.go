package mpsd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Two members of a group without multiuser (one server uid at a time),
// each lease with one requeue attempt.
const culpritUIDAlice, culpritUIDBob = 64027, 64028

// culpritEnv starts mpsd with the group, and on it Alice's long job (its
// client runs until the test opens her gate when gated, else for a
// minute; it is requeued after each fault), Alice's client that raises a
// real fatal GPU fault when it gets SIGUSR1, and Bob's short job, which
// waits: MPS serves Alice's uid while her clients run.
func culpritEnv(t *testing.T, gated bool) (e *testEnv, long, faulty, bob *proc, openLong func()) {
	t.Helper()
	a, b := emutest.User(t, culpritUIDAlice), emutest.User(t, culpritUIDBob)
	e = newEnvGPUs(t, 1, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    gpus: ["0"]
    requeue_attempts: 1
`, a, b), faultWatchdog)
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	longCmd := []string{client, "--duration", "1m"}
	openLong = func() {}
	if gated {
		gateArgs, open := e.gate("alice")
		longCmd = []string{"/bin/sh", "-c", `"$0" --duration 1m & c=$!; ` + gateArgs[2] + `; kill -INT $c; wait $c; s=$?; [ $s = 130 ] && exit 0; exit $s`, client}
		openLong = open
	}
	long = startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, longCmd...)...), culpritUIDAlice))
	e.aliceConnected("alice's long client connected", 1)
	faulty = startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--fault-on-usr1", "--duration", "1m"), culpritUIDAlice))
	e.aliceConnected("alice's two clients connected", 2)
	bob = startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "100ms"), culpritUIDBob))
	return e, long, faulty, bob, openLong
}

// aliceConnected waits until n leases of Alice's run and n clients are
// connected to the instance's servers; it returns her running leases,
// oldest first, and the instance.
func (e *testEnv) aliceConnected(what string, n int) ([]api.LeaseStatus, api.InstanceStatus) {
	e.t.Helper()
	var ls []api.LeaseStatus
	st := e.waitStatus(what, func(st api.Status) bool {
		ls = ls[:0]
		for _, l := range st.Leases {
			if l.UID == culpritUIDAlice && l.State == api.LeaseRunning && len(l.PIDs) > 0 {
				ls = append(ls, l)
			}
		}
		return len(ls) == n && e.mpsClients(instanceOf(st, "a", 0)) >= n
	})
	return ls, instanceOf(st, "a", 0)
}

// faultyLease is the lease of ls that runs the faulting client.
func faultyLease(t *testing.T, ls []api.LeaseStatus) (faulty, long api.LeaseStatus) {
	t.Helper()
	if len(ls) != 2 {
		t.Fatalf("alice runs %d leases; want 2", len(ls))
	}
	if strings.Contains(strings.Join(ls[0].Command, " "), "--fault-on-usr1") {
		return ls[0], ls[1]
	}
	return ls[1], ls[0]
}

// recovered waits until the instance's restarts reach want and it is ready.
func (e *testEnv) recovered(want int) api.InstanceStatus {
	e.t.Helper()
	st := e.waitStatus(fmt.Sprintf("the instance recovered (restart %d)", want), func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.Restarts == want && in.State == api.InstanceReady
	})
	return instanceOf(st, "a", 0)
}

// A culprit the server's own log names, confirmed by facts. Alice's
// faulting client raises a real fatal GPU fault beside her long job on her
// server: the emulated server logs "Client {PID: <the faulting one>,
// Context: 1} encountered a fatal GPU error." and handles it, and the
// driver's Xid names no process (NVML's do not). The record is only a
// hint; that its pid is a process of a running lease of the server's uid,
// and that the process ended with the fault, confirm it. So the faulting
// lease alone is charged: it ends 75 on its second fault (its one requeue
// attempt used on its own faults), while the long job, with one attempt
// too, is requeued twice as a victim without using it, and ends 0. Bob's
// job waits for Alice's server to go, then runs. On main before the hint
// was confirmed (the fault named nobody), the long job ended 75 on the
// second fault.
func TestLogNamedCulpritChargedAlone(t *testing.T) {
	e, long, faulty, bob, openLong := culpritEnv(t, true)
	for restart := 1; restart <= 2; restart++ {
		ls, _ := e.aliceConnected(fmt.Sprintf("alice's two clients connected (fault %d)", restart), 2)
		fl, _ := faultyLease(t, ls)
		if err := syscall.Kill(fl.PIDs[0], syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		if in := e.recovered(restart); in.QuarantineReason != "" {
			t.Fatalf("instance quarantined: %s", in.QuarantineReason)
		}
	}
	if r := faulty.wait(t); r.code != 75 || !strings.Contains(r.stderr, "no requeue attempts left (1 used)") {
		t.Errorf("the faulting job: exit %d, stderr %q; want 75, its one attempt used on its own faults", r.code, r.stderr)
	}
	ls, _ := e.aliceConnected("alice's long job running again", 1)
	if ls[0].Attempt != 3 {
		t.Errorf("the long job at attempt %d; want 3, requeued twice as a victim", ls[0].Attempt)
	}
	openLong()
	if r := long.wait(t); r.code != 0 {
		t.Errorf("the long job: exit %d, stderr %q; want 0: the faults that named another lease cost it nothing", r.code, r.stderr)
	}
	if r := bob.wait(t); r.code != 0 {
		t.Errorf("bob's job: exit %d, stderr %q", r.code, r.stderr)
	}
	b, _ := os.ReadFile(e.log.Name())
	if n := strings.Count(string(b), "fault culprit named by the server's log and confirmed by its process's end"); n != 2 {
		t.Errorf("mpsd named a culprit from the server's log %d times; want 2 (each fault)", n)
	}
}

// A forged culprit record charges nobody. Bob, a member, writes records
// into the instance's log FIFO (it is world-writable) naming Alice's long
// client, with the server pid of her server:
//   - with a forged fault record that a real Xid (naming no process)
//     confirms: the named client runs on, so the record is not taken and
//     the fault names nobody;
//   - just before a real fault of Alice's faulting client: the server's
//     log then names two clients for one fault, and neither is taken.
//
// Both faults are charged as faults naming nobody (each of Alice's leases
// uses up its one attempt on the first and ends 75 on the second); no
// lease is named a culprit; Bob's job runs once Alice's have gone.
func TestForgedCulpritRecordChargesNobody(t *testing.T) {
	e, long, faulty, bob, _ := culpritEnv(t, false)
	forge := e.buildTestProgram("mpsforge")
	forgeNaming := func(in api.InstanceStatus, victim api.LeaseStatus, msgs ...string) {
		t.Helper()
		fifo := filepath.Join(e.dir, "run", "a", in.GPUUUID, "pipe", "log")
		e.forge(forge, culpritUIDBob, fifo, "Server", in.ServerPIDs[0],
			append([]string{fmt.Sprintf("Client {PID: %d, Context: 1} encountered a fatal GPU error.", victim.PIDs[0])}, msgs...)...)
	}

	ls, in := e.aliceConnected("alice's two clients connected (forged fault)", 2)
	_, ll := faultyLease(t, ls)
	forgeNaming(in, ll, "Server is handling a fatal GPU error.")
	if err := e.sim.InjectXid(0, 13, 0); err != nil {
		t.Fatal(err)
	}
	e.recovered(1)
	e.waitLogAny(fmt.Sprintf("still ran %s after the record named it", culpritExitWait))

	ls, in = e.aliceConnected("alice's two clients connected (real fault, forged culprit)", 2)
	fl, ll := faultyLease(t, ls)
	forgeNaming(in, ll)
	e.waitLogAny(fmt.Sprintf(`"client":%d`, ll.PIDs[0]), fmt.Sprintf("client=%d", ll.PIDs[0]))
	if err := syscall.Kill(fl.PIDs[0], syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	e.recovered(2)
	e.waitLogAny("the server's log named 2 clients for one fault")

	for name, p := range map[string]*proc{"long": long, "faulting": faulty} {
		if r := p.wait(t); r.code != 75 {
			t.Errorf("alice's %s job: exit %d, stderr %q; want 75: faults that name nobody charge every victim", name, r.code, r.stderr)
		}
	}
	if r := bob.wait(t); r.code != 0 {
		t.Errorf("bob's job: exit %d, stderr %q", r.code, r.stderr)
	}
	b, _ := os.ReadFile(e.log.Name())
	for _, s := range []string{"confirmed by its process's end", fmt.Sprintf("uid %d's clients", culpritUIDAlice), "raised by lease"} {
		if strings.Contains(string(b), s) {
			t.Errorf("mpsd's log says %q: a forged record named a culprit", s)
		}
	}
}
