package mpsd

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
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
// end that every job completed or ended with a reported reason, that every
// revocation was caused by an injected fault, and that nothing leaked.
//
// Its jobs run as real unprivileged uids: group a (no multiuser) has three
// members, so MPS switches its servers' uid all the time, which is
// ordinary traffic, never a fault; group b shares one server among its
// members (multiuser). Some jobs are culprits: their client raises a fatal
// GPU fault when the soak tells it to (an injection like the others),
// which takes every client of its server with it.

// chaosMembers are the uids each group's jobs run as (chaosGroups names
// them), as numbers: they need no account on the host.
var chaosMembers = map[string][]uint32{
	"a": {64910, 64911, 64912},
	"b": {64913, 64914},
}

const chaosGroups = `  a:
    users: ["64910", "64911", "64912"]
    memory: 20G
    requeue_attempts: 1000
    reconcile: terminate
  b:
    users: ["64913", "64914"]
    multiuser: true
    memory: 10G
    requeue_attempts: 1000
    reconcile: terminate
`

// chaosWatchdog: fast detection, restarts and backoff, and no quarantine.
// A probe waits up to 500 ms: on the 2-core test host under -race, with
// dozens of launches, an emulated control daemon that answers its
// commands in turn can take a few hundred ms, and a hang the soak did not
// inject would revoke leases (a false revocation).
const chaosWatchdog = `watchdog:
  probe_interval: 600ms
  probe_timeout: 500ms
  probe_failures: 2
  backoff_initial: 10ms
  backoff_max: 200ms
  quarantine_after: 1000
  quarantine_window: 1m`

