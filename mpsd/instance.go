package mpsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// instance is one MPS control daemon for a GPU set and a group. Every
// field is guarded by Daemon.mu; the mps.Daemon handle itself is safe to
// use without it.
type instance struct {
	key     string
	group   string
	gpus    []gpu.Info
	pipeDir string
	logDir  string
	log     *slog.Logger

	p      policy.Instance
	maxSM  int
	maxMem int64
	daemon control
	// mps is what MPS does on the instance: its servers and their uids,
	// the servers mpsd shut down, the clients no lease holds
	// (mpsmodel.go).
	mps *mpsModel
	// driver is the NVIDIA driver's version, as NVML reported it
	// (mpsversion.go).
	driver   string
	restarts int
	leases   map[string]*lease

	// life is where the daemon is in its life (instancestate.go); it
	// changes only through step. holds close the instance to placements.
	life  lifecycle
	holds holds

	// The supervisor's (supervisor.go): kick wakes it; done is closed
	// when it ends; stopReq is a stop asked of it; probeCancel cuts its
	// probe under way short; capsProbing: a caps check a probe began runs.
	kick        chan struct{}
	done        chan struct{}
	stopReq     *stopRequest
	probeCancel context.CancelFunc
	capsProbing bool

	tried     chan struct{} // closed after the first start attempt
	triedOnce sync.Once
	// bringing: a bring-up is starting or adopting a daemon now, until
	// it has one (then daemon is set) or the attempt has failed.
	bringing bool
	// startErr: why the bring-up's last attempt failed, until a daemon
	// answers (status's LastStartError).
	startErr string
	// seen: what the last reconciliation read of the instance's MPS
	// clients for status: those of no lease, and device memory
	// (reconcile.go, noteUsage).
	seen clientUsage

	// The watchdog's state (watchdog.go).
	pending    []fault        // faults for the supervisor's next recovery
	handling   []fault        // the faults its recovery handles now, until their victims are revoking
	failures   []time.Time    // failures within the quarantine window
	probeFails int            // failed probes in a row
	faults     map[string]int // faults reported, by kind
	restartsBy map[string]int // recoveries, by the kind of fault
	// quietProbes: probes in a row that sent the daemon no command
	// (probeNeedsCommandLocked).
	quietProbes int
	// handlingMarked: the recovery of handling has marked its victims
	// revoking (with the state write that records them): the lines its
	// faults were read from need not be read again (serverLogSavedLocked).
	handlingMarked bool
	// quarantinedFor: why it was quarantined (the failures, the last
	// one's reason), while it is.
	quarantinedFor string
	// drain is the record of an operator's drain (who, when, why) while
	// holds.drained is set.
	drain drainRecord
	// uidFailures: the faults each culprit uid caused within the
	// quarantine window; barred: the uids refused for them (culprit.go).
	uidFailures map[uint32][]time.Time
	barred      map[uint32]uidBar

	metricLabels *instanceLabels // made at the first scrape
	serverLogOff int64           // where the previous mpsd stopped reading server.log; -1: unknown
	// logHandled: server.log holds no fault before this offset that is
	// not handled (recovery begun); -1 without a daemon. Saved with every
	// state write, the last at a clean stop, so the next mpsd reads on
	// from there: a fault read too late to handle (mpsd was stopping) is
	// read again, and after a crash one may be handled twice; none is lost.
	logHandled int64
	// savedServers: the servers (pid: uid) the previous mpsd left running,
	// checked once at the first adoption.
	savedServers map[int]int
	// savedDaemon: the daemon the previous mpsd ran (pid and start time);
	// the first adoption takes that one only. Nil: none saved.
	savedDaemon *mps.DaemonIdentity
	// unverified counts MPS records naming no verified server of the
	// daemon, or that nothing confirmed (mpsd_unverified_mps_records_total).
	unverified uint64
	// claims are fault records of verified servers waiting for an Xid to
	// confirm them (verify.go); deciding, those settled and being acted
	// on (their fault reported or dropped); xidUsed is the time of the
	// last Xid that confirmed one: each Xid confirms one record.
	claims   []*faultClaim
	deciding []*faultClaim
	xidUsed  time.Time
	// culpritHints: the clients servers' logs named as their next fault's
	// culprit, waiting for the fault's recovery (culprithint.go).
	culpritHints []culpritHint
	// xidHandled is the time of the last Xid that took the instance down
	// itself (its own fault, reported), and xidHandledServers the servers
	// it took down: the fault record MPS writes after it about one of
	// them is the same fault's; one about a server started since is not.
	xidHandled        time.Time
	xidHandledServers []int
	// unverifiedLog and fatalLog let through a line a second about
	// unverified and fatal-exception records (anyone may write them).
	unverifiedLog, fatalLog logGate
	// reconRunning: a reconciliation of the instance runs (reconcile.go);
	// reconAgain: it runs once more when done; reconEvent: a client event
	// asked for it since the last one began.
	reconRunning, reconAgain, reconEvent bool
	// capsMu serializes the instance's caps commands (caps.go): a check
	// computes what a server should allow and sets it, and a grant sets
	// the daemon's defaults, one at a time, so that an older decision
	// never lands after a newer one. Never held with Daemon.mu held by
	// the caller; each command under it is bounded by the probe timeout.
	capsMu sync.Mutex
	// capDrifts counts, by cap (caps.go), the times a server's cap was
	// found off the group's and set back (mpsd_mps_cap_drift_total).
	capDrifts map[string]uint64
	// shm is what the last check of its private /dev/shm found (shm.go).
	shm shmState
	// logLost: the daemon whose log was found lost, and since when
	// (loglost.go).
	logLost logLoss
	// bell is closed at the next change a waiting release looks at (an
	// Xid on the instance's GPUs, a probe's outcome, a fault reported):
	// releases wait on it while the log is lost (loglost.go) or the
	// daemon does not answer (unanswered.go).
	bell chan struct{}
}

