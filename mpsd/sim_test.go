package mpsd

// A deterministic, seeded simulation of mpsd's core decisions on a fake
// control daemon and a fake clock, in the manner of FoundationDB's
// simulation and TigerBeetle's VOPR: one seed fixes every choice, so a
// failing seed replays exactly.
//
// What runs is mpsd's own code for each decision: admission and the
// queue (Daemon.admit on the config's groups and members, scheduleLocked,
// grantLocked, positionsLocked; a refusal after a reload is failLocked's),
// a release's end (finishRelease), every lease transition (lease.step and
// its table), the MPS model (mpsModel: servers, uids, unleased holders,
// exit verdicts), placement (instance.policyViewAt and policy.Next, Assign
// and Release), a recovery's plan (planRecoveryLocked: culprits charged,
// quarantine, victims, spares), a clean exit's victims
// (exitVerdict.victims) and a requeue's charge (lease.requeueCharge). The
// control daemon is the emulator's scheduling (internal/mpsemu/mpssched,
// the one definition of MPS's rules the emulated nvidia-cuda-mps-control
// runs on), with servers and clients as records instead of processes. The
// glue of a revocation (its victims' processes killed, their capacity
// freed, the requeue) is the simulation's, kept to what those functions
// need.
//
// Each step picks one of: a request from one of several users of a group
// without multiuser and of a multiuser group, a client process starting
// or exiting, a server becoming ready, an MPS event reaching mpsd (a
// server's start or exit, an Xid), a client's fatal fault (its Xid names
// it: a culprit), a server crash, an Xid naming no process, a control
// daemon that stops answering, an unleased client started or gone, a
// reconciliation, a reload of the group's budget or of its multiuser (a
// restart of the daemon once the instance is empty), mpsctl resume, time
// passing, and mpsd restarts (mpsd away for some steps while MPS and the
// tenants go on). After every step the invariants are checked:
//   - no lease is revoked by an expected MPS transition (a uid switch, a
//     server MPS ended once idle, one mpsd shut down);
//   - no grant is one MPS makes wait: a granted client never waits behind
//     another uid's clients that mpsd knew of when it granted;
//   - an instance's allocation equals its leases', and the daemon's
//     leases are exactly the queued ones, each once in its group's queue,
//     and the running ones;
//   - a victim of another lease's fault keeps its requeue attempts, and
//     only a culprit spends one;
//   - quarantine and uid bars follow the rule, counted independently;
//   - a server lost while mpsd was away revokes only leases of its uid
//     (any, multiuser), and charges nobody: MPS may have ended it itself.
//
// Replay one seed: go test ./mpsd -run '^TestSimulation$' -sim.seed=N -v

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/clock"
	"github.com/mpsd/mpsd/internal/mpsemu/mpssched"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

var (
	simSeed  = flag.Uint64("sim.seed", 0, "TestSimulation: run this seed only (replay)")
	simSeeds = flag.Int("sim.seeds", 200, "TestSimulation: how many seeds")
	simSteps = flag.Int("sim.steps", 500, "TestSimulation: steps per seed")
)

func TestSimulation(t *testing.T) {
	seeds := make([]uint64, 0, *simSeeds)
	if *simSeed != 0 {
		seeds = append(seeds, *simSeed)
	} else {
		for i := range *simSeeds {
			seeds = append(seeds, uint64(i+1))
		}
	}
	totals := map[string]int{}
	for _, seed := range seeds {
		w, err := newSimWorld(seed)
		if err != nil {
			t.Fatal(err)
		}
		err = w.run(*simSteps)
		for k, v := range w.tally {
			totals[k] += v
		}
		if err != nil {
			t.Fatalf("seed %d, step %d: %v\nlast steps:\n%s\nreplay: go test ./mpsd -run '^TestSimulation$' -sim.seed=%d -sim.steps=%d -v",
				seed, w.step, err, w.traceTail(60), seed, *simSteps)
		}
		if *simSeed != 0 {
			t.Logf("trace:\n%s", strings.Join(w.trace, "\n"))
		}
	}
	t.Logf("%d seeds x %d steps: %v", len(seeds), *simSteps, totals)
	// The simulation is worth something only if it reached what it
	// checks: uid switches, culprit faults, spared victims, bars.
	if *simSeed == 0 {
		for _, k := range []string{"grant", "uid switch", "culprit fault", "spared victim", "crash", "uid barred", "unleased held", "daemon hang", "refused after a reload", "refused at admission", "mpsd restart", "server lost while away", "multiuser reload", "restart for multiuser"} {
			if totals[k] == 0 {
				t.Errorf("no %q in %d seeds: the simulation no longer explores it", k, len(seeds))
			}
		}
	}
}

// Leases per instance in the simulation, users per group.
const (
	simMaxLeases = 10
	simUIDsA     = 1000 // group a (no multiuser): uids 1000..1002
	simUIDsM     = 2000 // group m (multiuser): uids 2000..2002
)

type simWorld struct {
	rng   *rand.Rand
	now   time.Time
	step  int
	wd    policy.WatchdogConfig
	insts []*simInst
	// clk is the Daemon's clock, set to now at every step.
	clk *clock.Fake
	// seq numbers the leases (Daemon.leaseID).
	seq uint64
	// live: the leases the daemon holds, with the attempt the simulation
	// last saw placed (0: none yet); a lease the simulation ends leaves.
	live  map[*lease]int
	pid   int
	trace []string
	tally map[string]int
	// down: the steps left while mpsd is stopped (an mpsd restart); the
	// servers each instance's model held when it stopped, as the state
	// file saves them.
	down  int
	saved map[*simInst]map[int]int
	// core: the Daemon whose admission, queue, grants and releases run,
	// with the simulation's instances and a config whose groups name its
	// users.
	core *Daemon
}

