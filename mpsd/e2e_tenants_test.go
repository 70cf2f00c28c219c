package mpsd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Two members of one group, without multiuser: MPS runs one server uid at
// a time per daemon.
const (
	tenUIDAlice    = 64021
	tenUIDBob      = 64022
	tenUIDAliceStr = "64021"
	tenUIDBobStr   = "64022"
	tenGroup       = `  a:
    users: ["` + tenUIDAliceStr + `", "` + tenUIDBobStr + `"]
    memory: 10G
    gpus: ["0"]
`
)

// A normal MPS server switch is no fault. Alice runs, Bob asks while her
// client is connected (he waits: MPS would make him wait), her client
// ends, MPS ends her server (exit status 0) and starts Bob's. Rounds of
// that, before and after an mpsd restart, end 0 with no revocation, no
// restart of the instance and no fault counted.
func TestUIDSwitchIsNoFault(t *testing.T) {
	e := newEnvGPUs(t, 1, tenGroup, faultWatchdog)
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	round := func(n int) {
		t.Helper()
		alice := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--alloc", "256M", "--duration", "1s"), tenUIDAlice))
		e.waitStatus("alice's lease running", func(st api.Status) bool {
			return len(st.Leases) == 1 && st.Leases[0].State == api.LeaseRunning && st.Leases[0].UID == tenUIDAlice
		})
		e.waitServerOf(t, "a", tenUIDAlice) // her client reached MPS: her server runs
		bob := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--alloc", "256M", "--duration", "300ms"), tenUIDBob))
		// Bob waits while Alice's server has a client: MPS would
		// make his client wait inside it.
		e.waitStatus("bob queued behind alice", func(st api.Status) bool { return st.Queue["a"] == 1 })
		for who, p := range map[string]*proc{"alice": alice, "bob": bob} {
			if r := p.wait(t); r.code != 0 {
				t.Fatalf("round %d: %s: exit %d, stderr %q", n, who, r.code, r.stderr)
			}
		}
		e.waitStatus("no leases", func(st api.Status) bool { return len(st.Leases) == 0 })
	}
	check := func(when string) {
		t.Helper()
		st := e.d.Status()
		in := instanceOf(st, "a", 0)
		if in.Restarts != 0 || in.State != api.InstanceReady {
			t.Errorf("%s: instance %s with %d restarts, want ready with none", when, in.State, in.Restarts)
		}
		e.d.mu.Lock()
		var faults []string
		for _, in := range e.d.instances {
			for kind, n := range in.faults {
				if n > 0 {
					faults = append(faults, kind)
				}
			}
		}
		e.d.mu.Unlock()
		if len(faults) > 0 {
			t.Errorf("%s: faults counted: %v; a uid switch is no fault", when, faults)
		}
	}
	for n := range 3 {
		round(n)
	}
	check("before the restart")
	e.stop()
	e.start()
	e.waitStatus("instance ready", func(st api.Status) bool { return instanceOf(st, "a", 0).State == api.InstanceReady })
	for n := range 3 {
		round(3 + n)
	}
	check("after the restart")
	if b, _ := os.ReadFile(e.log.Name()); strings.Contains(string(b), "revok") {
		t.Errorf("mpsd's log speaks of a revocation")
	}
}

// tenReady starts e and waits for group a's instance on GPU 0 to be ready;
// it returns that instance and the emulated client's path.
func (e *testEnv) tenReady() (api.InstanceStatus, string) {
	e.t.Helper()
	e.start()
	in0 := instanceOf(e.waitStatus("instance ready", func(st api.Status) bool {
		return instanceOf(st, "a", 0).State == api.InstanceReady
	}), "a", 0)
	return in0, filepath.Join(e.emu, "mpsemu-client")
}

// unleasedClient starts an emulated client of in's server as uid, without
// a lease: the pipe directory set by hand, as a member can.
func (e *testEnv) unleasedClient(t *testing.T, uid uint32, in api.InstanceStatus, client string, args ...string) *proc {
	t.Helper()
	c := asUID(exec.Command(client, args...), uid)
	c.Env = append(os.Environ(), api.EnvPipeDirectory+"="+Layout{RunDir: filepath.Join(e.dir, "run")}.PipeDir(in.Group, in.GPUUUID))
	return startProc(t, c)
}

