package mpsd

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

// The chaos soak: many concurrent mps-launch jobs in two groups on three
// simulated GPUs while faults of every kind are injected at random. It is
// seeded (MPSD_CHAOS_SEED) so a failing run replays, short by default
// (MPSD_CHAOS_DURATION, e.g. 10m for `make chaos`), and checks after each
// injection that capacity accounting equals the live leases, and at the
// end that every job completed or ended with a reported reason, and that
// nothing leaked.

const chaosGroups = `  a:
    users: [root]
    memory: 20G
    requeue_attempts: 1000
    reconcile: terminate
  b:
    users: [root]
    memory: 10G
    requeue_attempts: 1000
    reconcile: terminate
`

const chaosWatchdog = `watchdog:
  probe_interval: 250ms
  probe_timeout: 200ms
  probe_failures: 2
  backoff_initial: 10ms
  backoff_max: 200ms
  quarantine_after: 1000
  quarantine_window: 1m`

type chaosJob struct {
	id     int
	group  string
	killed bool // the soak killed its mps-launch on purpose
	res    result
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

func TestChaosSoak(t *testing.T) {
	duration := envDuration("MPSD_CHAOS_DURATION", 20*time.Second)
	if testing.Short() {
		duration = 10 * time.Second
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("MPSD_CHAOS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("chaos soak: seed %d (MPSD_CHAOS_SEED=%d replays it), %s", seed, seed, duration)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var rmu sync.Mutex
	randN := func(n int) int { rmu.Lock(); defer rmu.Unlock(); return rng.IntN(n) }

	e := newEnvGPUs(t, 3, chaosGroups, chaosWatchdog)
	e.opts.ReconnectGrace = 30 * time.Second
	// No collateral damage: every fault the watchdog handles is on an
	// instance the soak hit (or on the GPU it raised an Xid on) shortly
	// before, or is a client's own fault, which MPS contains to its server.
	var (
		fmu        sync.Mutex
		touched    = map[string]time.Time{} // instance key → last injection on it
		touchedGPU = map[int]time.Time{}
		collateral []string
	)
	const touchWindow = 30 * time.Second // detection, backoff, restart
	touch := func(group string, gpu int) {
		fmu.Lock()
		touched[instanceKey(group, []int{gpu})] = time.Now()
		fmu.Unlock()
	}
	e.opts.faultHook = func(in *instance, f fault) {
		fmu.Lock()
		defer fmu.Unlock()
		now := time.Now()
		ok := f.kind == faultServerFault
		if at, hit := touched[in.key]; hit && now.Sub(at) < touchWindow {
			ok = true
		}
		for _, g := range in.gpus {
			if at, hit := touchedGPU[g.Index]; hit && now.Sub(at) < touchWindow {
				ok = true
			}
		}
		if !ok {
			collateral = append(collateral, fmt.Sprintf("%s: %s (%s)", in.key, f.kind, f.reason))
		}
	}
	e.start()
	var emu sync.Mutex // e.d and e.start/stop
	status := func() api.Status { emu.Lock(); defer emu.Unlock(); return e.d.Status() }
	client := filepath.Join(e.emu, "mpsemu-client")

	var (
		jmu    sync.Mutex
		jobs   []*chaosJob
		live   = map[*proc]*chaosJob{}
		wg     sync.WaitGroup
		stop   = make(chan struct{})
		counts = map[string]int{}
	)
	var clientFaults atomic.Int64 // jobs whose client faults (MPS contains it)
	const workers = 8
	for w := range workers {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				group := []string{"a", "b"}[randN(2)]
				dur := time.Duration(200+randN(1500)) * time.Millisecond
				args := []string{"--group", group, "--sm", strconv.Itoa(5 + randN(30)), "--mem", strconv.Itoa(256+randN(1024)) + "M", "--"}
				// Every command says on stderr that it ran, under which lease
				// and attempt (chaosRanMark), so the tally can tell a launcher
				// that gave up before its grant from one that had a lease.
				if randN(12) == 0 {
					clientFaults.Add(1)
					// A client that faults on its first run only.
					args = append(args, "/bin/sh", "-c", chaosMark+`if [ "$MPSD_ATTEMPT" = 1 ]; then exec "$0" --fault-after 100ms --duration 1m; else exec "$0" --duration 300ms; fi`, client)
				} else {
					args = append(args, "/bin/sh", "-c", chaosMark+`exec "$0" --duration "$1"`, client, dur.String())
				}
				j := &chaosJob{id: w*100000 + n, group: group}
				p := startProc(t, e.launch(args...))
				jmu.Lock()
				jobs = append(jobs, j)
				live[p] = j
				jmu.Unlock()
				j.res = p.waitQuiet(2 * time.Minute)
				jmu.Lock()
				delete(live, p)
				jmu.Unlock()
			}
		})
	}

	pickInstance := func(st api.Status, withServer bool) (api.InstanceStatus, bool) {
		var c []api.InstanceStatus
		for _, in := range st.Instances {
			if in.State == api.InstanceReady && in.DaemonPID > 0 && (!withServer || len(in.ServerPIDs) > 0) {
				c = append(c, in)
			}
		}
		if len(c) == 0 {
			return api.InstanceStatus{}, false
		}
		return c[randN(len(c))], true
	}
	checkAccounting := func(when string) {
		st := status()
		for _, in := range st.Instances {
			sm, mem, n := 0, int64(0), 0
			for _, l := range st.Leases {
				if l.State == api.LeaseRunning && l.Group == in.Group && len(l.GPUIndexes) > 0 && l.GPUIndexes[0] == in.GPUIndex {
					sm, mem, n = sm+l.SM, mem+l.MemBytes, n+1
				}
			}
			if sm != in.SMAllocated || mem != in.MemAllocatedBytes || n != in.Clients {
				t.Errorf("%s: instance %s/%d accounts sm %d mem %d clients %d; its leases hold sm %d mem %d clients %d",
					when, in.Group, in.GPUIndex, in.SMAllocated, in.MemAllocatedBytes, in.Clients, sm, mem, n)
			}
		}
	}

	end := time.Now().Add(duration)
	for time.Now().Before(end) && !t.Failed() {
		time.Sleep(time.Duration(50+randN(200)) * time.Millisecond)
		st := status()
		kind := []string{"server_kill", "server_kill", "daemon_kill", "daemon_stop", "xid", "launcher_kill", "launcher_kill", "mpsd_restart", "mpsd_kill", "config_garbage", "server_kill_mpsd_down"}[randN(11)]
		switch kind {
		case "server_kill":
			if in, ok := pickInstance(st, true); ok {
				touch(in.Group, in.GPUIndex)
				_ = syscall.Kill(in.ServerPIDs[0], syscall.SIGKILL)
			} else {
				continue
			}
		case "daemon_kill":
			if in, ok := pickInstance(st, false); ok {
				touch(in.Group, in.GPUIndex)
				_ = syscall.Kill(in.DaemonPID, syscall.SIGKILL)
			} else {
				continue
			}
		case "daemon_stop":
			if in, ok := pickInstance(st, false); ok {
				touch(in.Group, in.GPUIndex)
				_ = syscall.Kill(in.DaemonPID, syscall.SIGSTOP)
			} else {
				continue
			}
		case "xid":
			gpu := randN(3)
			fmu.Lock()
			touchedGPU[gpu] = time.Now()
			fmu.Unlock()
			emu.Lock()
			err := e.sim.InjectXid(gpu, 79, 0)
			emu.Unlock()
			if err != nil {
				continue
			}
		case "launcher_kill":
			jmu.Lock()
			var victim *proc
			for p, j := range live {
				victim = p
				j.killed = true
				break
			}
			jmu.Unlock()
			if victim == nil {
				continue
			}
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		case "mpsd_restart":
			emu.Lock()
			e.stop()
			e.start()
			emu.Unlock()
		case "mpsd_kill":
			// As a SIGKILL leaves it: the state as last written, nothing
			// saved on the way out. (mpsd runs in this process, so it is
			// told to stop without its last write rather than killed.)
			emu.Lock()
			e.d.crashStop.Store(true)
			e.stop()
			e.start()
			emu.Unlock()
		case "server_kill_mpsd_down":
			in, ok := pickInstance(st, true)
			if !ok {
				continue
			}
			touch(in.Group, in.GPUIndex)
			emu.Lock()
			e.stop()
			_ = syscall.Kill(in.ServerPIDs[0], syscall.SIGKILL)
			e.start()
			emu.Unlock()
		case "config_garbage":
			if err := os.WriteFile(e.cfgPath, []byte("version: 1\ngroups: {a: {memroy: 1G}}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			e.writeConfig(chaosGroups, chaosWatchdog)
		}
		counts[kind]++
		checkAccounting("after " + kind)
	}
	close(stop)
	// What is still waiting when the injections stop: a job that then
	// never ends shows here.
	st := status()
	for _, in := range st.Instances {
		t.Logf("at the end of the injections: instance %s/%d %s, %d clients, restarts %d", in.Group, in.GPUIndex, in.State, in.Clients, in.Restarts)
	}
	for _, l := range st.Leases {
		t.Logf("at the end of the injections: lease %s %s attempt %d gpus %v", l.ID, l.State, l.Attempt, l.GPUIndexes)
	}
	wg.Wait()
	counts["client_fault"] = int(clientFaults.Load())
	total := 0
	for _, n := range counts {
		total += n
	}
	t.Logf("chaos soak: %d faults injected: %v; %d jobs", total, counts, len(jobs))

	// Every job completed, or gave up for a reason the soak allows (see
	// classifyChaosEnd); a job whose launcher the soak killed is exempt.
	// Unreachable after a grant and protocol violations always fail.
	tally := newChaosTally(e.socket)
	for _, j := range jobs {
		tally.add(j)
	}
	for _, line := range tally.lines() {
		t.Log(line)
	}
	for _, f := range tally.failures() {
		t.Error(f)
	}
	fmu.Lock()
	if len(collateral) > 0 {
		t.Errorf("%d faults on instances the soak did not touch (collateral damage), first: %s", len(collateral), strings.Join(collateral[:min(5, len(collateral))], "; "))
	} else {
		t.Logf("no collateral damage: every fault was on an instance or GPU the soak hit, or a client's own")
	}
	fmu.Unlock()
	// Nothing leaked: the leases of killed launchers are released once
	// their processes are gone.
	e.waitStatus("no leases left", func(st api.Status) bool { return len(st.Leases) == 0 })
	checkAccounting("at the end")
	// Reconciliation (reconcile: terminate) found no unleased client and
	// no process beside MPS: every client of the soak ran under a lease.
	// The log spans mpsd's restarts; the metric would not. A lease process
	// on another instance's server (wrong_instance) is logged, not failed:
	// the soak has shown one after an mpsd restart, a lease granted anew
	// elsewhere while its command ran on, which is the lease's placement
	// going wrong, not reconciliation; its lines are logged to trace it.
	if b, err := os.ReadFile(e.log.Name()); err != nil {
		t.Error(err)
	} else {
		n := 0
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if !bytes.Contains(line, []byte(reconLogMsg)) {
				continue
			}
			n++
			if !bytes.Contains(line, []byte("kind="+reconWrongInstance)) {
				t.Errorf("reconciliation reported a process of the soak as unaccounted: %s", line)
				continue
			}
			t.Logf("a lease process on another instance's server: %s", line)
			for _, f := range bytes.Fields(line) {
				if id, ok := bytes.CutPrefix(f, []byte("lease=")); ok {
					for l2 := range bytes.SplitSeq(b, []byte("\n")) {
						if bytes.Contains(l2, id) {
							t.Logf("  %s", l2)
						}
					}
				}
			}
		}
		if n == 0 {
			t.Logf("reconciliation (terminate) found no process outside its lease")
		}
	}
	e.noLeaks(t)
	if !t.Failed() {
		t.Logf("capacity accounting equalled the live leases after each of the %d injections and at the end; no leases, processes or cgroups left", total-counts["client_fault"])
	}
	if t.Failed() {
		t.Logf("replay with MPSD_CHAOS_SEED=%d", seed)
		keepLog(t, e.log.Name())
	}
}

// keepLog copies mpsd's whole log (all its restarts) into the test's
// artifact directory, kept under -outputdir when go test runs with
// -artifacts (make chaos does), so a failed soak can be read in full.
func keepLog(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("keeping mpsd's log: %v", err)
		return
	}
	kept := filepath.Join(t.ArtifactDir(), "mpsd.log")
	if err := os.WriteFile(kept, b, 0o644); err != nil {
		t.Errorf("keeping mpsd's log: %v", err)
		return
	}
	t.Logf("mpsd's log (%d bytes): %s", len(b), kept)
}