// simInst is one instance: mpsd's view (in) and the fake control daemon.
type simInst struct {
	w     *simWorld
	in    *instance
	sched *mpssched.Sched
	// servers: the fake servers alive, by pid.
	servers map[int]*simServer
	// clients: every client process alive, by pid.
	clients map[int]*simClient
	// events: what MPS and the driver told mpsd, not yet delivered, in
	// order (mps.Daemon's events are ordered per daemon).
	events []simEvent
	// The simulation's own count for the quarantine rule.
	anonFailures []time.Time
	uidFaults    map[uint32][]time.Time
	// started: the processes each lease's attempt started.
	started map[*lease]int
	// knownUnleased: the unleased clients the last reconciliation saw,
	// by pid, with the time it saw them.
	knownUnleased map[int]time.Time
}

type simServer struct {
	pid     int
	uid     int32
	sv      *mpssched.Server
	clients map[int]*simClient
	// faulted: a client's fatal fault put it in FAULT: its clients hold a
	// sticky error and wait for the recovery to end them.
	faulted bool
}

type simClient struct {
	pid    int
	uid    uint32
	lease  *lease // nil: unleased
	server *simServer
	req    *mpssched.Client // while it waits inside MPS
	// grantedAt: the lease's grant (the check of waits is against what
	// mpsd knew then).
	grantedAt time.Time
	doomed    bool // its server faulted or crashed
}

type simEventKind uint8

const (
	evStarted simEventKind = iota
	evExited
	evXid
)

type simEvent struct {
	kind simEventKind
	pid  int
	uid  int32
	// exit: status 0 or a signal; expected: the simulation knows MPS
	// ended the server itself (idle after a switch) or mpsd shut it down.
	signal   int
	expected bool
	// xid: the faulting client's pid (0: none), and whether it is a real
	// fault (every Xid the simulation raises is).
	xidPID int
}

// simConfig is the simulation's config: group a without multiuser and
// group m with it, one GPU each, three members each (u1000.., u2000..).
func simConfig() string {
	var b strings.Builder
	b.WriteString("version: 1\nadmins:\n  users: [u0]\nplacement: binpack\n" +
		"watchdog:\n  quarantine_after: 3\n  quarantine_window: 10m\ngroups:\n")
	for i, g := range []struct {
		name      string
		uids      int
		multiuser bool
	}{{"a", simUIDsA, false}, {"m", simUIDsM, true}} {
		fmt.Fprintf(&b, "  %s:\n    users: [u%d, u%d, u%d]\n    gpus: [\"%d\"]\n", g.name, g.uids, g.uids+1, g.uids+2, i)
		b.WriteString("    sm_percent: 100\n    memory: 1024G\n    max_clients: 48\n    max_sm: 100\n    max_mem: 1G\n    requeue_attempts: 2\n")
		fmt.Fprintf(&b, "    multiuser: %v\n", g.multiuser)
	}
	return b.String()
}

// simUsers resolves the simulation's user names: uN is uid N.
type simUsers struct{}

func (simUsers) UserID(name string) (uint32, error) {
	var uid uint32
	if _, err := fmt.Sscanf(name, "u%d", &uid); err != nil {
		return 0, fmt.Errorf("no user %q", name)
	}
	return uid, nil
}

func (simUsers) GroupID(name string) (uint32, error) { return 0, fmt.Errorf("no group %q", name) }

func newSimWorld(seed uint64) (*simWorld, error) {
	w := &simWorld{
		rng:   rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
		now:   time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		pid:   100,
		tally: map[string]int{},
		live:  map[*lease]int{},
	}
	host := policy.Host{Users: simUsers{}, Driver: "555.42.06",
		GPUs: []policy.GPU{{Index: 0, UUID: "GPU-sim-0", Memory: 2 << 40}, {Index: 1, UUID: "GPU-sim-1", Memory: 2 << 40}}}
	cfg, err := policy.Parse(strings.NewReader(simConfig()), host)
	if err != nil {
		return nil, fmt.Errorf("the simulation's config: %w", err)
	}
	w.wd = cfg.Watchdog
	log := slog.New(slog.DiscardHandler)
	w.clk = clock.NewFake(w.now)
	w.core = &Daemon{clock: w.clk, log: log, cfg: cfg,
		instances: map[string]*instance{}, queues: map[string][]*lease{}, leases: map[string]*lease{},
		store:   &store{kick: make(chan struct{}, 1)},
		leaseID: func(string) string { w.seq++; return fmt.Sprintf("L%d", w.seq) }}
	w.core.metrics = newMetrics(w.core)
	for i, g := range cfg.Groups {
		in := &instance{
			key: fmt.Sprintf("%s/%d", g.Name, i), group: g.Name, gpus: []gpu.Info{{Index: i}},
			log: log,
			p: policy.Instance{Group: g.Name, GPUs: slices.Clone(g.Instances[0]), Multiuser: g.Multiuser,
				Budget: g.Budget()},
			maxSM: g.MaxSM, maxMem: g.MaxMem,
			mps: newMPSModel(), life: instUp, leases: map[string]*lease{},
			restartsBy: map[string]int{}, faults: map[string]int{},
		}
		si := &simInst{w: w, in: in, servers: map[int]*simServer{}, clients: map[int]*simClient{},
			uidFaults: map[uint32][]time.Time{}, started: map[*lease]int{}, knownUnleased: map[int]time.Time{}}
		si.sched = mpssched.New(simHost{si}, g.Multiuser, 0)
		w.insts = append(w.insts, si)
		w.core.setInstanceLocked(in)
	}
	return w, nil
}