func (in *instance) markTried() { in.triedOnce.Do(func() { close(in.tried) }) }

func instanceKey(group string, idx []int) string {
	s := make([]string, len(idx))
	for i, x := range idx {
		s[i] = strconv.Itoa(x)
	}
	return group + "/" + strings.Join(s, ",")
}

// status is the instance as mpsctl status shows it.
func (in *instance) statusLocked() api.InstanceStatus {
	st := api.InstanceStatus{
		GPUUUID:           in.gpus[0].UUID,
		GPUIndex:          in.gpus[0].Index,
		Group:             in.group,
		State:             in.shownState(),
		ServerPIDs:        []int{},
		Clients:           len(in.leases),
		Restarts:          in.restarts,
		SMAllocated:       in.p.Alloc.SM,
		SMBudget:          in.p.Budget.SM,
		MemAllocatedBytes: in.p.Alloc.Mem,
		MemBudgetBytes:    in.p.Budget.Mem,
		MaxClients:        in.p.Budget.Clients,
		Drained:           in.holds.drained,
		ClientsAllocated:  in.p.Alloc.Clients,
		Multiuser:         in.p.Multiuser,
	}
	if in.holds.drained {
		st.DrainReason, st.DrainedBy, st.DrainedAt = in.drain.reason, in.drain.by, in.drain.at
	}
	if in.holds.quarantined {
		st.QuarantineReason = in.quarantinedFor
		if st.QuarantineReason == "" {
			st.QuarantineReason = "unknown (quarantined by an older mpsd)"
		}
	}
	pending := in.mps.pending(in.p.Multiuser)
	for _, v := range in.mps.view() {
		st.ServerPIDs = append(st.ServerPIDs, v.pid)
		s := api.ServerStatus{PID: v.pid, UID: v.uid, LeasedClients: v.leased, UnleasedClients: v.unleased, Fault: v.fault}
		for _, id := range pending[v.pid] {
			// As the last reconciliation saw them: only those running now.
			if l := in.leases[id]; l != nil && l.state == leaseRunning {
				s.PendingLeases = append(s.PendingLeases, id)
			}
		}
		st.Servers = append(st.Servers, s)
	}
	for _, g := range in.gpus {
		st.GPUIndexes = append(st.GPUIndexes, g.Index)
		st.GPUUUIDs = append(st.GPUUUIDs, g.UUID)
	}
	if len(in.gpus) > 0 {
		st.GPUModel = in.gpus[0].Name
	}
	if in.daemon != nil {
		st.DaemonPID = in.daemon.PID()
	}
	st.DriverVersion, st.MPSVersion = in.versionsLocked()
	st.LastStartError = in.startErr
	if !in.p.Multiuser {
		if up, uid, _, _ := in.mps.serving(in.placedUID()); up {
			u := int(uid)
			st.ServingUID = &u
		}
	}
	if in.seen.read {
		// Only the clients of servers that live on: a server's exit ends
		// its clients' connection.
		for _, c := range in.seen.unleased {
			if slices.Contains(st.ServerPIDs, c.Server) {
				if c.MemBytes != nil {
					v := *c.MemBytes
					c.MemBytes = &v
				}
				st.Unleased = append(st.Unleased, c)
			}
		}
		used := in.seen.memUsed
		st.MemUsedBytes, st.UnleasedMemBytes = &used, int64(min(in.seen.unleasedMem, math.MaxInt64))
	}
	return st
}