// chaosMark starts every soak command's shell: it says on stderr that the
// command ran, which only happens after a grant and the attach.
const chaosMark = `echo "` + chaosRanMark + ` $MPSD_LEASE_ID attempt $MPSD_ATTEMPT" >&2; `

const chaosRanMark = "chaos: ran under lease"

// chaosEnd is how a soak job ended, as the tally counts it.
type chaosEnd int

const (
	endCompleted chaosEnd = iota // exit 0, never told to go on without a lease
	endKilled                    // the soak killed its mps-launch
	// endInjected: gave up for a reason one of the soak's injections
	// gives (chaosInjectedReasons).
	endInjected
	endUnreachableBeforeGrant // mpsd was away (restarted) before the launcher had a lease
	endUnreachableAfterGrant  // mpsd was away after the grant: the lease was lost
	endProtocol               // a protocol violation, before or after a grant
	endOther                  // a reason no injection gives
	endNoReason               // any other exit, or 75/125 without a reason line
	// endUnreachable125: gave up because mpsd was unreachable, with exit
	// 125 instead of 75 (Slurm's RequeueExit=75 would not requeue it);
	// only a socket that was never there may end so.
	endUnreachable125
	chaosEnds
)

var chaosEndNames = [chaosEnds]string{
	endCompleted:              "completed",
	endKilled:                 "had their mps-launch killed by the soak",
	endInjected:               "gave up because of an injected fault",
	endUnreachableBeforeGrant: "gave up: mpsd unreachable before a grant",
	endUnreachableAfterGrant:  "gave up: mpsd unreachable after a grant",
	endProtocol:               "protocol violation",
	endOther:                  "gave up for a reason not allowed",
	endNoReason:               "ended without a reason",
	endUnreachable125:         "gave up: mpsd unreachable, with exit 125",
}

