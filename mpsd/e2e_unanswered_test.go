package mpsd

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// A fault while the control daemon does not answer. The instance's daemon
// is stopped (SIGSTOP: stuck, as a daemon can be), so it passes on none of
// its server's log records; then Bob's client faults. The server tells
// both clients at once (Alice's and Bob's), both commands fail, and both
// launchers ask for their release a second later, before mpsd has any
// record of the fault. mpsd must not take those commands for ended by
// themselves: the releases wait while the daemon fails its probes, the
// daemon is found hung, and its recovery revokes and requeues both leases,
// whose next runs end well. (Before, both were released and both jobs
// ended with their commands' CUDA error, exit 70.)
func TestFaultWhileDaemonUnansweredRequeues(t *testing.T) {
	_, ap, bp := faultWhileDaemonUnanswered(t, 64041, 64042)
	// Both revoked with the hung daemon, not released.
	wantRequeuedAndDone(t, ap, "stopped answering")
	wantRequeuedAndDone(t, bp, "stopped answering")
}

// faultWhileDaemonUnanswered runs mpsd on a multiuser group of Alice and
// Bob, each with a job whose first run holds a client; it stops the
// instance's daemon (SIGSTOP), has Bob's client fault once the probes
// fail, and returns the environment and the two launchers.
func faultWhileDaemonUnanswered(t *testing.T, aliceUID, bobUID uint32) (e *testEnv, ap, bp *proc) {
	t.Helper()
	alice, bob := emutest.User(t, aliceUID), emutest.User(t, bobUID)
	e = newEnvGPUs(t, 1, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    gpus: ["0"]
    multiuser: true
`, alice, bob), `watchdog:
  probe_interval: 1s
  probe_timeout: 500ms
  probe_failures: 3
  backoff_initial: 50ms
  backoff_max: 1s`)
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	ap = startProc(t, asUID(e.launch(firstRunFails(client, "--duration 1m")...), aliceUID))
	bp = startProc(t, asUID(e.launch(firstRunFails(client, "--fault-on-usr1 --duration 1m")...), bobUID))
	st := e.waitStatus("both clients connected", func(st api.Status) bool {
		return len(st.Leases) == 2 && e.mpsClients(instanceOf(st, "a", 0)) >= 2
	})
	daemon := instanceOf(st, "a", 0).DaemonPID
	if err := syscall.Kill(daemon, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(daemon, syscall.SIGCONT) })
	e.waitLogAny("probe failed")
	signalLeaseProcs(st, bobUID, syscall.SIGUSR1) // Bob's client faults
	return e, ap, bp
}

// The release's wait is bounded by the hung verdict, one interval more,
// and maxUnansweredWait.
func TestUnansweredWait(t *testing.T) {
	s := time.Second
	for _, tt := range []struct {
		interval, timeout time.Duration
		failures, fails   int
		want              time.Duration
	}{
		{s, s / 2, 3, 1, 4 * s},     // 2×1.5 s + 1 s
		{s, s / 2, 3, 2, 5 * s / 2}, // 1×1.5 s + 1 s
		{600 * time.Millisecond, 500 * time.Millisecond, 2, 1, 1700 * time.Millisecond},
		{s, s / 2, 2, 5, 5 * s / 2},         // past the verdict: one more probe
		{2 * s, s, 3, 1, maxUnansweredWait}, // 2×3 s + 2 s, bounded
	} {
		if got := unansweredWait(tt.interval, tt.timeout, tt.failures, tt.fails); got != tt.want {
			t.Errorf("unansweredWait(%v, %v, %d, %d) = %v, want %v", tt.interval, tt.timeout, tt.failures, tt.fails, got, tt.want)
		}
	}
}

// mpsd stops while releases wait for a daemon that does not answer. The
// set-up of TestFaultWhileDaemonUnansweredRequeues: the daemon stopped,
// Bob's client faults, both commands fail and both launchers ask for
// their release, which waits; then mpsd stops (SIGTERM) before the daemon
// is found hung. The stop must release neither lease as ended by its
// command: the next mpsd finds the daemon hung, revokes and requeues
// both, and both jobs end 0. (Before, the stop ended the waits and both
// leases were released: both jobs ended with their commands' CUDA error,
// unrequeued.)
func TestReleaseWaitingOnUnansweredDaemonSurvivesMpsdStop(t *testing.T) {
	e, ap, bp := faultWhileDaemonUnanswered(t, 64043, 64044)
	e.waitLogAny("release waits: the instance's daemon does not answer")
	e.stop()
	e.start()
	wantRequeuedAndDone(t, ap, "revoked")
	wantRequeuedAndDone(t, bp, "revoked")
}