// reconcileLocked makes the instance set match cfg: new instances are
// created (and started by the caller through supervise), existing ones take
// the new budgets without being touched, and instances cfg no longer has
// retire once their leases are gone.
func (d *Daemon) reconcileLocked(cfg *policy.Config) (added []*instance) {
	inv := d.host.GPUs()
	want := map[string]bool{}
	for i := range cfg.Groups {
		g := &cfg.Groups[i]
		for _, set := range g.Instances {
			key := instanceKey(g.Name, set)
			want[key] = true
			in, ok := d.instances[key]
			if !ok {
				in = &instance{
					key:          key,
					group:        g.Name,
					mps:          newMPSModel(),
					leases:       map[string]*lease{},
					tried:        make(chan struct{}),
					kick:         make(chan struct{}, 1),
					done:         make(chan struct{}),
					faults:       map[string]int{},
					restartsBy:   map[string]int{},
					serverLogOff: -1,
					logHandled:   -1,
				}
				for _, x := range set {
					in.gpus = append(in.gpus, inv[x])
				}
				in.pipeDir = d.layout.PipeDir(g.Name, in.gpus[0].UUID)
				in.logDir = d.layout.InstanceLogDir(g.Name, in.gpus[0].UUID)
				in.log = d.log.With("group", g.Name, "gpu", in.gpus[0].UUID, "gpu_index", in.gpus[0].Index)
				in.p = policy.Instance{Group: g.Name, GPUs: slices.Clone(set), Multiuser: g.Multiuser}
				in.driver = d.host.DriverVersion()
				d.setInstanceLocked(in)
				added = append(added, in)
			} else if in.p.Multiuser != g.Multiuser {
				// -multiuser-server is a start option: the daemon is
				// restarted once its leases have ended.
				in.holds.restartPending = true
			}
			in.holds.retiring = false
			in.p.Budget = g.Budget()
			in.maxSM, in.maxMem = g.MaxSM, g.MaxMem
		}
	}
	for key, in := range d.instances {
		if !want[key] && !in.holds.retiring {
			in.holds.retiring = true
			in.log.Info("instance retiring: no longer in the config; it stops when its leases end")
		}
	}
	d.sweepShmLocked() // shm.go
	return added
}

// setInstanceLocked adds an instance to d.instances.
func (d *Daemon) setInstanceLocked(in *instance) {
	d.instances[in.key] = in
	d.byGroup = nil
}

// dropInstanceLocked removes an instance from d.instances.
func (d *Daemon) dropInstanceLocked(in *instance) {
	delete(d.instances, in.key)
	d.byGroup = nil
}

func (d *Daemon) instanceList() []*instance {
	return slices.SortedFunc(maps.Values(d.instances), func(a, b *instance) int { return strings.Compare(a.key, b.key) })
}

// mpsConfig is the mps.Config of an instance: its own pipe and log
// directories, its GPUs, and defaults that cap what any client of the
// group can take even if it drops the limits mps-launch gives it (MPS lets
// a client only lower them).
func (d *Daemon) mpsConfig(in *instance) mps.Config {
	c := d.mpsBase
	c.PipeDir, c.LogDir = in.pipeDir, in.logDir
	c.ProcRoot = d.proc
	c.Logger = in.log.With("component", "mps")
	for _, g := range in.gpus {
		c.VisibleDevices = append(c.VisibleDevices, g.UUID)
	}
	c.Multiuser = in.p.Multiuser
	if d.opts.PrivateShm != nil && d.opts.PrivateShm(in.group) {
		c.Runner = mps.PrivateShm(c.Runner, d.shmMountLocked(in)) // shm.go
	}
	if in.serverLogOff >= 0 { // the first adoption after a restart only
		c.ResumeServerLog, c.ServerLogOffset, in.serverLogOff = true, in.serverLogOff, -1
	}
	if in.savedDaemon != nil { // the first adoption after a restart only
		c.Expect, in.savedDaemon = in.savedDaemon, nil
	}
	c.DefaultThreadPercentage = float64(in.maxSM)
	c.DefaultPinnedMem = map[int]int64{}
	for i := range in.gpus {
		c.DefaultPinnedMem[i] = in.maxMem
	}
	return c
}