// chaosEndFails says which ends fail the soak.
var chaosEndFails = [chaosEnds]bool{
	endUnreachableAfterGrant: true,
	endProtocol:              true,
	endOther:                 true,
	endNoReason:              true,
	endUnreachable125:        true,
}

// chaosInjectedReasons are the give-ups the soak allows, with the
// injection that causes each: mpsd answers a request that arrives while
// it stops (mpsd_restart, mpsd_kill, server_kill_mpsd_down) with 503
// unavailable. Every other reason but mpsd being unreachable before a
// grant fails the soak: no group is removed (config_garbage is never
// applied), and with requeue_attempts 1000 no lease runs out of attempts.
var chaosInjectedReasons = []struct{ contains, injection string }{
	{"mpsd is stopping", "mpsd stopped (mpsd_restart, mpsd_kill, server_kill_mpsd_down)"},
}

// classifyChaosEnd says how a job whose launcher the soak did not kill
// ended, from its exit status and stderr, and the reason line it gave
// (after "mps-launch: "; "" if none). Whether the launcher had a lease
// when it gave up comes from what it printed: its command's chaosRanMark,
// a requeue notice, or an attach failure naming the lease.
func classifyChaosEnd(code int, stderr string) (chaosEnd, string) {
	var reason string
	for _, line := range strings.Split(stderr, "\n") {
		msg, ok := strings.CutPrefix(line, "mps-launch: ")
		if !ok || strings.Contains(msg, "); requeued, attempt ") || strings.HasSuffix(msg, " was lost while mpsd was away; requesting a new one") {
			// Progress, not an end: the lease was requeued, or a lease
			// mpsd had not yet written when it went is asked for anew
			// (nothing ran under it).
			continue
		}
		reason = msg
	}
	switch {
	case strings.Contains(stderr, "protocol violation"):
		// Also in a line the command went on after (exit 0).
		return endProtocol, reason
	case code == 0 && reason == "":
		return endCompleted, ""
	case code != 0 && code != 75 && code != 125, reason == "":
		return endNoReason, reason
	}
	granted := strings.Contains(stderr, chaosRanMark) || strings.Contains(stderr, "); requeued, attempt ") ||
		strings.Contains(reason, " to lease ") || strings.Contains(reason, "without a lease") || strings.Contains(reason, "mpsd ends the command")
	// mpsd cannot be connected to, or went away in the middle of a request
	// (it stopped: the connection ended before the answer).
	unreachable := strings.Contains(reason, "cannot reach mpsd") || strings.Contains(reason, "lost mpsd") ||
		strings.HasSuffix(reason, ": EOF") || strings.Contains(reason, "connection reset by peer")
	if unreachable {
		// A socket that was never there (a wrong path) fails at once with
		// 125; mpsd gone is 75.
		neverThere := strings.HasPrefix(reason, "cannot reach mpsd") && strings.Contains(reason, "no such file or directory")
		if code == 125 && !neverThere {
			return endUnreachable125, reason
		}
		if granted {
			return endUnreachableAfterGrant, reason
		}
		return endUnreachableBeforeGrant, reason
	}
	for _, r := range chaosInjectedReasons {
		if strings.Contains(reason, r.contains) {
			return endInjected, reason
		}
	}
	return endOther, reason
}