func (w *simWorld) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%4d %s ", w.step, w.now.Format("15:04:05.000"))+fmt.Sprintf(format, args...))
}

func (w *simWorld) traceTail(n int) string {
	return strings.Join(w.trace[max(0, len(w.trace)-n):], "\n")
}

func (w *simWorld) nextPID() int { w.pid++; return w.pid }

// run takes steps steps, checking the invariants after each.
func (w *simWorld) run(steps int) error {
	for w.step = 1; w.step <= steps; w.step++ {
		if err := w.takeStep(); err != nil {
			return err
		}
		for _, si := range w.insts {
			if w.down == 0 {
				if err := w.restartWhenEmpty(si); err != nil {
					return err
				}
				if err := w.schedule(si); err != nil {
					return err
				}
			}
		}
		if err := w.check(); err != nil {
			return err
		}
	}
	return nil
}

func (w *simWorld) pick(n int) int { return w.rng.IntN(n) }

func (w *simWorld) takeStep() error {
	w.now = w.now.Add(time.Duration(w.rng.IntN(2000)) * time.Millisecond)
	defer func() { w.clk.Set(w.now) }() // time passing is a step of its own
	w.clk.Set(w.now)
	si := w.insts[w.pick(len(w.insts))]
	if w.down > 0 {
		return w.stepWhileDown(si)
	}
	switch r := w.pick(100); {
	case r < 14:
		return w.request(si)
	case r < 30:
		w.startClient(si)
	case r < 44:
		return w.exitClient(si)
	case r < 54:
		w.serverReady(si)
	case r < 76:
		return w.deliver(si)
	case r < 80:
		w.clientFault(si)
	case r < 82:
		w.serverCrash(si)
	case r < 83:
		w.anonXid(si)
	case r < 87:
		w.unleasedClient(si)
	case r < 92:
		w.reconcile(si)
	case r < 93:
		w.resume(si)
	case r < 94:
		w.now = w.now.Add(time.Duration(1+w.rng.IntN(6)) * time.Minute)
		w.logf("time passes")
	case r < 95:
		return w.daemonHang(si)
	case r < 96:
		w.reload(si)
	case r < 97:
		w.mpsdStops()
	default:
		return w.deliver(si)
	}
	return nil
}

// mpsdStops: mpsd stops for a restart. MPS, the clients and the tenants
// go on; what happens meanwhile reaches mpsd only as what it finds when it
// is back (stepWhileDown, mpsdRestarts).
func (w *simWorld) mpsdStops() {
	w.down = 1 + w.pick(8)
	w.saved = map[*simInst]map[int]int{}
	for _, si := range w.insts {
		w.saved[si] = maps.Clone(si.in.mps.servers)
	}
	w.tally["mpsd restart"]++
	w.logf("mpsd stops for %d steps", w.down)
}

// stepWhileDown is a step while mpsd is stopped: clients start, exit and
// fault, servers become ready, crash or end at a uid switch; nothing is
// granted, delivered or reconciled.
func (w *simWorld) stepWhileDown(si *simInst) error {
	switch r := w.pick(100); {
	case r < 30:
		w.startClient(si)
	case r < 60:
		if err := w.exitClient(si); err != nil {
			return err
		}
	case r < 80:
		w.serverReady(si)
	case r < 86:
		w.clientFault(si)
	case r < 92:
		w.serverCrash(si)
	default:
		w.unleasedClient(si)
	}
	w.down--
	if w.down == 0 {
		return w.mpsdRestarts()
	}
	return nil
}

// mpsdRestarts: the new mpsd adopts each control daemon. What the
// servers' pidfds and NVML told while it was away is lost; it sees the
// servers that are there now, and hands the saved ones that are gone to
// lostWhileAway, mpsd's own decision, whose fault it recovers from.
func (w *simWorld) mpsdRestarts() error {
	w.logf("mpsd is back")
	for _, si := range w.insts {
		in := si.in
		si.events = nil
		in.mps = newMPSModel()
		for _, pid := range slices.Sorted(maps.Keys(si.servers)) {
			in.mps.serverStarted(pid, int(si.servers[pid].uid))
		}
		lost, victims := lostWhileAway(w.saved[si], in.mps, in.leases, in.p.Multiuser)
		if len(lost) == 0 {
			continue
		}
		// Only a lost server's uid's leases (every one, multiuser) are
		// its victims.
		for _, id := range victims {
			l := in.leases[id]
			if !in.p.Multiuser && !slices.ContainsFunc(lost, func(pid int) bool { return w.saved[si][pid] == int(l.uid) }) {
				return fmt.Errorf("%s (uid %d) revoked for servers %v lost while mpsd was away, none of its uid", id, l.uid, lost)
			}
		}
		w.tally["server lost while away"]++
		w.logf("mpsd: servers %v lost while away; victims %v", lost, victims)
		if err := w.recover(si, []fault{lostWhileAwayFault(in, lost, victims)}, true); err != nil {
			return err
		}
	}
	w.saved = nil
	// The launchers whose commands ended while mpsd was away report it.
	for _, si := range w.insts {
		for _, id := range slices.Sorted(maps.Keys(si.in.leases)) {
			if err := w.releaseIfDone(si, si.in.leases[id]); err != nil {
				return err
			}
		}
	}
	return nil
}