// bringUp adopts the instance's running daemon or starts one, retrying
// with the watchdog's backoff until it answers or mpsd stops. It runs in
// the instance's supervisor, without Daemon.mu: starting a daemon waits on
// processes.
func (d *Daemon) bringUp(in *instance, adopt bool) {
	defer in.markTried()
	d.mu.Lock()
	if in.life != instStarting {
		d.mu.Unlock()
		return
	}
	cfg := d.mpsConfig(in)
	wd := d.cfg.Watchdog
	d.mu.Unlock()

	backoff := wd.BackoffInitial
	toldGone := false // the daemon found gone was reported (its leases revoked)
	for attempt := 1; ; attempt++ {
		d.mu.Lock()
		if d.shuttingDown {
			// mpsctl shutdown ends the MPS service: nothing is started.
			d.mu.Unlock()
			in.log.Info("control daemon not started: mpsctl shutdown is under way")
			return
		}
		// A shutdown that begins now waits for this start (awaitQuiet).
		in.bringing = true
		d.mu.Unlock()
		dm, how, err := d.startDaemon(cfg, adopt)
		cfg.Expect = nil // the saved daemon is looked for once
		if err == nil && how != "adopted" && !toldGone {
			d.mu.Lock()
			orphaned := len(in.leases)
			d.mu.Unlock()
			if orphaned > 0 {
				// Leases re-adopted from the state had their clients on a
				// daemon that is gone (or was found hung and stopped):
				// their MPS server went with it. Reported before the
				// instance is up, so that it never looks up with them on
				// it: a lease whose command that end killed would be
				// taken for one that ended on its own (reapAdopted).
				toldGone = true
				d.reportFault(in, fault{kind: faultDaemonExit, restart: restartNone,
					reason: fmt.Sprintf("the MPS control daemon of group %s on GPU %d was gone or hung when mpsd started; a new one runs", in.group, in.gpus[0].Index)})
			}
		}
		if err == nil {
			d.mu.Lock()
			if d.shuttingDown {
				// mpsctl shutdown began while it started: it is stopped
				// again, and the shutdown's answer counts it (if the
				// shutdown is still waiting: Run waits for this stop).
				d.mu.Unlock()
				d.stopLate(in, dm)
				return
			}
			if d.ctx.Err() != nil {
				// Run is closing every handle; this one came too late.
				in.bringing = false
				d.mu.Unlock()
				_ = dm.Close()
				return
			}
			in.bringing = false
			in.startErr = ""
			in.daemon, in.logHandled = dm, dm.ServerLogStart()
			// Saved at once: a crash before the next write would leave the
			// state naming the daemon this one replaced, and the next mpsd
			// would take this live daemon for a stranger and revoke its
			// leases.
			d.store.request()
			if len(in.pending) > 0 {
				// Reported while there was no daemon yet: their recovery
				// takes over the instance once the bring-up is done
				// (the supervisor runs it next).
				_, _ = in.step(instEvFault, in.pending[0].kind)
			}
			d.mu.Unlock()
			d.spawn(func() { d.watchInstance(in, dm) })
			if how == "adopted" {
				// What MPS logged while mpsd was away is read again now:
				// have its faults handled (their leases revoked) before
				// the instance takes, or confirms to a launcher, any lease.
				select {
				case <-dm.Barrier():
				case <-d.ctx.Done():
				}
				d.serversLostWhileAway(in)
			}
			d.mu.Lock()
			if how == "adopted" && !in.p.Multiuser {
				// Placed on nothing until a reconciliation has read MPS's
				// client lists: a member's unleased client the previous
				// mpsd knew of holds its server for its uid, and another
				// uid's grant would hang inside MPS behind it.
				in.holds.unreconciled = true
			}
			if in.life == instStarting {
				// Else a fault found meanwhile made it recovering: the
				// recovery reopens it.
				if eff, err := in.step(instEvUp, how); err == nil && eff&effSchedule != 0 {
					d.scheduleLocked(in.group)
				}
			}
			held := in.holds.unreconciled
			d.mu.Unlock()
			if held {
				d.reconcileSoon(in, true)
			}
			in.log.Info("instance up", "how", how, "daemon_pid", dm.PID(), "multiuser", cfg.Multiuser)
			return
		}
		d.mu.Lock()
		in.bringing = false
		in.startErr = err.Error()
		orphaned := 0
		for _, l := range in.leases {
			if l.state == leaseRunning {
				orphaned++
			}
		}
		// An instance that left the config while this attempt ran, and
		// never had a daemon, is dropped now rather than retried.
		d.retireIfEmptyLocked(in)
		dropped := in.life == instStopped
		d.mu.Unlock()
		if dropped {
			in.log.Error("instance start failed; not retried: the instance left the config", "attempt", attempt, "err", err)
			return
		}
		in.log.Error("instance start failed", "attempt", attempt, "retry_in", backoff, "err", err)
		// Tried before the report below: the state writer starts once
		// every instance has been, and the revocation's record waits for
		// it when it can.
		in.markTried()
		if how == "gone" && orphaned > 0 && !toldGone && !errors.Is(err, mps.ErrLocalResources) {
			// The leases re-adopted from the state had their clients on
			// the daemon found gone: they are revoked now, not once a
			// start succeeds, which may be never. (A start mpsd could not
			// make for want of its own descriptors or memory says nothing
			// of MPS: it is retried, as is the look for the daemon.)
			toldGone = true
			d.reportFault(in, fault{kind: faultDaemonExit, restart: restartNone,
				reason: fmt.Sprintf("the MPS control daemon of group %s on GPU %d was gone or hung when mpsd started, and no new one starts: %v", in.group, in.gpus[0].Index, err)})
		}
		select {
		case <-d.ctx.Done():
			return
		case <-in.kick:
			// A reload may have dropped it (retireIfEmptyLocked).
		case <-d.after(backoff):
		}
		d.mu.Lock()
		dropped = in.life == instStopped
		d.mu.Unlock()
		if dropped {
			in.log.Info("instance start not retried: the instance left the config")
			return
		}
		backoff = min(2*backoff, wd.BackoffMax)
		adopt = true
	}
}