// gatedLease starts a lease of uid whose process waits at the gate name
// (not yet a CUDA client) and then runs client for 100 ms; it returns
// once the lease runs, with the launcher and the gate's opener.
func (e *testEnv) gatedLease(t *testing.T, uid uint32, name, client string) (*proc, func()) {
	t.Helper()
	gateArgs, open := e.gate(name)
	script := gateArgs[2] + `; exec "$0" --duration 100ms`
	p := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", "/bin/sh", "-c", script, client), uid))
	e.waitStatus(name+"'s gated lease running", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.UID == uid && l.State == api.LeaseRunning && len(l.PIDs) > 0 && strings.Contains(strings.Join(l.Command, " "), "gate-"+name) {
				return true
			}
		}
		return false
	})
	return p, open
}

// waitServerOf waits until group's instance on GPU 0 has a server of uid.
func (e *testEnv) waitServerOf(t *testing.T, group string, uid int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		e.d.mu.Lock()
		found := false
		for _, in := range e.d.instances {
			if in.group != group {
				continue
			}
			for _, u := range in.mps.servers {
				found = found || u == uid
			}
		}
		e.d.mu.Unlock()
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no MPS server of uid %d in group %s after %s", uid, group, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An unleased client holds its server for its uid, as MPS makes every
// other uid wait behind it: a member's client started with the pipe
// directory and no lease keeps another member's request queued (not
// granted into a hang inside MPS) until it is gone, ended by the member
// (report) or by mpsd (terminate). Nothing counts as a fault.
func TestUnleasedClientHoldsTheInstance(t *testing.T) {
	for _, pol := range []string{"report", "terminate"} {
		t.Run(pol, func(t *testing.T) {
			e := newEnvGPUs(t, 1, tenGroup+"    reconcile: "+pol+"\n", faultWatchdog)
			in0, client := e.tenReady()
			hp := e.unleasedClient(t, tenUIDAlice, in0, client, "--duration", "1m")
			e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", map[string]float64{reconUnleased: 1})

			bob := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--duration", "200ms"), tenUIDBob))
			e.waitStatus("bob queued behind alice's unleased client", func(st api.Status) bool { return st.Queue["a"] == 1 })
			e.d.mu.Lock()
			granted := len(e.d.instances["a/0"].leases)
			e.d.mu.Unlock()
			if granted != 0 {
				t.Fatalf("bob's request was granted while alice's unleased client holds her server")
			}
			if pol == "report" {
				// The holder is reported: status shows alice's server
				// held by a client of no lease, and bob's wait says so.
				e.waitStatus("alice's server held in status, and bob told why he waits", func(st api.Status) bool {
					in := instanceOf(st, "a", 0)
					held := slices.ContainsFunc(in.Servers, func(s api.ServerStatus) bool {
						return s.UID == tenUIDAlice && s.UnleasedClients == 1
					})
					told := slices.ContainsFunc(st.Leases, func(l api.LeaseStatus) bool {
						return l.UID == tenUIDBob && strings.Contains(l.WaitReason, "GPU 0 serves another user, whose clients of no lease hold its MPS server")
					})
					return held && told
				})
				_ = hp.cmd.Process.Kill()
			}
			if r := bob.wait(t); r.code != 0 {
				t.Fatalf("bob: exit %d, stderr %q", r.code, r.stderr)
			}
			hp.wait(t)
			if in := instanceOf(e.d.Status(), "a", 0); in.Restarts != 0 {
				t.Errorf("instance restarted %d times; an unleased client is no fault", in.Restarts)
			}
		})
	}
}

// One tenant's faults cost only that tenant. In a multiuser group (one
// server shared by its members), Bob's client faults again and again
// beside Alice's long job; each fault is an application Xid naming Bob's
// process (the culprit, a fact) while Bob also forges a server.log record
// naming Alice's process as the culprit. Alice's job is requeued each time
// without using up an attempt (she has one) and finishes; Bob's job, with
// one attempt, ends with 75 on his second fault; after quarantine_after
// faults of his, Bob is barred from the instance (his next request waits,
// saying why, across a restart of mpsd) while the instance stays open to
// Alice, until an operator resumes it.
func TestCulpritChargedAlone(t *testing.T) {
	const aliceUID, bobUID = 64025, 64026
	alice, bob := emutest.User(t, aliceUID), emutest.User(t, bobUID)
	e := newEnvGPUs(t, 1, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    gpus: ["0"]
    multiuser: true
    requeue_attempts: 1
`, alice, bob), faultWatchdog)
	e.start()
	select {
	case <-e.sim.XidWatched():
	case <-time.After(waitFor):
		t.Fatal("mpsd does not watch Xid events")
	}
	forge := e.buildTestProgram("mpsforge")
	client := filepath.Join(e.emu, "mpsemu-client")
	gateArgs, open := e.gate("alice")
	// Alice's client stays connected until the test opens the gate.
	script := `"$0" --duration 1m & c=$!; ` + gateArgs[2] + `; kill -INT $c; wait $c; s=$?; [ $s = 130 ] && exit 0; exit $s`
	ap := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script, client), aliceUID))

	leaseOf := func(st api.Status, uid uint32) (api.LeaseStatus, bool) {
		for _, l := range st.Leases {
			if l.UID == uid && l.State == api.LeaseRunning && len(l.PIDs) > 0 {
				return l, true
			}
		}
		return api.LeaseStatus{}, false
	}
	// fault has Bob's running client raise an application Xid, the
	// restarts of the instance reach want, and Alice runs again.
	fault := func(want int) {
		t.Helper()
		st := e.waitStatus("bob's and alice's clients running", func(st api.Status) bool {
			_, a := leaseOf(st, aliceUID)
			_, b := leaseOf(st, bobUID)
			return a && b && e.mpsClients(instanceOf(st, "a", 0)) >= 2
		})
		bl, _ := leaseOf(st, bobUID)
		al, _ := leaseOf(st, aliceUID)
		in := instanceOf(st, "a", 0)
		fifo := filepath.Join(e.dir, "run", "a", in.GPUUUID, "pipe", "log")
		e.forge(forge, bobUID, fifo, "Server", in.ServerPIDs[0],
			fmt.Sprintf("Client {PID: %d, Context: 1} encountered a fatal GPU error.", al.PIDs[len(al.PIDs)-1]),
			"Server is handling a fatal GPU error.")
		if err := e.sim.InjectXid(0, 13, bl.PIDs[0]); err != nil {
			t.Fatal(err)
		}
		e.waitStatus("the instance recovered", func(st api.Status) bool {
			in := instanceOf(st, "a", 0)
			return in.Restarts == want && in.State == api.InstanceReady
		})
	}
	bobRuns := func() *proc {
		return startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"), bobUID))
	}

	b1 := bobRuns()
	fault(1)
	fault(2)
	if r := b1.wait(t); r.code != 75 || !strings.Contains(r.stderr, "no requeue attempts left (1 used)") {
		t.Errorf("bob's first job: exit %d, stderr %q; want 75, its one attempt used on its own faults", r.code, r.stderr)
	}
	if h := e.history(0); len(h.Records) != 1 || h.Records[0].UID != bobUID || h.Records[0].Ended != api.EndedExhausted || h.Records[0].Attempts != 2 {
		t.Errorf("history after bob's first job: %+v; want it ended exhausted at attempt 2", h.Records)
	}
	b2 := bobRuns()
	fault(3)
	// Three faults of Bob's within the window: he is barred, and his
	// second job, requeued on its one attempt, waits saying why; the
	// instance is not quarantined, and Alice still runs there.
	st := e.waitStatus("bob's requeued job waiting, barred, and alice running again", func(st api.Status) bool {
		if _, ok := leaseOf(st, aliceUID); !ok {
			return false
		}
		for _, l := range st.Leases {
			if l.UID == bobUID && l.State == api.LeaseQueued && strings.Contains(l.WaitReason, "refuses uid 64026") {
				return true
			}
		}
		return false
	})
	if in := instanceOf(st, "a", 0); in.State != api.InstanceReady || in.QuarantineReason != "" {
		t.Errorf("instance %s (%q); want ready: only the culprit's uid is refused", in.State, in.QuarantineReason)
	} else if !in.Multiuser {
		t.Errorf("the multiuser group's instance does not say multiuser in status (its SM shares are advisory)")
	}
	if al, ok := leaseOf(st, aliceUID); !ok || al.Attempt != 4 {
		t.Errorf("alice's lease %+v; want running at attempt 4, requeued three times as a victim", al)
	}
	// A new lease of Alice's is still placed on the instance.
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), aliceUID)); r.code != 0 {
		t.Errorf("alice's new job while bob is barred: exit %d, stderr %q", r.code, r.stderr)
	}
	// The bar holds across a restart of mpsd (the state file keeps it).
	e.stop()
	e.start()
	e.waitStatus("bob still barred after mpsd's restart, alice running", func(st api.Status) bool {
		if _, ok := leaseOf(st, aliceUID); !ok {
			return false
		}
		for _, l := range st.Leases {
			if l.UID == bobUID && l.State == api.LeaseQueued && strings.Contains(l.WaitReason, "refuses uid 64026") {
				return true
			}
		}
		return false
	})
	out := e.admin(t, "resume", "--gpu", "0", "--group", "a")
	if !strings.Contains(out, "group a") {
		t.Errorf("mpsctl resume: %q", out)
	}
	e.waitStatus("bob's request placed after the resume", func(st api.Status) bool {
		_, ok := leaseOf(st, bobUID)
		return ok
	})
	_ = b2.cmd.Process.Signal(syscall.SIGTERM)
	b2.wait(t)
	open()
	if r := ap.wait(t); r.code != 0 {
		t.Errorf("alice's job: exit %d, stderr %q; want 0 after three requeues that cost her nothing", r.code, r.stderr)
	}
	// Nothing named Alice the culprit: the forged records did not.
	if b, _ := os.ReadFile(e.log.Name()); strings.Contains(string(b), fmt.Sprintf("uid %d's clients", aliceUID)) {
		t.Errorf("alice was charged for bob's faults")
	}
}

// A uid switch before a lease's process reaches CUDA is no fault. Alice's
// server is up and idle when her next lease is granted; its process takes
// its time before it initialises CUDA (an inference server loading its
// model). Meanwhile Bob's unleased client asks for a server: MPS ends
// Alice's idle server (exit status 0) and starts Bob's. Alice's lease,
// whose process is alive but was never a client of that server, is not
// revoked: her client waits inside MPS for Bob's to go, then runs. (Found
// by mpsd's simulation; on 1543be4 the clean exit with a live process of
// Alice's was taken for a crash and her lease revoked, so that any member
// could have a neighbour's leases revoked at will.)
func TestSwitchBeforeTheClientConnectsIsNoFault(t *testing.T) {
	e := newEnvGPUs(t, 1, tenGroup, faultWatchdog)
	in0, client := e.tenReady()
	if r := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--duration", "100ms"), tenUIDAlice)).wait(t); r.code != 0 {
		t.Fatalf("alice's first job: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitServerOf(t, "a", tenUIDAlice) // her server stays up, idle
	alice, open := e.gatedLease(t, tenUIDAlice, "alice", client)
	hp := e.unleasedClient(t, tenUIDBob, in0, client, "--duration", "1s")
	// MPS ended Alice's idle server for Bob's client, and mpsd judged
	// the exit (within the 250 ms a clean exit once waited for a lease's
	// processes to end).
	deadline := time.Now().Add(waitFor)
	for {
		b, _ := os.ReadFile(e.log.Name())
		if strings.Contains(string(b), "MPS server exited after its last client left") && strings.Contains(string(b), "server_uid="+tenUIDAliceStr) ||
			strings.Contains(string(b), "instance failed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mpsd never judged the exit of alice's server")
		}
		time.Sleep(20 * time.Millisecond)
	}
	open()
	if r := alice.wait(t); r.code != 0 {
		t.Fatalf("alice: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := hp.wait(t); r.code != 0 {
		t.Fatalf("bob's unleased client: exit %d, stderr %q", r.code, r.stderr)
	}
	if in := instanceOf(e.d.Status(), "a", 0); in.Restarts != 0 {
		t.Errorf("instance restarted %d times; a uid switch is no fault", in.Restarts)
	}
	if b, _ := os.ReadFile(e.log.Name()); strings.Contains(string(b), "revok") || strings.Contains(string(b), "requeued") {
		t.Errorf("alice's lease was revoked or requeued by MPS's uid switch")
	}
}

// Two uids holding one instance admit nobody. Alice's lease runs but her
// process has not reached CUDA yet when Bob's unleased client takes the
// server; once reconciliation has seen Bob's client, MPS would make a new
// client of either uid wait (Alice's behind Bob's, Bob's behind Alice's
// pending one), so Alice's second request waits in mpsd's queue, not
// inside MPS. When Bob's client is gone both of Alice's leases run and end
// 0. (Found by mpsd's simulation; on 1543be4 Alice's second lease was
// granted, as her running lease made placement think her server served.)
func TestContestedInstanceAdmitsNobody(t *testing.T) {
	e := newEnvGPUs(t, 1, tenGroup, faultWatchdog)
	in0, client := e.tenReady()
	first, open := e.gatedLease(t, tenUIDAlice, "alice", client)
	hp := e.unleasedClient(t, tenUIDBob, in0, client, "--duration", "1m")
	e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", map[string]float64{reconUnleased: 1})
	// The model holds Alice's lease as MPS's pending client: it waits
	// behind Bob's server, which status shows.
	e.waitStatus("alice's lease pending behind bob's server", func(st api.Status) bool {
		i := slices.IndexFunc(st.Leases, func(l api.LeaseStatus) bool { return l.UID == tenUIDAlice && l.State == api.LeaseRunning })
		if i < 0 {
			return false
		}
		return slices.ContainsFunc(instanceOf(st, "a", 0).Servers, func(s api.ServerStatus) bool {
			return s.UID == tenUIDBob && s.UnleasedClients == 1 && slices.Equal(s.PendingLeases, []string{st.Leases[i].ID})
		})
	})

	second := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--duration", "100ms"), tenUIDAlice))
	e.waitStatus("alice's second request queued", func(st api.Status) bool { return st.Queue["a"] == 1 })
	e.d.mu.Lock()
	granted := len(e.d.instances["a/0"].leases)
	e.d.mu.Unlock()
	if granted != 1 {
		t.Fatalf("%d leases granted while bob's unleased client holds the server and alice's lease waits behind it; want 1", granted)
	}
	_ = hp.cmd.Process.Kill()
	hp.wait(t)
	open()
	for who, p := range map[string]*proc{"alice's first": first, "alice's second": second} {
		if r := p.wait(t); r.code != 0 {
			t.Fatalf("%s: exit %d, stderr %q", who, r.code, r.stderr)
		}
	}
	if in := instanceOf(e.d.Status(), "a", 0); in.Restarts != 0 {
		t.Errorf("instance restarted %d times; an unleased client is no fault", in.Restarts)
	}
}

// Alice's unleased client holds her server when mpsd restarts. The new
// mpsd adopts the instance and places nothing on it until a
// reconciliation has read MPS's client lists: Bob's request, made as soon
// as mpsd is back, waits behind her client instead of being granted into
// a hang inside MPS (before, the adopted instance took it at once, and
// only the next probe's reconciliation, a probe interval later, knew of
// Alice's client). The probe interval is long here so that the first
// probe comes after Bob's request.
func TestUnleasedHolderKnownAfterRestart(t *testing.T) {
	wd := strings.Replace(faultWatchdog, "probe_interval: 250ms", "probe_interval: 5s", 1)
	e := newEnvGPUs(t, 1, tenGroup+"    reconcile: report\n", wd)
	in0, client := e.tenReady()
	hp := e.unleasedClient(t, tenUIDAlice, in0, client, "--duration", "1m")
	e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", map[string]float64{reconUnleased: 1})

	e.stop()
	e.start()
	bob := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--duration", "200ms"), tenUIDBob))
	st := e.waitStatus("bob's request taken", func(st api.Status) bool {
		return slices.ContainsFunc(st.Leases, func(l api.LeaseStatus) bool { return l.UID == tenUIDBob })
	})
	if i := slices.IndexFunc(st.Leases, func(l api.LeaseStatus) bool { return l.UID == tenUIDBob }); st.Leases[i].State != api.LeaseQueued {
		t.Fatalf("after mpsd's restart bob's request is %s while alice's unleased client holds her server; want it queued", st.Leases[i].State)
	}
	e.waitLogAny("adopted instance reconciled; it takes leases")
	e.d.mu.Lock()
	granted := len(e.d.instances["a/0"].leases)
	e.d.mu.Unlock()
	if granted != 0 {
		t.Fatalf("after the adopted instance's reconciliation bob's request was granted while alice's unleased client holds her server")
	}
	_ = hp.cmd.Process.Kill()
	hp.wait(t)
	if r := bob.wait(t); r.code != 0 {
		t.Fatalf("bob: exit %d, stderr %q", r.code, r.stderr)
	}
}

// A server held in FAULT. Alice's leased client raises a fatal GPU fault
// while her client of no lease (started with the pipe directory, as a
// member can) catches the sticky error and hangs on: MPS keeps her server
// in FAULT, refusing new clients, until that client has gone. The fault's
// recovery revokes the leased one; the MPS model holds the server in FAULT
// (status servers[].fault), and the requeued lease waits, told why,
// instead of being granted into MPS's refusal; so does Bob's request,
// made meanwhile. Once the hanger is gone a reconciliation ends the FAULT
// and both run and end 0, Alice's on its second attempt, neither revoked.
// (Before the model held FAULT, Alice's lease was granted again at once
// and its client refused by the server in FAULT: the job failed.)
func TestServerHeldInFaultByAClientOfNoLease(t *testing.T) {
	e := newEnvGPUs(t, 1, tenGroup, faultWatchdog)
	in0, client := e.tenReady()
	hp := e.unleasedClient(t, tenUIDAlice, in0, client, "--duration", "1m", "--hold-on-fault")
	e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", map[string]float64{reconUnleased: 1})
	// Her job faults on its first attempt and runs briefly on the next
	// (the test opens the gate before the fault).
	_, openSecond := e.gate("second")
	script := `if [ -e "$1" ]; then exec "$0" --duration 100ms; fi; exec "$0" --fault-on-usr1 --duration 1m`
	alice := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", "/bin/sh", "-c", script, client, filepath.Join(e.dir, "gate-second")), tenUIDAlice))
	var pid int
	e.waitStatus("alice's lease running, its client connected beside the hanger", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.UID == tenUIDAlice && l.State == api.LeaseRunning && len(l.PIDs) > 0 {
				pid = l.PIDs[0]
			}
		}
		return pid != 0 && e.mpsClients(instanceOf(st, "a", 0)) >= 2
	})
	openSecond()
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	e.waitStatus("alice's server held in FAULT, her requeued lease waiting for it", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		fault := slices.ContainsFunc(in.Servers, func(s api.ServerStatus) bool { return s.Fault && s.UID == tenUIDAlice })
		waits := slices.ContainsFunc(st.Leases, func(l api.LeaseStatus) bool {
			return l.UID == tenUIDAlice && l.State == api.LeaseQueued && l.Attempt == 2 && strings.Contains(l.WaitReason, "in FAULT until its clients of no lease have gone")
		})
		return in.Restarts == 1 && fault && waits
	})
	bob := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--duration", "100ms"), tenUIDBob))
	e.waitStatus("bob's request queued while alice's server is held in FAULT", func(st api.Status) bool {
		return slices.ContainsFunc(st.Leases, func(l api.LeaseStatus) bool { return l.UID == tenUIDBob && l.State == api.LeaseQueued })
	})
	if err := hp.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	hp.wait(t)
	if r := alice.wait(t); r.code != 0 {
		t.Fatalf("alice's job: exit %d, stderr %q; want 0, its second attempt run once the FAULT was over", r.code, r.stderr)
	}
	if r := bob.wait(t); r.code != 0 || strings.Contains(r.stderr, "revoked") {
		t.Fatalf("bob's job: exit %d, stderr %q; want 0, granted once the FAULT was over and never revoked", r.code, r.stderr)
	}
	if in := instanceOf(e.d.Status(), "a", 0); in.Restarts != 1 || slices.ContainsFunc(in.Servers, func(s api.ServerStatus) bool { return s.Fault }) {
		t.Errorf("instance: %d restarts, servers %+v; want the one fault, and no server in FAULT", in.Restarts, in.Servers)
	}
}