// request: a member asks for a lease, through Daemon.admit, which
// queues it and runs the group's queue.
func (w *simWorld) request(si *simInst) error {
	in := si.in
	if len(in.leases)+len(w.core.queues[in.group]) >= simMaxLeases {
		return nil
	}
	base := simUIDsA // the group's members (a reload may turn its multiuser)
	if in.group == "m" {
		base = simUIDsM
	}
	uid := uint32(base + w.pick(3))
	req := api.LeaseRequest{Group: in.group, SM: 5 + 5*w.pick(6), MemBytes: 1 << 20, Procs: 1 + w.pick(2)}
	l, err := w.core.admit(policy.Credentials{UID: uid}, req)
	if err != nil {
		// Only a request that can never fit is refused (a reload shrank
		// the group's budget below it).
		var r *refusal
		if !errors.As(err, &r) || r.code != api.CodeRefused || !strings.Contains(r.msg, "can never fit") {
			return fmt.Errorf("uid %d's request (sm %d, procs %d) refused: %w", uid, req.SM, req.Procs, err)
		}
		w.tally["refused at admission"]++
		w.logf("request of uid %d group %s sm %d procs %d refused: %v", uid, in.group, req.SM, req.Procs, err)
		return nil
	}
	w.live[l] = 0
	w.logf("request %s uid %d group %s sm %d procs %d", l.id, uid, in.group, l.req.SM, l.req.Procs)
	return w.noteGrants()
}

// schedule runs the group's queue (scheduleLocked), as every change that
// frees room does.
func (w *simWorld) schedule(si *simInst) error {
	w.core.scheduleLocked(si.in.group)
	return w.noteGrants()
}

// noteGrants reports what the Daemon's queue did since the last look:
// the leases it placed (none on an instance held for a restart) and the
// queued ones it refused after a reload (told so, with CodeRefused).
func (w *simWorld) noteGrants() error {
	for _, l := range slices.SortedFunc(maps.Keys(w.live), func(a, b *lease) int { return strings.Compare(a.id, b.id) }) {
		switch {
		case l.state == leaseEnded:
			if w.core.leases[l.id] != nil {
				return fmt.Errorf("%s ended but the daemon still holds it", l.id)
			}
			var refused bool
			for _, ev := range l.box.take() {
				refused = refused || ev.Type == api.EventError && ev.Code == api.CodeRefused
			}
			if !refused {
				return fmt.Errorf("%s left the queue without a refusal", l.id)
			}
			delete(w.live, l)
			w.tally["refused after a reload"]++
			w.logf("%s refused: it can no longer fit", l.id)
		case l.inst != nil && w.live[l] != l.attempt:
			if l.inst.holds.restartPending {
				return fmt.Errorf("%s granted on %s, held for a restart", l.id, l.inst.key)
			}
			w.live[l] = l.attempt
			w.tally["grant"]++
			w.logf("grant %s uid %d attempt %d on %s", l.id, l.uid, l.attempt, l.inst.key)
		}
	}
	return nil
}

// leaseClients are the client processes alive of l.
func (si *simInst) leaseClients(l *lease) []*simClient {
	var out []*simClient
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		if c := si.clients[pid]; c.lease == l {
			out = append(out, c)
		}
	}
	return out
}

// startedOf: how many of l's processes its attempt started (each once; a
// lease whose processes all ran and exited is released).
func (si *simInst) startedOf(l *lease) int { return si.started[l] }

// startClient: a granted lease's command starts one more CUDA process.
func (w *simWorld) startClient(si *simInst) {
	var cands []*lease
	for _, id := range slices.Sorted(maps.Keys(si.in.leases)) {
		l := si.in.leases[id]
		if l.state == leaseRunning && si.startedOf(l) < l.req.Procs {
			cands = append(cands, l)
		}
	}
	if len(cands) == 0 {
		return
	}
	l := cands[w.pick(len(cands))]
	si.started[l]++
	c := &simClient{pid: w.nextPID(), uid: l.uid, lease: l, grantedAt: l.grantedAt}
	l.pids = append(l.pids, c.pid) // what its cgroup holds
	w.logf("client %d of %s (uid %d) starts", c.pid, l.id, l.uid)
	si.connect(c)
}

// connect: a client asks the control daemon for a server.
func (si *simInst) connect(c *simClient) {
	si.clients[c.pid] = c
	req, now := si.sched.Request(c.pid, int32(c.uid), c)
	if !now && !req.Done {
		c.req = req
	}
}