// stopLate stops dm, which in's bring-up started (or adopted) while
// mpsctl shutdown was under way, and has the shutdown's answer count it.
func (d *Daemon) stopLate(in *instance, dm control) {
	r := d.stopDaemon(in, &stopRequest{dm: dm, why: "mpsctl shutdown (it came up during the shutdown)"})
	d.mu.Lock()
	defer d.mu.Unlock()
	in.bringing = false
	d.lateStops++
	switch {
	case r.err != nil:
		d.lateProblems = append(d.lateProblems, fmt.Sprintf("GPU %s group %s: control daemon: %v", gpuList(in), in.group, r.err))
	case !r.rep.Graceful && !r.rep.AlreadyExited:
		d.lateProblems = append(d.lateProblems, fmt.Sprintf("GPU %s group %s: control daemon did not quit in time and was killed", gpuList(in), in.group))
	}
}

func (d *Daemon) startDaemon(cfg mps.Config, adopt bool) (control, string, error) {
	ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
	defer cancel()
	// A daemon that is there answers within what the watchdog allows a
	// probe, or counts as hung. The limit is the daemon's to answer in:
	// mpsd's own work of adopting it (reading its control log, as long as
	// the daemon's life) is not counted, or a busy host would have a live
	// daemon taken for hung and stopped with every client on it.
	d.mu.Lock()
	wd := d.cfg.Watchdog
	d.mu.Unlock()
	limit := max(wd.ProbeTimeout*time.Duration(wd.ProbeFailures), time.Second)
	adoptCfg := func() mps.Config { c := cfg; c.AnswerTimeout = limit; return c }
	// gone: the daemon that was there is not (none answered, or the one
	// there was hung, or no daemon of the saved state, and was stopped):
	// a start that fails then is reported "gone", its leases' clients
	// went with it.
	gone := false
	if adopt {
		t0 := d.clock.Now()
		dm, err := d.starter.Adopt(ctx, adoptCfg())
		if err == nil {
			return dm, "adopted", nil
		}
		if !errors.Is(err, mps.ErrNoDaemon) || errors.Is(err, mps.ErrUnverifiedDaemon) {
			cfg.Logger.Warn("adopting the running MPS control daemon failed", "pipe_dir", cfg.PipeDir, "took", d.clock.Since(t0), "limit", limit, "err", err)
		}
		if cfg.Expect != nil && errors.Is(err, mps.ErrUnverifiedDaemon) {
			// The daemon the previous mpsd ran is gone; whatever holds the
			// pipe directory now is no daemon of those leases: a verified
			// control daemon is stopped (and only such a one), then a new
			// one starts and the leases are revoked as after a daemon exit.
			d.log.Warn("the MPS control daemon the previous mpsd ran is gone; stopping what holds its pipe directory and starting anew",
				"pipe_dir", cfg.PipeDir, "expected_pid", cfg.Expect.PID, "expected_start_time", cfg.Expect.StartTime, "err", err)
			cfg.Expect = nil
			if _, rerr := d.starter.Reclaim(ctx, cfg); rerr != nil && !errors.Is(rerr, mps.ErrNoDaemon) {
				return nil, "", fmt.Errorf("adopt control daemon on %s: %w; reclaim the daemon there: %w", cfg.PipeDir, err, rerr)
			}
		} else if errors.Is(err, mps.ErrTimeout) || errors.Is(err, mps.ErrDaemonQuitting) {
			// A daemon that is there but does not answer (stopped, hung)
			// would block the instance for ever: stop it and start anew.
			if _, rerr := d.starter.Reclaim(ctx, cfg); rerr != nil {
				return nil, "", fmt.Errorf("adopt control daemon on %s: %w; reclaim it: %w", cfg.PipeDir, err, rerr)
			}
		} else if !errors.Is(err, mps.ErrNoDaemon) {
			return nil, "", fmt.Errorf("adopt control daemon on %s: %w", cfg.PipeDir, err)
		}
		gone = true
	}
	dm, err := d.starter.Start(ctx, cfg)
	if errors.Is(err, mps.ErrAlreadyRunning) {
		dm, err = d.starter.Adopt(ctx, adoptCfg()) // cfg as it is now: Expect dropped, if it was
		return dm, "adopted", err
	}
	if err != nil {
		how := ""
		if gone {
			how = "gone"
		}
		return nil, how, fmt.Errorf("start control daemon on %s: %w", cfg.PipeDir, err)
	}
	return dm, "started", nil
}