// chaosTally counts how the soak's jobs ended and keeps examples of those
// that fail it.
type chaosTally struct {
	jobs     int
	n        [chaosEnds]int
	reasons  [chaosEnds]map[string]int // "exit N reason" → count
	examples [chaosEnds][]string
	socket   string // replaced in reasons, so they group
}

func newChaosTally(socket string) *chaosTally {
	t := &chaosTally{socket: socket}
	for i := range t.reasons {
		t.reasons[i] = map[string]int{}
	}
	return t
}

func (t *chaosTally) add(j *chaosJob) {
	t.jobs++
	end, reason := endKilled, ""
	if !j.killed {
		end, reason = classifyChaosEnd(j.res.code, j.res.stderr)
	}
	t.n[end]++
	if reason != "" {
		if t.socket != "" {
			reason = strings.ReplaceAll(reason, t.socket, "<socket>")
		}
		reason = reason[:min(len(reason), 100)]
		t.reasons[end][fmt.Sprintf("exit %d: %s", j.res.code, reason)]++
	}
	if chaosEndFails[end] && len(t.examples[end]) < 5 {
		t.examples[end] = append(t.examples[end], fmt.Sprintf("job %d (group %s) exit %d, stderr %q", j.id, j.group, j.res.code, j.res.stderr))
	}
}

