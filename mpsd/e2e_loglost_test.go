package mpsd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// A poisoned log FIFO. Bob, a member of a multiuser group, writes one
// record header declaring 0xffffffff bytes of text into the instance's
// log FIFO: the control daemon's logger swallows everything after it, the
// daemon's own records and every fault record included, and some 6 KiB
// later the daemon dies of SIGSEGV (as NVIDIA's 535, 550 and 555 do, and
// the emulator with them). mpsd notices within a few probes that its
// probes are no longer logged, says so (log, mpsd_mps_log_lost), and keeps
// detecting faults: Bob's client then faults for real (the server gives
// Alice's client the error too, the driver raises an Xid naming no
// process), and both leases are revoked and requeued, as with a working
// log, not released as if their commands had ended by themselves. The
// daemon, dead of its log or replaced through its pidfd once no lease runs
// (it no longer exits on quit), is charged to nobody: no attempt is used
// up for it and the instance counts no failure for it. The new daemon
// logs.
func TestPoisonedLogFIFO(t *testing.T) {
	const aliceUID, bobUID = 64031, 64032
	alice, bob := emutest.User(t, aliceUID), emutest.User(t, bobUID)
	e := newEnvGPUs(t, 1, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    gpus: ["0"]
    multiuser: true
`, alice, bob), `watchdog:
  probe_interval: 2s
  probe_timeout: 1s
  probe_failures: 2
  backoff_initial: 50ms
  backoff_max: 1s
  quarantine_after: 3
  quarantine_window: 1m`)
	e.start()
	forge := e.buildTestProgram("mpsforge")
	client := filepath.Join(e.emu, "mpsemu-client")
	in0 := instanceOf(e.waitStatus("instance ready", func(st api.Status) bool {
		return instanceOf(st, "a", 0).State == api.InstanceReady
	}), "a", 0)

	// Each job runs until the test makes Bob's client fault on its first
	// attempt, and ends well, soon, on the next.
	ap := startProc(t, asUID(e.launch(firstRunFails(client, "--duration 1m")...), aliceUID))
	bp := startProc(t, asUID(e.launch(firstRunFails(client, "--fault-on-usr1 --duration 1m")...), bobUID))
	st := e.waitStatus("both clients connected", func(st api.Status) bool {
		return len(st.Leases) == 2 && e.mpsClients(instanceOf(st, "a", 0)) >= 2
	})

	fifo := filepath.Join(e.dir, "run", "a", in0.GPUUUID, "pipe", "log")
	if r := run(t, asUID(exec.Command(forge, "-fifo", fifo, "-poison"), bobUID)); r.code != 0 {
		t.Fatalf("mpsforge -poison as bob: exit %d, stderr %q", r.code, r.stderr)
	}
	// Its probes stop being logged; mpsd's own commands bring the
	// daemon's death within seconds, before or after mpsd notices.
	e.waitLogAny("MPS log lost", "control daemon ended after its log was lost")
	// Until the daemon dies, the instance and its metric say so.
	lost, metric := e.logLost("a/0"), metricOf(t, e.d, "mpsd_mps_log_lost", "group", "a")
	if b, _ := os.ReadFile(e.log.Name()); (!lost || metric != 1) && !strings.Contains(string(b), "control daemon ended after its log was lost") {
		t.Errorf("the log is lost, yet the instance says lost %v and mpsd_mps_log_lost{group=a} is %v", lost, metric)
	}

	// A real fault now, which no log record tells of.
	signalLeaseProcs(st, bobUID, syscall.SIGUSR1)
	for who, p := range map[string]*proc{"alice": ap, "bob": bp} {
		r := p.wait(t)
		if r.code != 0 || !strings.Contains(r.stderr, requeueLine) {
			t.Errorf("%s: exit %d, stderr %q; want the faulted run revoked and requeued, and the next one done", who, r.code, r.stderr)
		}
	}

	// Only Bob's fault may count towards quarantine, never the daemon's
	// end.
	e.d.mu.Lock()
	failures := len(e.d.instances["a/0"].failures)
	e.d.mu.Unlock()
	if failures > 1 {
		t.Errorf("%d failures counted towards quarantine; want at most Bob's fault", failures)
	}
	// Empty now: the poisoned daemon is gone, and the new one logs.
	e.waitStatus("a new control daemon", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.DaemonPID != in0.DaemonPID && in.State == api.InstanceReady
	})
	if err := syscall.Kill(in0.DaemonPID, 0); err == nil && !apiCallWaitZombie(in0.DaemonPID) {
		t.Errorf("the poisoned daemon %d still runs", in0.DaemonPID)
	}
	deadline := time.Now().Add(waitFor)
	for e.logLost("a/0") {
		if time.Now().After(deadline) {
			t.Fatal("the new daemon's log is taken for lost")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := metricOf(t, e.d, "mpsd_mps_log_lost", "group", "a"); v != 0 {
		t.Errorf("mpsd_mps_log_lost{group=a} = %v with the new daemon, want 0", v)
	}
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "100ms"), aliceUID)); r.code != 0 {
		t.Errorf("alice's job on the new daemon: exit %d, stderr %q", r.code, r.stderr)
	}
}

// logLost reports whether instance key's log is taken for lost.
func (e *testEnv) logLost(key string) bool {
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	in := e.d.instances[key]
	return in != nil && in.logLostLocked()
}