// watchInstance follows one daemon's events until its handle closes:
// it keeps the server pids for placement and status, and hands every sign
// of failure to the watchdog (watchdog.go).
func (d *Daemon) watchInstance(in *instance, dm control) {
	for ev := range dm.Events() {
		if d.opts.eventHook != nil {
			d.opts.eventHook(in, ev)
		}
		d.mu.Lock()
		current := in.daemon == dm
		var exit exitVerdict
		switch ev.Kind {
		case mps.ServerStarted:
			in.mps.serverStarted(ev.PID, ev.UID)
			// Recorded, so that a crash of mpsd does not hide its death.
			d.store.request()
			if current {
				// A verified server (a child of the daemon): the group's
				// caps are checked on it once it is ready (caps.go).
				d.spawn(func() { d.serverStartedCaps(in, dm, ev.PID) })
			}
		case mps.ServerExited:
			held, faulted := in.mps.held(), in.mps.faulted()
			exit = in.mps.serverExited(ev, in.leases, in.p.Multiuser)
			if current && (held && !in.mps.held() || faulted && !in.mps.faulted()) {
				// The server that unleased clients held, or that was
				// held in FAULT, is gone: another uid, or anyone, may be
				// served now.
				d.scheduleLocked(in.group)
			}
		}
		d.mu.Unlock()
		if !current {
			ev.Ack()
			continue
		}
		switch ev.Kind {
		case mps.DaemonExited:
			f := fault{kind: faultDaemonExit, restart: restartDaemon,
				reason: fmt.Sprintf("MPS control daemon %d of group %s on GPU %d exited (%s)", ev.PID, in.group, in.gpus[0].Index, exitText(ev))}
			d.chargeUnlessLogLost(in, dm, &f, ev.Signal == syscall.SIGSEGV)
			d.reportFault(in, f)
		case mps.ServerExited:
			d.serverExited(in, ev, exit)
		case mps.FatalException:
			// A log line (anyone's, verify.go): the server's end, if it
			// ends, comes from its pidfd. Logged at most once a second,
			// with how many records the line stands for.
			d.mu.Lock()
			records, pass := in.fatalLog.pass(d.clock.Now(), 1+max(ev.Suppressed, 0))
			d.mu.Unlock()
			if pass {
				in.log.Info("MPS logged a fatal exception of a server; its exit, if any, is seen through its pidfd", "pid", ev.PID, "known_server", ev.KnownServer, "records", records)
			}
		case mps.ServerFault:
			if !ev.KnownServer {
				d.unverifiedRecord(in, ev, "it names no verified server of the daemon")
				break
			}
			f := fault{kind: faultServerFault, restart: restartNone, fromServerLog: ev.InServerLog, logOffset: ev.LogOffset, server: ev.PID,
				reason: fmt.Sprintf("a client of group %s on GPU %d hit a fatal GPU error; MPS set a sticky error on every client of the server", in.group, in.gpus[0].Index)}
			if ev.InServerLog && dm.WrittenUnwatched(ev.LogOffset) {
				// Read again after mpsd was away: its Xid, if any, came
				// and went unseen. Only leases whose processes are all
				// gone are taken (a real fault ended them); a lease that
				// still runs was not hit, whatever the record says.
				if ended := d.endedLeases(in); len(ended) > 0 {
					f.leases = ended
					d.reportFault(in, f)
				} else {
					d.unverifiedRecord(in, ev, "written while mpsd was away, and every lease of the instance still runs")
				}
				break
			}
			d.mu.Lock()
			handled := d.xidHandledLocked(in, d.clock.Now(), ev.PID)
			var confirmed *fault
			var joined bool
			if !handled {
				confirmed, joined = d.claimServerFaultLocked(in, dm, ev, f, d.clock.Now())
			}
			d.mu.Unlock()
			switch {
			case handled:
				in.log.Info("MPS fault record of the fault an Xid already took the instance down for", "server", ev.PID)
			case confirmed != nil:
				in.log.Info("MPS fault record confirmed by an Xid", "server", ev.PID)
				d.reportFault(in, *confirmed)
			case joined:
				in.log.Debug("MPS fault record joins the claim waiting for its server", "server", ev.PID)
			default:
				in.log.Info("MPS fault record waits for an Xid to confirm it", "server", ev.PID, "wait", faultClaimWait)
			}
		case mps.Barrier:
			// Every event before it is handled (a fault's recovery has
			// begun, or its record was found false): whoever waits may
			// look at the instance now.
			d.mu.Lock()
			held := in.holdBarrierLocked(ev)
			d.mu.Unlock()
			if !held {
				ev.Ack()
			}
		case mps.FaultCulprit:
			// A hint of whose fault the server's next one is; facts
			// decide whether it names the culprit (culprithint.go).
			d.noteCulpritHint(in, dm, ev)
		case mps.UnverifiedRecord:
			// Anyone who can reach the pipe directory can write MPS log
			// records; mps acted on none of this one.
			d.unverifiedRecord(in, ev, "it names no verified server of the daemon")
		case mps.ClientConnected:
			// A "NEW CLIENT" record (anyone may write one): only a reason
			// to reconcile the instance now; its pid is not used.
			d.reconcileSoon(in, true)
		case mps.ServerStartFailed:
			// Nothing can confirm one: any member may write the record,
			// naming another member's uid while that member has no
			// server yet (from its grant to its first CUDA call). A
			// server that did start and died is reported by its pidfd
			// (server_exit); one that never started leaves its clients
			// with a CUDA error, which their commands report.
			d.unverifiedRecord(in, ev, "nothing confirms a server start failure (a server that started and died is reported by its exit)")
		default:
			in.log.Debug("MPS event", "event", ev.String())
		}
	}
}

