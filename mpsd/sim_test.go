package mpsd

// A deterministic, seeded simulation of mpsd's core decisions on a fake
// control daemon and a fake clock, in the manner of FoundationDB's
// simulation and TigerBeetle's VOPR: one seed fixes every choice, so a
// failing seed replays exactly.
//
// What runs is mpsd's own code for each decision: admission and the
// queue (Daemon.admit on the config's groups and members, scheduleLocked,
// grantLocked, positionsLocked; a refusal after a reload is failLocked's),
// a release (Daemon.release: the lease's cgroup deleted, its room handed
// back, the queue run), an attach (Daemon.attach), every lease transition
// (lease.step and its table), the MPS model (mpsModel: servers, uids,
// unleased holders, exit verdicts), placement (instance.policyViewAt and
// policy.Next, Assign and Release), the culprit records of a server's log
// (noteCulpritHint) and reconciliation's readings of every lease's cgroup
// (leasedPids), a fault's intake (reportFault: pending, the instance
// recovering and closed to placements; the supervisor's takePendingLocked),
// and the first part of a recovery as the supervisor runs it
// (beginRecovery: the culprits the log named where facts confirm them,
// planRecoveryLocked's charges, quarantine, victims and spares, and the
// revocation, Daemon.revoke: marked, told, their clients terminated
// through the control daemon, their cgroups killed, requeued or ended).
// Its edges are fakes over the simulation's records (simedges_test.go):
// lease cgroups (a cgroup.Manager), the control daemon's client list and
// terminate_client, and the processes mpsd looks up by pid (processes).
// The control daemon's scheduling is the emulator's
// (internal/mpsemu/mpssched, the one definition of MPS's rules the
// emulated nvidia-cuda-mps-control runs on), with servers and clients as
// records instead of processes. What is the simulation's: the instance's
// step out of recovering (as the supervisor makes it), the servers'
// restart after a recovery, a daemon's replacement, and a restart's
// adoption.
//
// Each step picks one of: a request from one of several users of a group
// without multiuser and of a multiuser group, a client process starting
// or exiting, a server becoming ready, an MPS event reaching mpsd (a
// server's start or exit, an Xid, a server log's records), a client's
// fatal fault (its Xid names it: a culprit), a client's memory fault (the
// server's log names its culprit, or for some fatal errors nobody; its Xid
// names no process; the culprit ends as mpsd reads the record, before,
// or hangs), a member's forged culprit record (naming a live process, one
// of a running lease that ended lately, or nobody's pid; on its own or
// just before a fault), a server crash, an Xid naming no process, a control
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
//     (any, multiuser), and charges nobody: MPS may have ended it itself;
//   - a culprit the server's log named is charged only as the rule says,
//     counted on the simulation's own records (checkLogCulprits): not on
//     a multiuser daemon, never with two records in culpritHintAge, only
//     a lease of the server's uid whose named process ended before the
//     recovery, and another than the true culprit only on a forged record;
//   - a revoked lease's processes are all gone, killed by the revocation;
//   - no granted client is refused by a server mpsd held in FAULT when it
//     granted, and after a reconciliation mpsd holds a server in FAULT
//     only where MPS does.
//
// Replay one seed: go test ./mpsd -run '^TestSimulation$' -sim.seed=N -v