// exitClient: a client process exits by itself; a lease whose processes
// have all run and exited is released (its launcher reports the end, and
// the Daemon's finishRelease hands its room back and runs the queue).
func (w *simWorld) exitClient(si *simInst) error {
	var cands []*simClient
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		if c := si.clients[pid]; !c.doomed && c.lease != nil {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	c := cands[w.pick(len(cands))]
	w.logf("client %d of %s exits", c.pid, c.lease.id)
	si.gone(c)
	if w.down > 0 {
		return nil // its launcher reports the end once mpsd is back (mpsdRestarts)
	}
	return w.releaseIfDone(si, c.lease)
}

// releaseIfDone releases l if every process of its attempt has run and
// exited.
func (w *simWorld) releaseIfDone(si *simInst, l *lease) error {
	if len(si.leaseClients(l)) == 0 && si.startedOf(l) >= l.req.Procs && l.state == leaseRunning {
		w.logf("release %s", l.id)
		if _, err := l.step(leaseRelease, "its command ended"); err != nil {
			return err
		}
		w.core.finishRelease(l, "its command ended")
		if l.state != leaseEnded || l.inst != nil || w.core.leases[l.id] != nil {
			return fmt.Errorf("%s released, yet %v on %v", l.id, l.state, l.inst != nil)
		}
		delete(w.live, l)
		return w.noteGrants()
	}
	return nil
}

// gone: a client process is gone (exited, killed, or died with its
// server). Its server, asked to exit and now idle, exits with status 0.
func (si *simInst) gone(c *simClient) {
	delete(si.clients, c.pid)
	if c.req != nil {
		c.req.Done = true // it gave up waiting
	}
	if sv := c.server; sv != nil {
		delete(sv.clients, c.pid)
		c.server = nil
		if si.servers[sv.pid] == sv && mpssched.ExitsWhenIdle(sv.sv.Stopping, len(sv.clients)) {
			si.serverGone(sv, 0, true)
		}
	}
}

// serverGone: a server process exited; the control daemon reaps it at
// once, mpsd hears of it through an event.
func (si *simInst) serverGone(sv *simServer, signal int, expected bool) {
	delete(si.servers, sv.pid)
	for _, pid := range slices.Sorted(maps.Keys(sv.clients)) {
		c := sv.clients[pid]
		c.server = nil
		c.doomed = true // died with its server
		delete(si.clients, pid)
	}
	si.w.logf("server %d (uid %d) exits signal %d expected %v", sv.pid, sv.uid, signal, expected)
	if expected && signal == 0 {
		si.w.tally["uid switch"]++
	}
	si.events = append(si.events, simEvent{kind: evExited, pid: sv.pid, uid: sv.uid, signal: signal, expected: expected})
	si.sched.Exited(sv.sv)
}

func (w *simWorld) serverReady(si *simInst) {
	for _, s := range si.sched.Servers() {
		if !s.Ready {
			w.logf("server %d ready", s.PID)
			si.sched.Ready(s)
			return
		}
	}
}

// simHost is the fake control daemon's side of mpssched: servers and
// clients are records.
type simHost struct{ si *simInst }

func (h simHost) StartServer(uid int32) *mpssched.Server {
	si := h.si
	sv := &simServer{pid: si.w.nextPID(), uid: uid, clients: map[int]*simClient{}}
	sv.sv = &mpssched.Server{PID: sv.pid, UID: uid, Ref: sv}
	si.servers[sv.pid] = sv
	si.events = append(si.events, simEvent{kind: evStarted, pid: sv.pid, uid: uid})
	si.w.logf("server %d starts for uid %d", sv.pid, uid)
	return sv.sv
}

func (h simHost) AskShutdown(s *mpssched.Server) {
	sv := s.Ref.(*simServer)
	h.si.w.logf("server %d asked to exit (%d clients)", sv.pid, len(sv.clients))
	if mpssched.ExitsWhenIdle(true, len(sv.clients)) {
		h.si.serverGone(sv, 0, true)
	}
}

func (h simHost) HandOver(mc *mpssched.Client, s *mpssched.Server) {
	c := mc.Ref.(*simClient)
	sv := s.Ref.(*simServer)
	if h.si.clients[c.pid] != c {
		return
	}
	c.req, c.server = nil, sv
	sv.clients[c.pid] = c
	if sv.faulted {
		c.doomed = true
	}
	h.si.w.logf("client %d handed to server %d", c.pid, sv.pid)
}

func (h simHost) Refuse(mc *mpssched.Client) {}

// deliver hands mpsd the oldest event of the instance, as its watcher
// would, and acts on it with mpsd's own decisions.
func (w *simWorld) deliver(si *simInst) error {
	if len(si.events) == 0 {
		return nil
	}
	ev := si.events[0]
	si.events = si.events[1:]
	in := si.in
	switch ev.kind {
	case evStarted:
		in.mps.serverStarted(ev.pid, int(ev.uid))
		w.logf("mpsd: server %d started (uid %d)", ev.pid, ev.uid)
	case evExited:
		v := in.mps.serverExited(mps.Event{Kind: mps.ServerExited, PID: ev.pid, Signal: syscall.Signal(ev.signal)}, in.leases, in.p.Multiuser)
		victims := v.victims()
		w.logf("mpsd: server %d exited: %s, %d victims", ev.pid, v.kind, len(victims))
		if len(victims) == 0 {
			return nil
		}
		if ev.expected {
			return fmt.Errorf("server %d's exit was MPS's own (a uid switch or an idle server's end, or mpsd's shutdown), yet mpsd took it for a crash of %s", ev.pid, simIDs(victims))
		}
		ids := make([]string, len(victims))
		for i, l := range victims {
			ids[i] = l.id
		}
		return w.recover(si, []fault{{kind: faultServerExit, restart: restartNone, leases: ids, reason: "server died"}}, false)
	case evXid:
		f := fault{kind: faultXid, restart: restartServer, reason: "Xid"}
		if c := w.leaseOfPID(si, ev.xidPID); c != nil {
			f.culprit = culpritID{lease: c.id, uid: c.uid}
		}
		w.logf("mpsd: Xid pid %d culprit %q", ev.xidPID, f.culprit.lease)
		return w.recover(si, []fault{f}, false)
	}
	return nil
}

// leaseOfPID is the running lease whose cgroup held pid: an Xid names the
// culprit's process, which may have died since.
func (w *simWorld) leaseOfPID(si *simInst, pid int) *lease {
	if pid == 0 {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(si.in.leases)) {
		l := si.in.leases[id]
		if slices.Contains(l.pids, pid) && l.state == leaseRunning {
			return l
		}
	}
	return nil
}

// clientFault: a leased client's fatal fault puts its server in FAULT;
// every client of it holds a sticky error; the driver raises an Xid
// naming the culprit's pid.
func (w *simWorld) clientFault(si *simInst) {
	var cands []*simClient
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		if c := si.clients[pid]; c.lease != nil && c.server != nil && !c.server.faulted {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return
	}
	c := cands[w.pick(len(cands))]
	sv := c.server
	sv.faulted = true
	for _, o := range sv.clients {
		o.doomed = true
	}
	w.tally["culprit fault"]++
	w.logf("client %d of %s (uid %d) faults server %d", c.pid, c.lease.id, c.uid, sv.pid)
	si.events = append(si.events, simEvent{kind: evXid, xidPID: c.pid})
}

// serverCrash: a server dies by a signal; its clients die with it.
func (w *simWorld) serverCrash(si *simInst) {
	pids := slices.Sorted(maps.Keys(si.servers))
	if len(pids) == 0 {
		return
	}
	sv := si.servers[pids[w.pick(len(pids))]]
	w.tally["crash"]++
	si.serverGone(sv, 11, false)
}

// anonXid: an Xid that names no process takes the instance's server down.
func (w *simWorld) anonXid(si *simInst) {
	w.logf("Xid without a pid")
	si.events = append(si.events, simEvent{kind: evXid})
}

// daemonHang: the control daemon stops answering; mpsd's probes fail
// until it counts it hung, revokes every lease and replaces the daemon
// (restartDaemon). What the old daemon's servers do meanwhile reaches
// nobody: mpsd reads the new daemon's events only.
func (w *simWorld) daemonHang(si *simInst) error {
	w.tally["daemon hang"]++
	w.logf("daemon of %s hangs", si.in.key)
	if err := w.recover(si, []fault{{kind: faultHung, restart: restartDaemon, reason: "control daemon stopped answering"}}, false); err != nil {
		return err
	}
	// The old daemon, its servers and their clients are gone.
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		c := si.clients[pid]
		c.doomed = true
		delete(si.clients, pid)
	}
	clear(si.servers)
	si.events = nil
	si.sched = mpssched.New(simHost{si}, si.in.p.Multiuser, 0)
	w.logf("new daemon for %s", si.in.key)
	return nil
}