// lines is the tally for the log: one line with every count, then one per
// distinct reason.
func (t *chaosTally) lines() []string {
	parts := make([]string, 0, chaosEnds)
	for e := range chaosEnds {
		parts = append(parts, fmt.Sprintf("%d %s", t.n[e], chaosEndNames[e]))
	}
	out := []string{fmt.Sprintf("chaos tally: %d jobs: %s", t.jobs, strings.Join(parts, ", "))}
	for e := range chaosEnds {
		keys := make([]string, 0, len(t.reasons[e]))
		for r := range t.reasons[e] {
			keys = append(keys, r)
		}
		slices.Sort(keys)
		for _, r := range keys {
			out = append(out, fmt.Sprintf("chaos tally: %s: %d× %s", chaosEndNames[e], t.reasons[e][r], r))
		}
	}
	return out
}

// failures is one message per end that fails the soak, with examples.
func (t *chaosTally) failures() []string {
	var out []string
	for e := range chaosEnds {
		if chaosEndFails[e] && t.n[e] > 0 {
			out = append(out, fmt.Sprintf("%d jobs: %s; first: %s", t.n[e], chaosEndNames[e], strings.Join(t.examples[e], "; ")))
		}
	}
	return out
}

// The soak's oracle tells the ways a job can end apart, from what
// mps-launch and the command print.
func TestClassifyChaosEnd(t *testing.T) {
	const (
		ran        = chaosRanMark + " l-1 attempt 1\n"
		requeued   = "mps-launch: lease l-1 revoked (server exited); requeued, attempt 2\n"
		unreach    = "mps-launch: cannot reach mpsd at /run/mpsd/mpsd.sock: connection refused (is mpsd running? --socket or $MPSD_SOCKET names another socket)\n"
		lost       = "mps-launch: lost mpsd after 1m0s: cannot reach mpsd at /s: no such file or directory (is mpsd running?)\n"
		stopping   = "mps-launch: mpsd is stopping\n"
		protocol   = "mps-launch: protocol violation: revoked before any lease was granted\n"
		attachLost = "mps-launch: attach pid 42 to lease l-1: cannot reach mpsd at /s: connection refused\n"
		detached   = "mps-launch: lost mpsd after 1m0s: cannot reach mpsd at /s: connection refused; the command runs on without a lease, until an mpsd that comes back ends it\n"
		detachedP  = "mps-launch: protocol violation: granted lease l-2 while the command runs under lease l-1; mpsd ends the command as it releases the lease\n"
	)
	for _, tc := range []struct {
		name   string
		code   int
		stderr string
		want   chaosEnd
	}{
		{"completed", 0, ran, endCompleted},
		{"completed after a requeue", 0, ran + requeued + ran, endCompleted},
		{"completed after its unwritten lease was asked for anew", 0, "mps-launch: lease l-0 was lost while mpsd was away; requesting a new one\n" + ran, endCompleted},
		{"lost, asked for anew, then mpsd unreachable", 75, "mps-launch: lease l-0 was lost while mpsd was away; requesting a new one\n" + lost, endUnreachableBeforeGrant},
		{"unreachable at the first request", 75, unreach, endUnreachableBeforeGrant},
		{"no socket at the first request", 125, "mps-launch: cannot reach mpsd at /s: no such file or directory (is mpsd running?)\n", endUnreachableBeforeGrant},
		{"lost while queued", 75, lost, endUnreachableBeforeGrant},
		{"lost while queued, exit 125", 125, lost, endUnreachable125},
		{"lost while the command ran", 75, ran + lost, endUnreachableAfterGrant},
		{"lost while the command ran, exit 125", 125, ran + lost, endUnreachable125},
		{"lost while requeued", 75, ran + requeued + lost, endUnreachableAfterGrant},
		{"attach could not reach mpsd", 75, attachLost, endUnreachableAfterGrant},
		{"mpsd stopped during the attach", 75, "mps-launch: attach pid 42 to lease l-1: launcher: POST /v1/leases/l-1/attach via /s: Post \"http://mpsd/v1/leases/l-1/attach\": EOF\n", endUnreachableAfterGrant},
		{"detached after losing mpsd", 0, ran + detached, endUnreachableAfterGrant},
		{"mpsd stopping", 75, stopping, endInjected},
		{"protocol violation", 125, protocol, endProtocol},
		{"protocol violation, command went on", 0, ran + detachedP, endProtocol},
		{"attempts used up", 75, ran + "mps-launch: lease revoked: server exited; no requeue attempts left (3 used)\n", endOther},
		{"refused", 125, "mps-launch: group z is not in the config\n", endOther},
		{"temporary exit without a reason", 75, ran, endNoReason},
		{"the command's own failure", 70, ran + "mpsemu-client: CUDA error 700 cudaErrorIllegalAddress: fault\n", endNoReason},
		{"killed in time", -1, ran + "(killed: did not end in time)", endNoReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, reason := classifyChaosEnd(tc.code, tc.stderr); got != tc.want {
				t.Errorf("classifyChaosEnd(%d, %q) = %s (reason %q), want %s", tc.code, tc.stderr, chaosEndNames[got], reason, chaosEndNames[tc.want])
			}
		})
	}
}