// serverExited acts on a server's exit as the instance's MPS model judged
// it (mpsModel.serverExited): only an exit MPS would not make is a fault
// (a crash: a signal, a status other than 0 or one mpsd could not read),
// and its victims are the leases that could have been the server's
// clients. A clean exit (status 0) is MPS's own end of a server whose
// clients have all gone, a uid switch above all (exitVerdict.victims).
func (d *Daemon) serverExited(in *instance, ev mps.Event, v exitVerdict) {
	switch v.kind {
	case exitShutDown:
		return
	case exitNoClients:
		in.log.Info("MPS server exited; no lease on the instance was its client", "server", ev.PID, "server_uid", v.uid, "exit", exitText(ev))
		return
	}
	victims := v.victims()
	if len(victims) == 0 {
		in.log.Info("MPS server exited after its last client left (MPS's uid switch or its end); no fault", "server", ev.PID, "server_uid", v.uid, "leases_of_its_uid", len(v.candidates))
		return
	}
	ids := make([]string, len(victims))
	for i, l := range victims {
		ids[i] = l.id
	}
	d.reportFault(in, fault{kind: faultServerExit, restart: restartNone, leases: ids, server: ev.PID, serverUID: v.uid,
		reason: fmt.Sprintf("MPS server %d of group %s on GPU %d died (%s)", ev.PID, in.group, in.gpus[0].Index, exitText(ev))})
}

// serversLostWhileAway reports as a fault a server the previous mpsd left
// running that the adopted daemon no longer has, if leases of its uid are
// on the instance: it died while mpsd was away, and its clients with it.
func (d *Daemon) serversLostWhileAway(in *instance) {
	d.mu.Lock()
	saved := in.savedServers
	in.savedServers = nil
	lost, victims := lostWhileAway(saved, in.mps, in.leases, in.p.Multiuser)
	d.mu.Unlock()
	if len(lost) > 0 {
		in.log.Warn("MPS servers the previous mpsd saw ended while mpsd was away; their leases are requeued without using up an attempt",
			"servers", lost, "leases", victims)
		d.reportFault(in, lostWhileAwayFault(in, lost, victims))
	}
}

// adoptReconciled opens an adopted instance once a reconciliation that
// began after its adoption has ended (reconcileInstance): what holds its
// servers is known now, or the instance is not up (a fault found
// meanwhile; its recovery reopens it). d.mu is not held.
func (d *Daemon) adoptReconciled(in *instance) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !in.holds.unreconciled {
		return
	}
	in.holds.unreconciled = false
	in.log.Info("adopted instance reconciled; it takes leases", "unleased_held", in.mps.held())
	d.scheduleLocked(in.group)
}