// reload: the group's SM budget changes (a config reload); a queued
// request that can never fit any more is refused.
func (w *simWorld) reload(si *simInst) {
	if w.pick(4) == 0 {
		w.reloadMultiuser(si)
		return
	}
	sm := []int{20, 60, 100}[w.pick(3)]
	g, _ := w.core.cfg.Group(si.in.group)
	g.SMPercent = sm
	si.in.p.Budget = g.Budget() // as reconcileLocked sets it
	w.logf("reload: group %s's budget is %d%% SM", si.in.group, sm)
}

// reloadMultiuser: a reload turns the group's multiuser on or off. It is
// a start option of the control daemon: as reconcileLocked does, the
// instance is held (restartPending, which placement honours) until its
// leases have ended; then mpsd's own retireIfEmptyLocked asks for the
// stop and takes the new mode (restartWhenEmpty).
func (w *simWorld) reloadMultiuser(si *simInst) {
	g, _ := w.core.cfg.Group(si.in.group)
	g.Multiuser = !g.Multiuser
	if si.in.p.Multiuser != g.Multiuser {
		si.in.holds.restartPending = true
	} else {
		si.in.holds.restartPending = false // turned back before it restarted
	}
	w.tally["multiuser reload"]++
	w.logf("reload: group %s multiuser %v (restart pending %v)", si.in.group, g.Multiuser, si.in.holds.restartPending)
}

// restartWhenEmpty runs mpsd's retireIfEmptyLocked on an instance held
// for a restart; once it asks for the stop, the control daemon is
// replaced by one in the new mode (the supervisor's stop and bring-up),
// its servers and any unleased clients ending with the old one.
func (w *simWorld) restartWhenEmpty(si *simInst) error {
	in := si.in
	if in.holds.restartPending {
		w.core.retireIfEmptyLocked(in)
	}
	// The stop may have been asked already, by the release or the
	// requeue that emptied the instance (both run retireIfEmptyLocked).
	if in.life != instStopping {
		return nil
	}
	if len(in.leases) > 0 {
		return fmt.Errorf("%s stopped for a restart with %d leases on it", in.key, len(in.leases))
	}
	if g, _ := w.core.cfg.Group(in.group); g.Multiuser != in.p.Multiuser {
		return fmt.Errorf("%s restarts with multiuser %v, the config says %v", in.key, in.p.Multiuser, g.Multiuser)
	}
	in.stopReq = nil
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		si.clients[pid].doomed = true
		delete(si.clients, pid)
	}
	clear(si.servers)
	si.events = nil
	in.mps = newMPSModel()
	si.sched = mpssched.New(simHost{si}, in.p.Multiuser, 0)
	for _, ev := range []instEvent{instEvRestart, instEvUp} {
		if _, err := in.step(ev, "restart for a changed start option"); err != nil {
			return fmt.Errorf("%s: %w", in.key, err)
		}
	}
	w.tally["restart for multiuser"]++
	w.logf("%s restarted: multiuser %v", in.key, in.p.Multiuser)
	return nil
}