// The tally fails the soak on the ends that must not happen, and only on
// those.
func TestChaosTallyFailures(t *testing.T) {
	tally := newChaosTally("/s")
	tally.add(&chaosJob{id: 1, res: result{code: 0, stderr: chaosRanMark + " l-1 attempt 1\n"}})
	tally.add(&chaosJob{id: 2, killed: true, res: result{code: -1}})
	tally.add(&chaosJob{id: 3, res: result{code: 75, stderr: "mps-launch: cannot reach mpsd at /s: connection refused\n"}})
	tally.add(&chaosJob{id: 4, res: result{code: 75, stderr: "mps-launch: mpsd is stopping\n"}})
	if f := tally.failures(); len(f) != 0 {
		t.Errorf("allowed ends fail the soak: %q", f)
	}
	if got := tally.lines()[0]; !strings.Contains(got, "4 jobs: 1 completed, 1 had their mps-launch killed by the soak, 1 gave up because of an injected fault, 1 gave up: mpsd unreachable before a grant, 0 gave up: mpsd unreachable after a grant") {
		t.Errorf("tally line %q", got)
	}
	tally.add(&chaosJob{id: 5, res: result{code: 75, stderr: chaosRanMark + " l-5 attempt 1\nmps-launch: lost mpsd after 1m0s: cannot reach mpsd at /s: refused\n"}})
	f := tally.failures()
	if len(f) != 1 || !strings.Contains(f[0], "unreachable after a grant") || !strings.Contains(f[0], "job 5") {
		t.Errorf("unreachable after a grant: failures %q, want one naming job 5", f)
	}
	// Giving up on mpsd with 125 (which Slurm's RequeueExit=75 does not
	// requeue) fails the soak even before a grant.
	tally.add(&chaosJob{id: 6, res: result{code: 125, stderr: "mps-launch: lost mpsd after 1m0s: cannot reach mpsd at /s: refused\n"}})
	f = tally.failures()
	if len(f) != 2 || !strings.Contains(f[1], "with exit 125") || !strings.Contains(f[1], "job 6") {
		t.Errorf("unreachable with exit 125: failures %q, want a second naming job 6", f)
	}
}