import (
	"context"
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
		for _, k := range []string{"grant", "uid switch", "culprit fault", "spared victim", "crash", "uid barred", "unleased held", "memory fault", "forged record", "log-named culprit", "FAULT held", "daemon hang", "refused after a reload", "refused at admission", "mpsd restart", "server lost while away", "multiuser reload", "restart for multiuser"} {
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
	// violation: an invariant a step broke where it could not return it
	// (an emulated MPS callback); check reports it.
	violation error
	// down: the steps left while mpsd is stopped (an mpsd restart); the
	// servers each instance's model held when it stopped, as the state
	// file saves them.
	down  int
	saved map[*simInst]map[int]int
	// core: the Daemon whose admission, queue, grants and releases run,
	// with the simulation's instances and a config whose groups name its
	// users.
	core *Daemon
	// cgs: the lease cgroups (simedges_test.go); procs: every process
	// the simulation started, by pid (pids are never taken again).
	cgs   *simCgroups
	procs map[int]*simProc
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
	// ctl: the control daemon (its client list and terminate_client).
	ctl *simControl
	// logOff: the server log's size: each record the next offset.
	logOff int64
	// culprit: the lease whose client truly raised each server's fault
	// (by server pid); forged: the records members wrote naming a
	// culprit of each server, the uid that wrote each.
	culprit  map[int]*lease
	faultUID map[int]int32
	// records: the culprit records of each server that reached mpsd
	// (while it knew the server) since its last fault's recovery.
	records map[int][]simRecord
	// faultAtGrant: the servers mpsd's model held in FAULT when each
	// lease was last granted.
	faultAtGrant map[*lease][]int
}

// simRecord is a culprit record as it reached mpsd.
type simRecord struct {
	client int       // the pid it names
	forged bool      // a member wrote it into the log FIFO
	at     time.Time // when mpsd read it
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
	// endsWithFault: it raised its server's fault and ends once mpsd has
	// read the record naming it.
	endsWithFault bool
}

type simEventKind uint8

const (
	evStarted simEventKind = iota
	evExited
	evXid
	// evCulpritRecord: the server log names the client of a server's
	// next fault ("Client {PID: C, Context: 1} encountered a fatal GPU
	// error."), MPS's own or a member's forgery; evServerFault: the
	// server's log records the fault ("Server is handling a fatal GPU
	// error."), which an Xid naming no process confirms.
	evCulpritRecord
	evServerFault
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
	// A record's client (evCulpritRecord) and its offset in the server
	// log (both records); forged: a member wrote it.
	client int
	off    int64
	forged bool
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
		cgs:   newSimCgroups(),
		procs: map[int]*simProc{},
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
		leaseID: func(string) string { w.seq++; return fmt.Sprintf("L%d", w.seq) },
		ctx:     context.Background(), cg: w.cgs, procs: simProcs{w}}
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
			uidFaults: map[uint32][]time.Time{}, started: map[*lease]int{}, knownUnleased: map[int]time.Time{},
			culprit: map[int]*lease{}, faultUID: map[int]int32{}, records: map[int][]simRecord{}, faultAtGrant: map[*lease][]int{}}
		si.sched = mpssched.New(simHost{si}, g.Multiuser, 0)
		si.newControl()
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

// simBoot is the simulation's boot, in clock ticks before its first
// instant: process start times count from it.
const simBoot = 1_000_000

// ticks is the time since the simulation's boot in clock ticks.
func (w *simWorld) ticks() uint64 {
	return simBoot + uint64(w.clk.Now().Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))/(time.Second/userHZ))
}

// newProcess starts a process: a new pid, with its start time.
func (w *simWorld) newProcess() int {
	pid := w.nextPID()
	w.procs[pid] = &simProc{start: w.ticks()}
	return pid
}

// processEnds: process pid has ended; it leaves its cgroup.
func (w *simWorld) processEnds(pid int) {
	if p := w.procs[pid]; p != nil {
		p.ended = true
	}
	w.cgs.exited(pid)
}

// newControl gives the instance a new control daemon (its start, or its
// replacement after a hang or for a changed start option).
func (si *simInst) newControl() {
	si.ctl = &simControl{fakeControl: newFakeControl(si.w.nextPID(), "/nonexistent/sim/"+si.in.key), si: si}
}

// applyKills ends the processes mpsd's revocation killed (their cgroups
// or MPS's terminate_client), in pid order.
func (w *simWorld) applyKills(si *simInst) {
	for _, pid := range w.cgs.takeKilled() {
		if c := si.clients[pid]; c != nil {
			w.logf("client %d killed", pid)
			si.gone(c)
		} else {
			w.processEnds(pid)
		}
	}
}

