package mpsd

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
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
  b:
    users: [root]
    memory: 10G
    requeue_attempts: 1000
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
				if randN(12) == 0 {
					clientFaults.Add(1)
					// A client that faults on its first run only.
					args = append(args, "/bin/sh", "-c", `if [ "$MPSD_ATTEMPT" = 1 ]; then exec "$0" --fault-after 100ms --duration 1m; else exec "$0" --duration 300ms; fi`, client)
				} else {
					args = append(args, client, "--duration", dur.String())
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

	// Every job completed, or ended with a reason it reported; a job whose
	// launcher the soak killed is exempt.
	lost, done, gaveUp, killed := 0, 0, 0, 0
	reasons := map[string]int{}
	for _, j := range jobs {
		switch {
		case j.killed:
			killed++
		case j.res.code == 0:
			done++
		case (j.res.code == 75 || j.res.code == 125) && strings.Contains(j.res.stderr, "mps-launch: "):
			// Gave up with a reason: attempts used up, or mpsd was being
			// restarted when it tried to connect.
			gaveUp++
			reason := j.res.stderr[strings.LastIndex(j.res.stderr, "mps-launch: "):]
			reason, _, _ = strings.Cut(reason, "\n")
			reason = reason[:min(len(reason), 60)]
			reasons[fmt.Sprintf("%d %s", j.res.code, reason)]++
		default:
			lost++
			if lost <= 10 {
				t.Errorf("job %d (group %s) ended with %d and no reason: stderr %q", j.id, j.group, j.res.code, j.res.stderr)
			}
		}
	}
	if lost == 0 {
		t.Logf("none lost: %d jobs completed, %d gave up with a reason, %d had their mps-launch killed by the soak", done, gaveUp, killed)
	}
	for r, n := range reasons {
		t.Logf("gave up: %d× exit %s", n, r)
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
	e.noLeaks(t)
	if !t.Failed() {
		t.Logf("capacity accounting equalled the live leases after each of the %d injections and at the end; no leases, processes or cgroups left", total-counts["client_fault"])
	}
	if t.Failed() {
		t.Logf("replay with MPSD_CHAOS_SEED=%d", seed)
	}
}