// unleasedClient: a member starts a client without a lease, or one ends.
func (w *simWorld) unleasedClient(si *simInst) {
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		if c := si.clients[pid]; c.lease == nil && w.pick(2) == 0 {
			w.logf("unleased client %d exits", c.pid)
			si.gone(c)
			return
		}
	}
	base := simUIDsA
	if si.in.p.Multiuser {
		base = simUIDsM
	}
	c := &simClient{pid: w.nextPID(), uid: uint32(base + w.pick(3))}
	w.logf("unleased client %d of uid %d starts", c.pid, c.uid)
	si.connect(c)
}

// reconcile: mpsd lists the servers' clients and counts those no lease
// holds (reconciliation under "report": it ends none).
func (w *simWorld) reconcile(si *simInst) {
	by := map[int]int{}
	clear(si.knownUnleased)
	for _, pid := range slices.Sorted(maps.Keys(si.servers)) {
		sv := si.servers[pid]
		if _, known := si.in.mps.servers[pid]; !known {
			continue // not verified yet: mpsd lists only its verified servers
		}
		for _, c := range sv.clients {
			if c.lease == nil {
				by[pid]++
				si.knownUnleased[c.pid] = w.now
			}
		}
	}
	si.in.mps.setUnleased(by)
	if len(by) > 0 {
		w.tally["unleased held"]++
	}
	w.logf("reconcile: unleased %v", by)
}

// resume: mpsctl resume lifts the quarantine and the bars.
func (w *simWorld) resume(si *simInst) {
	in := si.in
	in.holds.quarantined, in.quarantinedFor, in.failures = false, "", nil
	in.liftBarsLocked()
	si.anonFailures, si.uidFaults = nil, map[uint32][]time.Time{}
	w.logf("resume %s", in.key)
}

// recover runs one recovery of the faults: mpsd's plan, then the
// revocation, the server's restart and the requeues. chargesNobody is
// the simulation's own knowledge, whatever mpsd marked the faults: a
// server lost while mpsd was away may have been ended by MPS itself, so
// its fault charges nobody.
func (w *simWorld) recover(si *simInst, faults []fault, chargesNobody bool) error {
	in := si.in
	f := combineFaults(faults)
	attemptsBefore := map[string]int{}
	for id, l := range in.leases {
		attemptsBefore[id] = l.charged()
	}
	blamed, anonymous := culprits(faults)
	uncharged := chargesNobody
	plan := in.planRecoveryLocked(faults, f, w.now, w.wd)
	// The simulation's own count of the rule.
	if uncharged {
		if plan.quarantined || len(plan.barred) > 0 {
			return fmt.Errorf("%s: a fault that charges nobody quarantined it or barred %v", in.key, plan.barred)
		}
	} else if anonymous {
		si.anonFailures = append(slices.DeleteFunc(si.anonFailures, func(t time.Time) bool { return w.now.Sub(t) >= w.wd.QuarantineWindow }), w.now)
		if want := len(si.anonFailures) >= w.wd.QuarantineAfter; want && !in.holds.quarantined {
			return fmt.Errorf("%d failures naming no culprit in the window, yet %s is not quarantined", len(si.anonFailures), in.key)
		}
		if plan.quarantined && len(si.anonFailures) < w.wd.QuarantineAfter {
			return fmt.Errorf("%s quarantined after %d failures in the window", in.key, len(si.anonFailures))
		}
	} else {
		for uid := range blamed {
			si.uidFaults[uid] = append(slices.DeleteFunc(si.uidFaults[uid], func(t time.Time) bool { return w.now.Sub(t) >= w.wd.QuarantineWindow }), w.now)
		}
		if plan.quarantined {
			return fmt.Errorf("%s quarantined for faults that all named culprits", in.key)
		}
		for uid := range blamed {
			barred := slices.Contains(plan.barred, uid)
			if want := len(si.uidFaults[uid]) >= w.wd.QuarantineAfter; want != barred && !(want && slices.Contains(in.barredUIDs(w.now.Add(-time.Nanosecond)), uid)) {
				return fmt.Errorf("uid %d has %d culprit faults in the window; barred now: %v", uid, len(si.uidFaults[uid]), barred)
			}
			if barred {
				w.tally["uid barred"]++
			}
		}
	}
	w.logf("recovery: %s, culprits %v, victims %s, spared %v", f.kind, slices.Sorted(maps.Keys(blamed)), simIDs(plan.victims), slices.Sorted(maps.Keys(plan.spared)))
	// Revoke: each victim's processes are killed, its allocation freed.
	why := map[*lease]string{}
	for _, l := range plan.victims {
		// revoke's steps 1 and 3; its kill is the clients gone below.
		if _, ok := l.markRevokedLocked(f.reason, nil, plan.spared[l.id]); !ok {
			return fmt.Errorf("%s, a victim, could not be revoked from %v", l.id, l.state)
		}
		why[l] = f.reason
		l.box.push(api.Event{Type: api.EventRevoked, Reason: f.reason})
		for _, c := range si.leaseClients(l) {
			si.gone(c)
		}
	}
	if f.restart == restartDaemon {
		in.mps.daemonGone() // as recoverOnce does
	}
	// Restart the servers (restartServer): mpsd shuts down each server
	// it knows of (in.mps.pids, as recoverOnce) itself.
	if f.restart == restartServer {
		for _, pid := range in.mps.pids() {
			if in.mps.shuttingDown(pid) == nil {
				continue
			}
			if sv := si.servers[pid]; sv != nil {
				si.serverGone(sv, 2, true)
			}
		}
	}
	// The Daemon's requeue: each victim back at the head of its queue,
	// or ended with no attempts left; then the queue runs.
	type before struct{ attempt, spared int }
	was := map[*lease]before{}
	for _, l := range plan.victims {
		was[l] = before{l.attempt, l.spared}
	}
	w.core.requeue(plan.victims, why, false)
	for _, l := range plan.victims {
		l.pids = nil
		delete(si.started, l)
		// Ended: with no attempts left, or requeued and then refused
		// by its queue (a reload shrank the group below it).
		var exhausted, refused bool
		if l.state == leaseEnded {
			for _, ev := range l.box.take() {
				exhausted = exhausted || ev.Type == api.EventError && ev.Code == api.CodeAttemptsExhausted
				refused = refused || ev.Type == api.EventError && ev.Code == api.CodeRefused
			}
			if w.core.leases[l.id] != nil || exhausted == refused {
				return fmt.Errorf("%s ended (held still %v, exhausted %v, refused %v)", l.id, w.core.leases[l.id] != nil, exhausted, refused)
			}
			delete(w.live, l)
		}
		spare := l.spared > was[l].spared
		if plan.spared[l.id] || uncharged {
			w.tally["spared victim"]++
			if !spare || exhausted {
				return fmt.Errorf("%s, a victim of another lease's fault, was charged (spared %d, was %d, exhausted %v)", l.id, l.spared, was[l].spared, exhausted)
			}
		} else if spare {
			return fmt.Errorf("%s was spared although the fault was its own or named no culprit", l.id)
		}
		switch {
		case exhausted:
			if l.charged() < l.requeue {
				return fmt.Errorf("%s ended after %d charged attempts of %d", l.id, l.charged(), l.requeue)
			}
			w.logf("%s ends: no requeue attempts left", l.id)
			continue
		case refused:
			w.tally["refused after a reload"]++
			w.logf("%s requeued, then refused: it can no longer fit", l.id)
		}
		if l.attempt != was[l].attempt+1 {
			return fmt.Errorf("%s requeued as attempt %d after attempt %d", l.id, l.attempt, was[l].attempt)
		}
		if got, was := l.charged(), attemptsBefore[l.id]; got != was+map[bool]int{true: 0, false: 1}[spare] {
			return fmt.Errorf("%s charged %d attempts, was %d, spare %v", l.id, got, was, spare)
		}
	}
	return w.noteGrants()
}