// run takes steps steps, checking the invariants after each.
func (w *simWorld) run(steps int) error {
	for w.step = 1; w.step <= steps; w.step++ {
		if err := w.takeStep(); err != nil {
			return err
		}
		if w.down == 0 {
			// Reconciliation, at every probe, reads every lease's cgroup
			// once its last reading is reconLeasedAge probe intervals old
			// (leasedPids): what a culprit a server's log names is
			// checked against.
			w.core.leasedPids(reconLeasedAge * w.wd.ProbeInterval)
		}
		for _, si := range w.insts {
			if w.down == 0 {
				// The launchers whose commands have ended report it.
				for _, id := range slices.Sorted(maps.Keys(si.in.leases)) {
					if err := w.releaseIfDone(si, si.in.leases[id]); err != nil {
						return err
					}
				}
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
		return w.startClient(si)
	case r < 43:
		return w.exitClient(si)
	case r < 53:
		w.serverReady(si)
	case r < 73:
		return w.deliver(si)
	case r < 76:
		w.memFault(si)
	case r < 77:
		w.forgeRecord(si)
	case r < 82:
		w.clientFault(si)
	case r < 84:
		w.serverCrash(si)
	case r < 85:
		w.anonXid(si)
	case r < 89:
		w.unleasedClient(si)
	case r < 93:
		return w.reconcile(si)
	case r < 94:
		w.resume(si)
	case r < 95:
		w.now = w.now.Add(time.Duration(1+w.rng.IntN(6)) * time.Minute)
		w.logf("time passes")
	case r < 96:
		return w.daemonHang(si)
	case r < 97:
		w.reload(si)
	case r < 98:
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
		if err := w.startClient(si); err != nil {
			return err
		}
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
		in.culpritHints = nil // the old mpsd's
		clear(si.records)
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
			for _, si := range w.insts {
				if si.in == l.inst {
					si.faultAtGrant[l] = si.in.mps.inFault()
				}
			}
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
func (w *simWorld) startClient(si *simInst) error {
	var cands []*lease
	for _, id := range slices.Sorted(maps.Keys(si.in.leases)) {
		l := si.in.leases[id]
		if l.state == leaseRunning && si.startedOf(l) < l.req.Procs {
			cands = append(cands, l)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	l := cands[w.pick(len(cands))]
	first := si.startedOf(l) == 0
	if first && w.down > 0 {
		return nil // its launcher waits for mpsd to attach the command
	}
	si.started[l]++
	c := &simClient{pid: w.newProcess(), uid: l.uid, lease: l, grantedAt: l.grantedAt}
	w.procs[c.pid].lease = l.id
	if first {
		// mps-launch has mpsd attach its command to the lease's cgroup
		// (attach, which creates the cgroup on first use).
		if err := w.core.attach(l, l.attempt, c.pid, nil); err != nil {
			return fmt.Errorf("attach client %d to %s: %w", c.pid, l.id, err)
		}
	} else {
		// A child of the command: born in its cgroup; mpsd knows of it
		// at its next reading.
		l.cgMu.Lock()
		cg := l.cg
		l.cgMu.Unlock()
		if cg == nil {
			return fmt.Errorf("%s runs processes but has no cgroup", l.id)
		}
		if err := cg.Attach(c.pid); err != nil {
			return err
		}
	}
	w.logf("client %d of %s (uid %d) starts", c.pid, l.id, l.uid)
	si.connect(c)
	return nil
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
		// mpsd's release: the lease's cgroup deleted (its kill, were
		// anything left in it), its room handed back, the queue run.
		w.core.release(l, "its command ended")
		w.applyKills(si)
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
	si.w.processEnds(c.pid)
	if c.req != nil {
		c.req.Done = true // it gave up waiting
	}
	if sv := c.server; sv != nil {
		delete(sv.clients, c.pid)
		c.server = nil
		if sv.faulted && len(sv.clients) == 0 {
			// Every client of its fault has gone: its contexts are torn
			// down and it serves again (the emulator's server, with no
			// device reset delay).
			sv.faulted = false
			si.w.logf("server %d leaves FAULT", sv.pid)
		}
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
		si.w.processEnds(pid)
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
	if sv.faulted {
		// A server in FAULT refuses new clients until the clients of its
		// fault have gone: the client's CUDA initialization fails and its
		// process ends (its launcher reports the end).
		c.req = nil
		delete(h.si.clients, c.pid)
		h.si.w.processEnds(c.pid)
		h.si.w.logf("client %d refused by server %d in FAULT; it ends", c.pid, sv.pid)
		if l := c.lease; l != nil && slices.Contains(h.si.faultAtGrant[l], sv.pid) && h.si.w.violation == nil {
			h.si.w.violation = fmt.Errorf("client %d of %s refused by server %d in FAULT, which mpsd held in FAULT when it granted the lease", c.pid, l.id, sv.pid)
		}
		return
	}
	c.req, c.server = nil, sv
	sv.clients[c.pid] = c
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
	case evCulpritRecord:
		// As the watcher hands it over (instance.go): mpsd's own
		// decision whether it names anyone (noteCulpritHint).
		_, known := in.mps.uidOf(ev.pid)
		w.logf("mpsd: server %d's log names client %d (known server %v)", ev.pid, ev.client, known)
		if known {
			si.records[ev.pid] = append(si.records[ev.pid], simRecord{client: ev.client, forged: ev.forged, at: w.clk.Now()})
		}
		w.core.noteCulpritHint(in, si.ctl, mps.Event{Kind: mps.FaultCulprit, PID: ev.pid, Client: ev.client, UID: -1, ExitStatus: -1,
			KnownServer: known, InServerLog: true, LogOffset: ev.off})
		if c := si.clients[ev.client]; c != nil && c.endsWithFault {
			w.logf("client %d ends with its fault", c.pid)
			si.gone(c)
		}
		if len(si.events) > 0 && si.events[0].kind == evServerFault && si.events[0].pid == ev.pid && si.events[0].off == ev.off+1 {
			// The fault's own record, written with it, comes in the
			// same read of the server's log.
			return w.deliver(si)
		}
	case evServerFault:
		// The fault record of a verified server, confirmed by the Xid
		// (naming no process) that came with it, as the watcher and
		// claimServerFaultLocked make it.
		if _, known := in.mps.uidOf(ev.pid); !known {
			w.logf("mpsd: fault record of server %d, no verified server", ev.pid)
			return nil
		}
		f := fault{kind: faultServerFault, restart: restartNone, fromServerLog: true, logOffset: ev.off, server: ev.pid, xidConfirmed: true,
			reason: "a client hit a fatal GPU error; MPS set a sticky error on every client of the server"}
		w.logf("mpsd: server %d's fault record, confirmed", ev.pid)
		return w.recover(si, []fault{f}, false)
	}
	return nil
}

// leaseOfPID is the running lease whose cgroup holds pid, read as onXid
// reads it (livePids): an Xid names the culprit's process.
func (w *simWorld) leaseOfPID(si *simInst, pid int) *lease {
	if pid == 0 {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(si.in.leases)) {
		l := si.in.leases[id]
		if l.state == leaseRunning && slices.Contains(l.livePids(w.clk), pid) {
			return l
		}
	}
	return nil
}

// clientFault: a leased client's fatal fault puts its server in FAULT;
// every client of it holds a sticky error; the driver raises an Xid
// naming the culprit's pid.
func (w *simWorld) clientFault(si *simInst) {
	c := w.faultClient(si)
	if c == nil {
		return
	}
	sv := c.server
	w.tally["culprit fault"]++
	w.logf("client %d of %s (uid %d) faults server %d", c.pid, c.lease.id, c.uid, sv.pid)
	si.events = append(si.events, simEvent{kind: evXid, xidPID: c.pid})
}

// faultClient picks the leased client that raises a fatal fault (three
// times in four one of the group's first member, whose clients keep
// faulting: what a uid's bar is for, when it has one served) and puts its
// server in FAULT: every client of it holds a sticky error.
func (w *simWorld) faultClient(si *simInst) *simClient {
	var cands, poison []*simClient
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		if c := si.clients[pid]; c.lease != nil && c.server != nil && !c.server.faulted {
			cands = append(cands, c)
			if c.uid == simUIDsA || c.uid == simUIDsM {
				poison = append(poison, c)
			}
		}
	}
	if len(poison) > 0 && w.pick(4) > 0 {
		cands = poison
	}
	if len(cands) == 0 {
		return nil
	}
	c := cands[w.pick(len(cands))]
	c.server.faulted = true
	for _, o := range c.server.clients {
		o.doomed = true
	}
	return c
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

// memFault: a leased client's illegal memory access. Its server logs it
// by name, then its own FAULT ("encountered a fatal GPU error", "Server is
// handling a fatal GPU error"), or for a third of them (fatal errors MPS
// names no client of) only its FAULT; the Xid names no process (NVML's
// events give none). Every client of the server holds a sticky error; the
// culprit's process ends as mpsd reads the record naming it (half the
// time), before (a quarter), or hangs on until its revocation.
func (w *simWorld) memFault(si *simInst) {
	c := w.faultClient(si)
	if c == nil {
		return
	}
	sv := c.server
	si.culprit[sv.pid], si.faultUID[sv.pid] = c.lease, sv.uid
	w.tally["memory fault"]++
	if w.pick(3) == 0 {
		// A member who knows the fault is coming (its own client raises
		// it, say) names someone else first.
		w.forgeFor(si, sv)
	}
	if w.pick(3) > 0 {
		si.logOff++
		si.events = append(si.events, simEvent{kind: evCulpritRecord, pid: sv.pid, client: c.pid, off: si.logOff})
	} else {
		// A fatal error MPS names no client of (only its own FAULT).
		w.tally["fault MPS names nobody of"]++
	}
	si.logOff++
	si.events = append(si.events, simEvent{kind: evServerFault, pid: sv.pid, off: si.logOff})
	w.logf("client %d of %s (uid %d) faults server %d (memory)", c.pid, c.lease.id, c.uid, sv.pid)
	switch w.pick(4) {
	case 0: // it hangs
	case 1:
		w.logf("client %d ends with its fault", c.pid)
		si.gone(c)
	default:
		// It ends as its error reaches it: after mpsd has read the
		// server's log (evCulpritRecord).
		c.endsWithFault = true
	}
}

// forgeRecord: a member writes a culprit record into the log FIFO, naming
// a live process of the instance (any member's, leased or not) or a pid
// of nobody, as a record of one of the servers.
func (w *simWorld) forgeRecord(si *simInst) {
	servers := slices.Sorted(maps.Keys(si.servers))
	if len(servers) == 0 {
		return
	}
	w.forgeFor(si, si.servers[servers[w.pick(len(servers))]])
}

// forgeFor: a member writes a record naming a culprit of server sv's next
// fault: a live process of the instance (any member's, leased or not), a
// process of a lease that ended lately (any member's), or a pid of nobody.
func (w *simWorld) forgeFor(si *simInst, sv *simServer) {
	base := simUIDsA // the group's members
	if si.in.group == "m" {
		base = simUIDsM
	}
	by := uint32(base + w.pick(3))
	named := w.pid + 1000 // nobody's
	// Ended processes of leases still running, another member's first
	// (the one a forger would frame).
	var ended, others []int
	for pid := w.pid; pid > w.pid-60 && pid > 0; pid-- {
		p := w.procs[pid]
		if p == nil || !p.ended || p.lease == "" {
			continue
		}
		if l := w.core.leases[p.lease]; l != nil && l.state == leaseRunning {
			ended = append(ended, pid)
			if int32(l.uid) != sv.uid {
				others = append(others, pid)
			}
		}
	}
	if len(others) > 0 && w.pick(2) == 0 {
		ended = others
	}
	pids := slices.Sorted(maps.Keys(si.clients))
	switch r := w.pick(4); {
	case r < 2 && len(pids) > 0:
		named = pids[w.pick(len(pids))]
	case r == 2 && len(ended) > 0:
		named = ended[w.pick(len(ended))]
	}
	si.logOff++
	si.events = append(si.events, simEvent{kind: evCulpritRecord, pid: sv.pid, client: named, off: si.logOff, forged: true})
	w.tally["forged record"]++
	w.logf("uid %d forges a record: server %d's client %d raised its next fault", by, sv.pid, named)
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
	si.ctl.hung = true
	if err := w.recover(si, []fault{{kind: faultHung, restart: restartDaemon, reason: "control daemon stopped answering"}}, false); err != nil {
		return err
	}
	// The old daemon, its servers and their clients are gone.
	for _, pid := range slices.Sorted(maps.Keys(si.clients)) {
		c := si.clients[pid]
		c.doomed = true
		delete(si.clients, pid)
		w.processEnds(pid)
	}
	clear(si.servers)
	si.events = nil
	si.sched = mpssched.New(simHost{si}, si.in.p.Multiuser, 0)
	si.newControl()
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
		w.processEnds(pid)
	}
	clear(si.servers)
	si.events = nil
	in.mps = newMPSModel()
	si.sched = mpssched.New(simHost{si}, in.p.Multiuser, 0)
	si.newControl()
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
	base := simUIDsA // the group's members
	if si.in.group == "m" {
		base = simUIDsM
	}
	c := &simClient{pid: w.newProcess(), uid: uint32(base + w.pick(3))}
	w.logf("unleased client %d of uid %d starts", c.pid, c.uid)
	si.connect(c)
}

// reconcile: mpsd lists the servers' clients and counts those no lease
// holds (reconciliation under "report": it ends none).
func (w *simWorld) reconcile(si *simInst) error {
	mark := si.in.mps.faultMark()
	by, seen := map[int][]int{}, map[int]bool{}
	clear(si.knownUnleased)
	for _, pid := range slices.Sorted(maps.Keys(si.servers)) {
		sv := si.servers[pid]
		if _, known := si.in.mps.servers[pid]; !known {
			continue // not verified yet: mpsd lists only its verified servers
		}
		seen[pid] = true
		for _, c := range sv.clients {
			if c.lease == nil {
				by[pid] = append(by[pid], c.pid)
				si.knownUnleased[c.pid] = w.now
			}
		}
	}
	si.in.mps.setUnleased(by)
	// The daemon's word on each server held in FAULT (get_server_status),
	// as reconcileInstance asks it.
	states := map[int]mps.ServerState{}
	for _, pid := range si.in.mps.inFault() {
		if st, err := si.ctl.ReportedServerStatus(context.Background(), pid); err == nil {
			states[pid] = st
		}
	}
	if si.in.mps.endFaults(faultEvidence{unleased: by, seen: seen, state: states}, mark) {
		w.logf("mpsd: a server leaves FAULT")
	}
	// A server mpsd holds in FAULT is one MPS holds in FAULT (or one gone,
	// whose exit has not reached mpsd yet).
	for _, pid := range si.in.mps.inFault() {
		if sv := si.servers[pid]; sv != nil && !sv.faulted {
			return fmt.Errorf("mpsd holds server %d in FAULT after a reconciliation; MPS does not", pid)
		}
		w.tally["FAULT held"]++
	}
	if len(by) > 0 {
		w.tally["unleased held"]++
	}
	w.logf("reconcile: unleased %v", by)
	return nil
}

// resume: mpsctl resume lifts the quarantine and the bars.
func (w *simWorld) resume(si *simInst) {
	in := si.in
	in.holds.quarantined, in.quarantinedFor, in.failures = false, "", nil
	in.liftBarsLocked()
	si.anonFailures, si.uidFaults = nil, map[uint32][]time.Time{}
	w.logf("resume %s", in.key)
}

// recover runs one recovery of the faults: mpsd's own beginning of it
// (beginRecovery: the culprits the server's log named where facts
// confirm them, the plan, bars and quarantine, and the revocation with
// its kills and requeues), then the servers' restart as recoverOnce
// asks for it. chargesNobody is the simulation's own knowledge, whatever
// mpsd marked the faults: a server lost while mpsd was away may have been
// ended by MPS itself, so its fault charges nobody.
func (w *simWorld) recover(si *simInst, faults []fault, chargesNobody bool) error {
	in := si.in
	type before struct{ attempt, spared, charged int }
	was := map[*lease]before{}
	for _, l := range in.leases {
		was[l] = before{l.attempt, l.spared, l.charged()}
	}
	// Whether the daemon of the faults is multiuser: a release or requeue
	// of the recovery may empty an instance held for a restart, which
	// then takes the config's (retireIfEmptyLocked).
	multiuser := in.p.Multiuser
	// Which processes the culprit records name had ended before the
	// recovery revokes (and kills) anything.
	endedBefore := map[int]bool{}
	for _, rs := range si.records {
		for _, r := range rs {
			if p := w.procs[r.client]; p != nil && p.ended {
				endedBefore[r.client] = true
			}
		}
	}
	// mpsd's intake (reportFault): each fault is pending, and an instance
	// that is up is recovering, closed to placements, until its
	// supervisor has handled them; the supervisor takes them all for one
	// recovery.
	for _, f := range faults {
		w.core.reportFault(in, f)
	}
	if in.life != instRecovering {
		return fmt.Errorf("%s is %v after a fault was reported", in.key, in.life)
	}
	faults = in.takePendingLocked()
	// The instance's control daemon is its own only for the recovery:
	// the caps commands of a grant (a goroutine each) are not simulated.
	in.daemon = si.ctl
	r := w.core.beginRecovery(in, faults)
	if in.daemon == si.ctl {
		in.daemon = nil
	}
	in.handling = nil
	w.applyKills(si)
	f, plan := r.f, r.plan
	blamed, anonymous := culprits(faults)
	if err := w.checkLogCulprits(si, faults, multiuser, endedBefore); err != nil {
		return err
	}
	// The simulation's own count of the rule.
	if chargesNobody {
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
	// As the supervisor once the recovery is done: the instance is up
	// again, its queue runs, and one held for a restart that the
	// recovery emptied is stopped.
	if in.life == instRecovering {
		eff, err := in.step(instEvRecovered, "faults handled")
		if err != nil {
			return fmt.Errorf("%s: %w", in.key, err)
		}
		if eff&effSchedule != 0 {
			w.core.scheduleLocked(in.group)
		}
		w.core.retireIfEmptyLocked(in)
	}
	// What the revocation did to each victim: killed (none of its
	// processes is left), then requeued or ended.
	for _, l := range plan.victims {
		if left := si.leaseClients(l); len(left) > 0 {
			return fmt.Errorf("%s revoked, yet its client %d runs on", l.id, left[0].pid)
		}
		if l.state == leaseRunning && l.attempt == was[l].attempt {
			return fmt.Errorf("%s, a victim, was not revoked", l.id)
		}
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
		if plan.spared[l.id] || chargesNobody {
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
		if got := l.charged(); got != was[l].charged+map[bool]int{true: 0, false: 1}[spare] {
			return fmt.Errorf("%s charged %d attempts, was %d, spare %v", l.id, got, was[l].charged, spare)
		}
	}
	return w.noteGrants()
}

// checkLogCulprits checks each server fault's culprit as the server's
// log named it (nameLogCulprits sets it on the fault), against the rule
// (culprithint.go) counted on the simulation's own records: only on a
// daemon without multiuser; only where exactly one record of the server
// reached mpsd within culpritHintAge; only the lease of the server's uid
// whose process that record named, and only once that process has ended
// (before the recovery kills anything: endedBefore);
// and a lease other than the one whose client raised the fault only when
// the record was forged (what a member who writes the FIFO can do within
// the server's uid, docs/security.md), never another uid's lease.
func (w *simWorld) checkLogCulprits(si *simInst, faults []fault, multiuser bool, endedBefore map[int]bool) error {
	now := w.clk.Now()
	for _, f := range faults {
		if f.kind != faultServerFault {
			continue
		}
		var recs []simRecord
		for _, r := range si.records[f.server] {
			if now.Sub(r.at) <= culpritHintAge {
				recs = append(recs, r)
			}
		}
		delete(si.records, f.server) // used up, as nameLogCulprits does
		if f.culprit.lease == "" {
			continue
		}
		w.tally["log-named culprit"]++
		switch {
		case multiuser:
			return fmt.Errorf("server %d's log named culprit %s on multiuser daemon %s", f.server, f.culprit.lease, si.in.key)
		case len(recs) != 1:
			return fmt.Errorf("server %d's fault charged %s on its log's word, with %d records naming culprits", f.server, f.culprit.lease, len(recs))
		}
		r := recs[0]
		p := w.procs[r.client]
		switch suid := si.faultUID[f.server]; {
		case p == nil || p.lease != f.culprit.lease:
			return fmt.Errorf("server %d's fault charged %s; its record named pid %d, no process of it", f.server, f.culprit.lease, r.client)
		case !endedBefore[r.client]:
			return fmt.Errorf("server %d's fault charged %s; pid %d, which its record named, ran on until the recovery", f.server, f.culprit.lease, r.client)
		case int32(f.culprit.uid) != suid:
			return fmt.Errorf("server %d (uid %d) faulted; %s of uid %d charged on its log's word", f.server, suid, f.culprit.lease, f.culprit.uid)
		case si.culprit[f.server] != nil && si.culprit[f.server].id == f.culprit.lease:
		case !r.forged:
			return fmt.Errorf("server %d's own record named %s, not the lease whose client raised the fault", f.server, f.culprit.lease)
		default:
			w.tally["framed within its uid"]++
		}
	}
	return nil
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
	if w.violation != nil {
		return w.violation
	}
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