type chaosJob struct {
	id     int
	group  string
	uid    uint32
	killed bool // the soak killed its mps-launch on purpose
	// out is a culprit's stdout, where its client says its pid once it
	// is connected (and so faults on SIGUSR1); nil for other jobs.
	out *syncBuffer
	res result
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
	// Every injection that can take a lease down, with the processes it
	// hit, for the revocation tally (explainRevocation).
	var injections []chaosInjection
	// inject records an injection on an instance (group "": on a whole
	// GPU) just before the soak makes it.
	inject := func(kind, group string, gpu int, pids ...int) {
		fmu.Lock()
		defer fmu.Unlock()
		now := time.Now()
		if group == "" {
			touchedGPU[gpu] = now
		} else {
			touched[instanceKey(group, []int{gpu})] = now
		}
		injections = append(injections, chaosInjection{kind: kind, group: group, gpu: gpu, at: now, pids: pids})
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
	var culprits atomic.Int64 // jobs whose client faults when told to
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
				// A member picked at random: in group a, MPS switches its
				// server's uid whenever the next job is another member's.
				members := chaosMembers[group]
				j := &chaosJob{id: w*100000 + n, group: group, uid: members[randN(len(members))]}
				dur := time.Duration(200+randN(1500)) * time.Millisecond
				args := []string{"--group", group, "--sm", strconv.Itoa(5 + randN(30)), "--mem", strconv.Itoa(256+randN(1024)) + "M", "--"}
				// Every command says on stderr that it ran, under which lease
				// and attempt (chaosRanMark), so the tally can tell a launcher
				// that gave up before its grant from one that had a lease.
				if randN(6) == 0 {
					// A culprit: its client raises a fatal GPU fault when
					// the soak sends it SIGUSR1 (culprit_fault), on any run.
					culprits.Add(1)
					j.out = &syncBuffer{}
					dur += time.Second
					args = append(args, "/bin/sh", "-c", chaosMark+`exec "$0" --fault-on-usr1 --duration "$1"`, client, dur.String())
				} else {
					args = append(args, "/bin/sh", "-c", chaosMark+`exec "$0" --duration "$1"`, client, dur.String())
				}
				cmd := asUID(e.launch(args...), j.uid)
				if j.out != nil {
					cmd.Stdout = j.out
				}
				p := startProc(t, cmd)
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
	// pickCulprit finds a culprit's client that is connected to its MPS
	// server (it printed its pid, so it handles SIGUSR1 by now) under a
	// running lease: its pid and its instance.
	pickCulprit := func(st api.Status) (pid int, group string, gpu int, ok bool) {
		connected := map[int]bool{}
		jmu.Lock()
		for _, j := range live {
			if j.out == nil {
				continue
			}
			for line := range strings.Lines(j.out.String()) {
				if rest, found := strings.CutPrefix(line, "mpsemu-client: pid="); found {
					pid, _, _ := strings.Cut(rest, " ")
					if n, err := strconv.Atoi(pid); err == nil {
						connected[n] = true
					}
				}
			}
		}
		jmu.Unlock()
		type cand struct {
			pid   int
			group string
			gpu   int
		}
		var c []cand
		for _, l := range st.Leases {
			if l.State != api.LeaseRunning || len(l.GPUIndexes) == 0 {
				continue
			}
			for _, p := range l.PIDs {
				if connected[p] {
					c = append(c, cand{p, l.Group, l.GPUIndexes[0]})
				}
			}
		}
		if len(c) == 0 {
			return 0, "", 0, false
		}
		x := c[randN(len(c))]
		return x.pid, x.group, x.gpu, true
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
		kind := []string{"server_kill", "server_kill", "daemon_kill", "daemon_stop", "xid", "launcher_kill", "launcher_kill", "mpsd_restart", "mpsd_kill", "config_garbage", "server_kill_mpsd_down", "culprit_fault", "culprit_fault"}[randN(13)]
		switch kind {
		case "server_kill":
			if in, ok := pickInstance(st, true); ok {
				inject(kind, in.Group, in.GPUIndex, in.ServerPIDs[0])
				_ = syscall.Kill(in.ServerPIDs[0], syscall.SIGKILL)
			} else {
				continue
			}
		case "daemon_kill", "daemon_stop":
			// Its servers go with it (daemon_stop: once mpsd stops it).
			if in, ok := pickInstance(st, false); ok {
				inject(kind, in.Group, in.GPUIndex, append([]int{in.DaemonPID}, in.ServerPIDs...)...)
				sig := syscall.SIGKILL
				if kind == "daemon_stop" {
					sig = syscall.SIGSTOP
				}
				_ = syscall.Kill(in.DaemonPID, sig)
			} else {
				continue
			}
		case "culprit_fault":
			pid, group, gpu, ok := pickCulprit(st)
			if !ok {
				continue
			}
			inject(kind, group, gpu, pid)
			_ = syscall.Kill(pid, syscall.SIGUSR1)
		case "xid":
			gpu := randN(3)
			inject(kind, "", gpu)
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
			inject(kind, in.Group, in.GPUIndex, in.ServerPIDs[0])
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
	total := 0
	for _, n := range counts {
		total += n
	}
	t.Logf("chaos soak: %d faults injected: %v; %d jobs (%d culprits, which fault when told to)", total, counts, len(jobs), culprits.Load())

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
	// Every revocation mpsd made (its log spans its restarts) has a cause
	// among the injections: a uid switch or any other ordinary exit of a
	// server revokes nothing.
	if b, err := os.ReadFile(e.log.Name()); err != nil {
		t.Error(err)
	} else {
		fmu.Lock()
		inj := slices.Clone(injections)
		fmu.Unlock()
		causes := map[string]int{}
		var falseRevs []string
		revs := parseChaosRevocations(b)
		for _, r := range revs {
			if cause, ok := explainRevocation(r, inj); ok {
				causes[cause]++
			} else {
				falseRevs = append(falseRevs, r.line)
			}
		}
		requeuedJobs := 0
		for _, j := range jobs {
			if strings.Contains(j.res.stderr, "); requeued, attempt ") {
				requeuedJobs++
			}
		}
		switches, starts, err := countChaosUIDSwitches(filepath.Join(e.dir, "log"))
		if err != nil {
			t.Errorf("counting MPS's uid switches: %v", err)
		}
		t.Logf("revocation tally: %d jobs, %d completed, %d requeued at least once; %d revocations caused by an injection %v, %d false revocations; %d culprit faults injected; MPS started %d servers, %d of them for another uid than the one before (a uid switch), and mpsd took %d servers' clean exits for no fault",
			len(jobs), tally.n[endCompleted], requeuedJobs, len(revs)-len(falseRevs), causes, len(falseRevs),
			counts["culprit_fault"], starts, switches, bytes.Count(b, []byte(chaosCleanExitMsg))+bytes.Count(b, []byte(chaosNoClientExitMsg)))
		if len(falseRevs) > 0 {
			t.Errorf("%d false revocations (no injected fault on their instance explains them):\n%s", len(falseRevs), strings.Join(falseRevs[:min(10, len(falseRevs))], "\n"))
		}
	}
	e.noLeaks(t)
	if !t.Failed() {
		t.Logf("capacity accounting equalled the live leases after each of the %d injections and at the end; no leases, processes or cgroups left", total)
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
		if !ok || strings.Contains(msg, "); requeued, attempt ") || strings.HasSuffix(msg, " was lost while mpsd was away; requesting a new one") || waitLogLine(msg) {
			// Progress, not an end: the lease was requeued, or a lease
			// mpsd had not yet written when it went is asked for anew
			// (nothing ran under it), or the launch logged its wait.
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

// How mpsd logs a server's exit that it takes for no fault: MPS ended it
// after its last client left (a uid switch, above all), or none of the
// instance's leases could have been its client.
const (
	chaosCleanExitMsg    = "MPS server exited after its last client left"
	chaosNoClientExitMsg = "MPS server exited; no lease on the instance was its client"
)

// chaosInjection is one injection of the soak that can take leases down:
// its kind, its instance (group "" for every instance on the GPU), when it
// was made and the MPS processes it hit (the server killed; the daemon
// killed or stopped and the servers it had then; the culprit client).
type chaosInjection struct {
	kind  string
	group string
	gpu   int
	at    time.Time
	pids  []int
}

// chaosRevocation is one "lease revoked" line of mpsd's log.
type chaosRevocation struct {
	at     time.Time
	group  string
	gpu    int // -1 when the line names none
	lease  string
	reason string
	line   string
}

// parseSlogText splits a line of slog's text handler into its attributes.
func parseSlogText(line string) map[string]string {
	attrs := map[string]string{}
	for line = strings.TrimSpace(line); line != ""; line = strings.TrimLeft(line, " ") {
		key, rest, ok := strings.Cut(line, "=")
		if !ok {
			break
		}
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				break
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			val, rest, _ = strings.Cut(rest, " ")
		}
		attrs[key] = val
		line = rest
	}
	return attrs
}

// parseChaosRevocations finds every revocation in mpsd's log.
func parseChaosRevocations(log []byte) []chaosRevocation {
	var out []chaosRevocation
	for line := range strings.Lines(string(log)) {
		if !strings.Contains(line, `msg="lease revoked`) {
			continue
		}
		line = strings.TrimSuffix(line, "\n")
		a := parseSlogText(line)
		r := chaosRevocation{group: a["group"], gpu: -1, lease: a["lease"], reason: a["reason"], line: line}
		r.at, _ = time.Parse(time.RFC3339Nano, a["time"])
		if n, err := strconv.Atoi(a["gpu_index"]); err == nil {
			r.gpu = n
		}
		if r.reason == "" {
			r.reason = a["msg"]
		}
		out = append(out, r)
	}
	return out
}

// The revocation reasons of mpsd's faults (mpsd's fault reasons), by what
// they name.
var (
	reChaosServer      = regexp.MustCompile(`^MPS server (\d+) of group (\S+) on GPU (\d+) (?:died|exited while mpsd was away)`)
	reChaosDaemonExit  = regexp.MustCompile(`^MPS control daemon (\d+) of group (\S+) on GPU (\d+) exited`)
	reChaosDaemonGone  = regexp.MustCompile(`control daemon of group (\S+) on GPU (\d+) (?:stopped answering|was gone or hung when mpsd started|does not answer after a fault)`)
	reChaosClientFault = regexp.MustCompile(`^a client of group (\S+) on GPU (\d+) hit a fatal GPU error`)
	reChaosXid         = regexp.MustCompile(`^Xid (\d+) \((\w+)-level\) on GPU (\d+)`)
)

const (
	// chaosCauseWindow bounds how long after an injection a revocation it
	// causes comes without naming the process hit: detection (probes),
	// an mpsd restart's adoption, a fault record's wait for its Xid.
	chaosCauseWindow = 30 * time.Second
	// chaosMissedServerWindow bounds the revocation by a server the soak
	// did not see when it killed or stopped its daemon (one started
	// meanwhile).
	chaosMissedServerWindow = 5 * time.Second
	// chaosLogSlack: the log's times are to the millisecond.
	chaosLogSlack = 5 * time.Millisecond
)

// explainRevocation says which injection caused the revocation r, by its
// reason: a server or daemon the reason names by pid that an injection hit;
// a hung or lost daemon of an instance whose daemon the soak killed or
// stopped; a client's fault (its record, or its application Xid) on an
// instance where the soak made a culprit fault; a device Xid on a GPU the
// soak raised one on. Anything else (a server's ordinary exit, a uid
// switch above all, taken for a crash) has no cause: a false revocation.
func explainRevocation(r chaosRevocation, inj []chaosInjection) (string, bool) {
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	find := func(group string, gpu int, window time.Duration, ok func(chaosInjection) bool) (string, bool) {
		for i := len(inj) - 1; i >= 0; i-- {
			in := inj[i]
			if in.group != group || in.gpu != gpu || r.at.Before(in.at.Add(-chaosLogSlack)) ||
				(window > 0 && r.at.Sub(in.at) > window) || !ok(in) {
				continue
			}
			return in.kind, true
		}
		return "", false
	}
	hit := func(pid int) func(chaosInjection) bool {
		return func(in chaosInjection) bool { return slices.Contains(in.pids, pid) }
	}
	kinds := func(k ...string) func(chaosInjection) bool {
		return func(in chaosInjection) bool { return slices.Contains(k, in.kind) }
	}
	if m := reChaosServer.FindStringSubmatch(r.reason); m != nil {
		if k, ok := find(m[2], atoi(m[3]), 0, hit(atoi(m[1]))); ok {
			return k, true
		}
		return find(m[2], atoi(m[3]), chaosMissedServerWindow, kinds("daemon_kill", "daemon_stop"))
	}
	if m := reChaosDaemonExit.FindStringSubmatch(r.reason); m != nil {
		return find(m[2], atoi(m[3]), 0, hit(atoi(m[1])))
	}
	if m := reChaosDaemonGone.FindStringSubmatch(r.reason); m != nil {
		return find(m[1], atoi(m[2]), chaosCauseWindow, kinds("daemon_kill", "daemon_stop"))
	}
	if m := reChaosClientFault.FindStringSubmatch(r.reason); m != nil {
		return find(m[1], atoi(m[2]), chaosCauseWindow, kinds("culprit_fault"))
	}
	if m := reChaosXid.FindStringSubmatch(r.reason); m != nil {
		if m[2] == "device" {
			return find("", atoi(m[3]), chaosCauseWindow, kinds("xid"))
		}
		// An application Xid names a lease's process: its client's own
		// fault, on the lease's instance.
		return find(r.group, atoi(m[3]), chaosCauseWindow, kinds("culprit_fault"))
	}
	return "", false
}

// countChaosUIDSwitches counts, in the emulated MPS control daemons' logs
// under dir, each server started for another uid than the previous
// server of the same daemon: MPS's uid switches.
func countChaosUIDSwitches(dir string) (switches, starts int, err error) {
	re := regexp.MustCompile(`Starting new server \d+ for user (\d+)`)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "control.log" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		prev := ""
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, "Starting control daemon") {
				prev = ""
			}
			if m := re.FindStringSubmatch(line); m != nil {
				starts++
				if prev != "" && m[1] != prev {
					switches++
				}
				prev = m[1]
			}
		}
		return nil
	})
	return switches, starts, err
}

// The revocation tally explains a revocation only by an injection that
// can cause it, on its instance (or GPU), after it: a server's exit the
// soak did not cause (a uid switch taken for a crash) is false.
func TestExplainRevocation(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	inj := []chaosInjection{
		{kind: "server_kill", group: "a", gpu: 0, at: t0, pids: []int{100}},
		{kind: "daemon_stop", group: "b", gpu: 1, at: t0, pids: []int{200, 201}},
		{kind: "culprit_fault", group: "a", gpu: 2, at: t0, pids: []int{300}},
		{kind: "xid", group: "", gpu: 1, at: t0},
	}
	line := func(at time.Duration, group string, gpu int, reason string) string {
		return fmt.Sprintf(`time=%s level=INFO msg="lease revoked" group=%s gpu=GPU-x gpu_index=%d lease=%s-1 job="" uid=64910 user="" attempt=1 reason=%q`,
			t0.Add(at).Format(time.RFC3339Nano), group, gpu, group, reason)
	}
	for _, tc := range []struct {
		line string
		want string // "" for a false revocation
	}{
		{line(time.Second, "a", 0, "MPS server 100 of group a on GPU 0 died (killed by SIGKILL)"), "server_kill"},
		{line(time.Second, "a", 0, "MPS server 100 of group a on GPU 0 exited while mpsd was away"), "server_kill"},
		{line(time.Second, "a", 0, "MPS server 101 of group a on GPU 0 died (exit status 0)"), ""},
		{line(-time.Second, "a", 0, "MPS server 100 of group a on GPU 0 died (killed by SIGKILL)"), ""},
		{line(time.Second, "b", 1, "MPS server 201 of group b on GPU 1 died (exit status 1)"), "daemon_stop"},
		{line(2*time.Second, "b", 1, "MPS server 202 of group b on GPU 1 died (exit status 1)"), "daemon_stop"},
		{line(time.Minute, "b", 1, "MPS server 202 of group b on GPU 1 died (exit status 1)"), ""},
		{line(time.Second, "b", 1, "MPS control daemon of group b on GPU 1 stopped answering (2 probes failed)"), "daemon_stop"},
		{line(time.Second, "b", 1, "the MPS control daemon of group b on GPU 1 was gone or hung when mpsd started; a new one runs"), "daemon_stop"},
		{line(time.Second, "a", 1, "MPS control daemon of group a on GPU 1 stopped answering (2 probes failed)"), ""},
		{line(time.Second, "b", 1, "MPS control daemon 200 of group b on GPU 1 exited (killed by SIGKILL)"), "daemon_stop"},
		{line(time.Second, "a", 2, "a client of group a on GPU 2 hit a fatal GPU error; MPS set a sticky error on every client of the server"), "culprit_fault"},
		{line(time.Second, "b", 2, "a client of group b on GPU 2 hit a fatal GPU error; MPS set a sticky error on every client of the server"), ""},
		{line(time.Second, "a", 2, "Xid 31 (application-level) on GPU 2"), "culprit_fault"},
		{line(time.Second, "a", 1, "Xid 79 (device-level) on GPU 1"), "xid"},
		{line(time.Second, "a", 0, "Xid 79 (device-level) on GPU 0"), ""},
		{line(time.Second, "a", 0, "something else"), ""},
	} {
		revs := parseChaosRevocations([]byte(tc.line + "\n"))
		if len(revs) != 1 {
			t.Fatalf("parseChaosRevocations(%q) = %+v, want one", tc.line, revs)
		}
		got, ok := explainRevocation(revs[0], inj)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("%s: explained by %q (%v), want %q", revs[0].reason, got, ok, tc.want)
		}
	}
}