func simIDs(ls []*lease) string {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.id
	}
	return "[" + strings.Join(ids, " ") + "]"
}

// check verifies the invariants that hold between steps.
func (w *simWorld) check() error {
	// The daemon's leases are the queued ones, each once in its group's
	// queue, and the running ones, each on its instance.
	queued := 0
	inQueue := map[*lease]bool{}
	for group, q := range w.core.queues {
		for _, l := range q {
			if l.state != leaseQueued || l.group != group || w.core.leases[l.id] != l || inQueue[l] {
				return fmt.Errorf("queue of %s holds %s (state %v, held %v, twice %v)", group, l.id, l.state, w.core.leases[l.id] == l, inQueue[l])
			}
			inQueue[l] = true
			queued++
		}
	}
	running := 0
	for _, si := range w.insts {
		running += len(si.in.leases)
		for id, l := range si.in.leases {
			if w.core.leases[id] != l || l.inst != si.in {
				return fmt.Errorf("%s runs on %s but the daemon does not hold it there", id, si.in.key)
			}
		}
	}
	if len(w.core.leases) != queued+running {
		return fmt.Errorf("the daemon holds %d leases: %d queued, %d running", len(w.core.leases), queued, running)
	}
	for _, si := range w.insts {
		in := si.in
		// The allocation is the leases'.
		want := policy.Instance{Multiuser: in.p.Multiuser}
		for _, id := range slices.Sorted(maps.Keys(in.leases)) {
			l := in.leases[id]
			if l.state != leaseRunning {
				return fmt.Errorf("lease %s on %s in state %v between steps", id, in.key, l.state)
			}
			want.Assign(&l.req)
		}
		if want.Alloc != in.p.Alloc {
			return fmt.Errorf("%s allocates %+v; its leases hold %+v", in.key, in.p.Alloc, want.Alloc)
		}
		// No grant MPS makes wait: a granted client waits inside MPS only
		// behind a server that is starting, one of its own uid, or another
		// uid's whose clients mpsd could not know of when it granted.
		if in.p.Multiuser {
			continue
		}
		for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
			c := si.clients[pid]
			if c.lease == nil || c.req == nil || c.doomed {
				continue
			}
			for _, sv := range si.servers {
				if sv.uid == int32(c.uid) {
					continue
				}
				for _, o := range sv.clients {
					switch {
					case o.doomed:
					case o.lease != nil && o.lease.state == leaseRunning:
						return fmt.Errorf("client %d of %s (uid %d) waits inside MPS behind running lease %s of uid %d on server %d",
							c.pid, c.lease.id, c.uid, o.lease.id, o.uid, sv.pid)
					case o.lease == nil:
						if seen, ok := si.knownUnleased[o.pid]; ok && !seen.After(c.grantedAt) && in.mps.held() {
							return fmt.Errorf("client %d of %s (uid %d) was granted after mpsd saw unleased client %d of uid %d hold server %d",
								c.pid, c.lease.id, c.uid, o.pid, o.uid, sv.pid)
						}
					}
				}
			}
		}
	}
	return nil
}