// lostWhileAwayFault is the fault of servers lost while mpsd was away
// (lostWhileAway): its victims only, charged nothing.
func lostWhileAwayFault(in *instance, lost []int, victims []string) fault {
	return fault{kind: faultServerExit, restart: restartNone, leases: victims, uncharged: true,
		reason: fmt.Sprintf("MPS server %d of group %s on GPU %d exited while mpsd was away", lost[0], in.group, in.gpus[0].Index)}
}

// lostWhileAway says which servers of saved (pid: uid, as the previous
// mpsd left them) are gone from the adopted daemon's (m), and which
// running leases could have been their clients: those of the server's
// uid, every one when the daemon is multiuser or the uid unknown. A
// server gone with no such lease is no loss. How it ended is not known:
// no pidfd saw it, and MPS's log (anyone's to write) is no witness. It
// may have crashed, or MPS ended it at a uid switch once its clients had
// gone, so its candidates are revoked (a crash's victims get a server
// again) but charged nothing: no attempt, no quarantine. Another uid's
// leases are never its victims. Sorted, for the log and the fault.
func lostWhileAway(saved map[int]int, m *mpsModel, leases map[string]*lease, multiuser bool) (lost []int, victims []string) {
	hit := map[string]bool{}
	for pid, uid := range saved {
		if _, live := m.uidOf(pid); live {
			continue
		}
		candidates := false
		for id, l := range leases {
			if l.state == leaseRunning && (multiuser || uid < 0 || l.uid == uint32(uid)) {
				hit[id], candidates = true, true
			}
		}
		if candidates {
			lost = append(lost, pid)
		}
	}
	slices.Sort(lost)
	return lost, slices.Sorted(maps.Keys(hit))
}

// exitText is how a fault reason says a daemon or server ended, as
// precisely as it was seen (mps reads the wait status through the
// pidfd: from /proc while the process is a zombie, else, once its parent
// reaped it, from the kernel on Linux 6.15+):
//
//   - "killed by SIGKILL": the wait status says that signal ended it;
//   - "exit status N": it exited with status N;
//   - "exit status not seen": its parent reaped it before mpsd could read
//     the status (Linux before 6.15 only; there a control daemon's status
//     may be the one its own last control.log line gave).
//
// MPS's own log says "exited with status 0" for a killed server; that
// line is never the source of a server's.
func exitText(ev mps.Event) string {
	if ev.Signal != 0 {
		if name := unix.SignalName(ev.Signal); name != "" {
			return "killed by " + name
		}
		return fmt.Sprintf("killed by signal %d", int(ev.Signal))
	}
	if ev.ExitStatus >= 0 {
		return fmt.Sprintf("exit status %d", ev.ExitStatus)
	}
	return "exit status not seen"
}

// retireIfEmptyLocked stops an instance that left the config (or needs a
// restart for a changed start option, or its daemon's log is lost:
// loglost.go) once its last lease has ended: its
// supervisor stops the daemon, then starts a new one or ends. One that
// left the config while starting, with no daemon (none ever answered, or
// the start of a new one fails) and no lease, is dropped at once: its
// bring-up, between attempts, ends, and so does its supervisor.
func (d *Daemon) retireIfEmptyLocked(in *instance) {
	if in.holds.retiring && len(in.leases) == 0 && in.life == instStarting && in.daemon == nil && !in.bringing {
		if _, err := in.step(instEvGone, "left the config before its daemon started"); err == nil {
			d.dropInstanceLocked(in)
			d.store.request() // its holds leave the state file
			in.log.Info("instance dropped: it left the config and its control daemon never started", "last_start_error", in.startErr)
			in.kickLocked()
		}
		return
	}
	logLost := in.logLostLocked()
	if len(in.leases) > 0 || in.life != instUp || (!in.holds.retiring && !in.holds.restartPending && !logLost) {
		return
	}
	restart := (in.holds.restartPending || logLost) && !in.holds.retiring
	why := "empty and held for a stop"
	if logLost && !in.holds.restartPending && !in.holds.retiring {
		why = "empty, and its log is lost"
	}
	if !in.askStopLocked(&stopRequest{dm: in.daemon, restart: restart, why: why}) {
		return
	}
	if !restart {
		d.dropInstanceLocked(in)
	}
	in.daemon = nil
	in.holds.restartPending = false
	if restart {
		if g, ok := d.cfg.Group(in.group); ok {
			in.p.Multiuser = g.Multiuser
		}
	}
}
