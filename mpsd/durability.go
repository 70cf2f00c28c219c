package mpsd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/policy"
)

// durability is what the daemon knows of its state file's health, guarded
// by Daemon.mu. While the last write failed no lease is granted: a grant
// is told to its launcher only once the state file records it (the
// lease's durable channel), and one a crash could lose would be killed as
// nobody's by the next mpsd. Grants resume by themselves once a write
// succeeds again (the store retries).
type durability struct {
	// held is the reason grants are held, naming the state directory; ""
	// while writes succeed.
	held string
	// changed is closed (and replaced) whenever held changes, so that a
	// launcher waiting for its grant to be written hears why it waits.
	changed chan struct{}
	// orphans are the leases re-adopted from lease cgroups that no state
	// file named (adoptOrphans): their launcher's attempt is taken at its
	// resume, since nothing recorded it.
	orphans map[string]bool
}

// initDurability wires the store's health into the daemon.
func (d *Daemon) initDurability() {
	d.dur.changed = make(chan struct{})
	d.dur.orphans = map[string]bool{}
	d.store.onHealth = d.onStateWrite
	d.store.snapshotAnd = d.snapshotAnd
}

// onStateWrite is told the outcome of a state write that failed, or of
// the first that succeeded after one failed.
func (d *Daemon) onStateWrite(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	held := ""
	if err != nil {
		held = fmt.Sprintf("state directory %s cannot be written (%s); no lease is granted until it can", d.layout.StateDir, errnoText(err))
	}
	if held == d.dur.held {
		return
	}
	was := d.dur.held
	d.dur.held = held
	close(d.dur.changed)
	d.dur.changed = make(chan struct{})
	if held != "" && was == "" {
		d.log.Error("grants held: the state file cannot be written", "state_dir", d.layout.StateDir, "err", err)
	} else if held == "" {
		d.log.Info("grants resume: the state file is written again", "state_dir", d.layout.StateDir)
	}
	// Resumes the queues, or tells every waiting lease the new reason.
	for _, g := range slices.Sorted(maps.Keys(d.queues)) {
		d.scheduleLocked(g)
	}
}

// errnoText is the system's words for what made err, else err itself.
func errnoText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// grantsHeldLocked reports whether grants are held: the state file
// cannot be written, an operator's shutdown runs, or mpsd is stopping. A
// grant made as mpsd stops reaches its launcher, if at all, from an mpsd
// that is going, on an instance whose recovery the stop may have cut
// short (a server it was restarting still listed as running): the next
// mpsd, finding that server gone, would revoke the new lease for it. The
// request stays queued in the state file, and the next mpsd places it.
func (d *Daemon) grantsHeldLocked() bool {
	return d.dur.held != "" || d.shuttingDown || d.stoppingLocked()
}

// stoppingLocked reports whether Run has begun to stop.
func (d *Daemon) stoppingLocked() bool {
	select {
	case <-d.stopping:
		return true
	default:
	}
	return d.ctx != nil && d.ctx.Err() != nil
}

// heldReasonLocked is why grants are held, "" when they are not.
func (d *Daemon) heldReasonLocked() string {
	switch {
	case d.shuttingDown:
		return "mpsd is shutting down"
	case d.stoppingLocked():
		return "mpsd is stopping"
	}
	return d.dur.held
}

// heldReason is heldReasonLocked for callers without Daemon.mu.
func (d *Daemon) heldReason() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dur.held
}

// awaitDurable waits, before a grant is told to its launcher, until the
// state file records it. While writes fail the launcher is told why it
// still waits, as a queued lease is; a request with no_wait, or whose
// wait_ms runs out meanwhile, gets the error it would have got in the
// queue. It reports false when the stream is to end without the grant
// (the caller releases the lease).
func (d *Daemon) awaitDurable(ctx context.Context, w http.ResponseWriter, l *lease, durable <-chan struct{}, req api.LeaseRequest, waitC <-chan time.Time) bool {
	for {
		d.mu.Lock()
		held, changed := d.dur.held, d.dur.changed
		d.mu.Unlock()
		if held != "" {
			ev := api.Event{Type: api.EventQueued, Position: 1, Group: l.group, Reason: held}
			if req.NoWait {
				ev = api.Event{Type: api.EventError, Code: api.CodeWaitTimeout, Message: fmt.Sprintf("no grant now in group %s: %s; --no-wait was given", l.group, held)}
			}
			if err := api.WriteEvent(w, ev); err != nil || req.NoWait {
				return false
			}
		}
		select {
		case <-durable:
			return true
		case <-ctx.Done():
			return false
		case <-waitC:
			wait := time.Duration(req.WaitMillis) * time.Millisecond
			why := d.heldReason()
			if why == "" {
				why = "the grant was not yet recorded in the state file"
			}
			_ = api.WriteEvent(w, api.Event{Type: api.EventError, Code: api.CodeWaitTimeout,
				Message: fmt.Sprintf("waited %s in group %s: %s; giving up as --wait says", wait, l.group, why)})
			return false
		case <-changed:
		}
	}
}

// persistIntent waits until the state file records an operator's change
// (drain, resume) made before the call, so that mpsctl's answer means it
// survives a crash of mpsd. It fails, naming the state directory, if the
// file cannot be written within the request timeout; the change stands
// and is written once the directory can be.
func (d *Daemon) persistIntent(ctx context.Context) error {
	ch := d.store.requestNow()
	t := d.clock.NewTimer(d.opts.RequestTimeout)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
	}
	why := "not written within " + d.opts.RequestTimeout.String()
	if _, err := d.store.health(); err != nil {
		why = errnoText(err)
	}
	return fmt.Errorf("applied, but not yet saved: the state directory %s cannot be written (%s); it holds until mpsd restarts, and is saved as soon as the directory can be written", d.layout.StateDir, why)
}

// applyIntentLocked puts back the operator's decisions of the saved
// state before any instance takes a lease: quarantines and drains hold
// until mpsctl resume, restarts (and crashes) of mpsd included.
func (d *Daemon) applyIntentLocked(saved savedState) {
	for _, key := range saved.Quarantined {
		if in, ok := d.instances[key]; ok {
			in.holds.quarantined = true
			in.quarantinedFor = saved.QuarantineReasons[key]
			in.log.Warn("instance still quarantined from before the restart; mpsctl resume lifts it", "quarantined_for", in.quarantinedFor)
		}
	}
	for _, key := range saved.Drained {
		if in, ok := d.instances[key]; ok {
			in.holds.drained = true
			if dr, ok := saved.Drains[key]; ok {
				in.drain = drainRecord{reason: dr.Reason, by: dr.By, at: dr.At}
			}
			in.log.Warn("instance still drained from before the restart; mpsctl resume lifts it",
				"reason", in.drain.reason, "drained_by", in.drain.by, "drained_at", in.drain.at)
		}
	}
	now := d.clock.Now()
	for key, bars := range saved.Barred {
		in, ok := d.instances[key]
		if !ok {
			continue
		}
		for _, b := range bars {
			if !now.Before(b.Until) {
				continue // it lapsed while mpsd was away
			}
			if in.barred == nil {
				in.barred = map[uint32]uidBar{}
			}
			in.barred[b.UID] = uidBar{until: b.Until, reason: b.Reason}
			in.log.Warn("uid still barred from the instance from before the restart; mpsctl resume lifts it", "uid", b.UID, "until", b.Until, "reason", b.Reason)
			d.reopenAfterBar(in, b.Until)
		}
	}
}

// leftoverCgroups sorts the lease cgroups listed under this mpsd's id
// that no saved lease owns: an empty one is a leftover to remove; one
// with processes (or whose processes cannot be listed) is a workload that
// a state file failed to record (unwritable, truncated, lost), to
// re-adopt and keep for its launcher. None is killed at start.
func leftoverCgroups(listed []cgroup.LeaseID, owned, populated map[cgroup.LeaseID]bool) (remove, adopt []cgroup.LeaseID) {
	for _, id := range listed {
		switch {
		case owned[id]:
		case populated[id]:
			adopt = append(adopt, id)
		default:
			remove = append(remove, id)
		}
	}
	return remove, adopt
}

// adoptLeftovers removes the empty lease cgroups under this mpsd's id
// that no saved lease owns and re-adopts the populated ones.
func (d *Daemon) adoptLeftovers(owned map[cgroup.LeaseID]bool) {
	ids, err := d.cg.List()
	if err != nil {
		d.log.Error("list lease cgroups", "err", err)
	}
	open := map[cgroup.LeaseID]cgroup.Lease{}
	pids := map[cgroup.LeaseID][]int{}
	populated := map[cgroup.LeaseID]bool{}
	for _, id := range ids {
		if owned[id] {
			continue
		}
		cg, err := d.cg.Open(id)
		if err != nil {
			continue
		}
		open[id] = cg
		p, err := cg.Pids()
		pids[id] = p
		populated[id] = err != nil || len(p) > 0
	}
	remove, adopt := leftoverCgroups(ids, owned, populated)
	for _, id := range remove {
		cg := open[id]
		if cg == nil {
			continue
		}
		path := cg.Path()
		if err := d.killLease(&lease{id: id.Lease, cg: cg}); err != nil {
			d.log.Error("remove empty leftover lease cgroup", "cgroup", path, "err", err)
		} else {
			d.log.Info("removed empty leftover lease cgroup", "cgroup", path)
		}
	}
	for _, id := range adopt {
		if cg := open[id]; cg != nil {
			d.adoptOrphan(id, cg, pids[id])
		}
	}
}

// orphanHint is what the processes of a lease cgroup that no state file
// names say of their lease. The uid is the kernel's (the oldest process's
// real uid); the rest comes from the command's environment as mps-launch
// set it, which the process may have rewritten: hints, used only to
// account the lease on an instance of its group (clamped to the group's
// limits) and to let its launcher resume it, never to act on anything.
type orphanHint struct {
	uid     uint32
	haveUID bool
	pipeDir string
	sm      int
	mem     int64
	attempt int
	// procs: the processes sm was divided among (MPSD_PROCS); sm is then
	// the whole lease's, each process's part times procs.
	procs int
}

// readOrphanHint reads the hint of a lease's processes, the oldest first.
func readOrphanHint(proc, leaseID string, pids []int) orphanHint {
	type aged struct {
		pid   int
		start uint64
	}
	var ps []aged
	for _, pid := range pids {
		if st, err := procStartTime(proc, pid); err == nil {
			ps = append(ps, aged{pid, st})
		}
	}
	slices.SortFunc(ps, func(a, b aged) int {
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return cmp.Compare(a.pid, b.pid)
	})
	var h orphanHint
	for _, p := range ps {
		if !h.haveUID {
			if st, err := readProcStatus(proc, p.pid); err == nil {
				h.uid, h.haveUID = st.uid, true
			}
		}
		if h.pipeDir == "" {
			if b, err := readEnviron(proc, p.pid); err == nil {
				h.fromEnv(leaseID, b)
			}
		}
	}
	return h
}

// maxEnviron bounds what is read of a process's environment.
const maxEnviron = 1 << 20

func readEnviron(proc string, pid int) ([]byte, error) {
	f, err := os.Open(filepath.Join(proc, strconv.Itoa(pid), "environ"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return io.ReadAll(io.LimitReader(f, maxEnviron))
}

// fromEnv takes the hint's lease values from an environ block, if it is
// that lease's.
func (h *orphanHint) fromEnv(leaseID string, environ []byte) {
	env := map[string]string{}
	for kv := range strings.SplitSeq(string(environ), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	if env[api.EnvLeaseID] != leaseID {
		return
	}
	h.pipeDir = env[api.EnvPipeDirectory]
	h.sm, _ = strconv.Atoi(env[api.EnvThreadPercentage])
	h.attempt, _ = strconv.Atoi(env[api.EnvAttempt])
	if n, err := strconv.Atoi(env[api.EnvProcs]); err == nil && n > 1 && n <= api.MaxProcs && h.sm >= 1 {
		// Each process had sm/procs, rounded down: the lease had at
		// least this much (charged up to procs-1 percent short).
		h.procs, h.sm = n, h.sm*n
	}
	// "0=1024M,1=1024M": the limit per GPU, the same on each.
	if first, _, _ := strings.Cut(env[api.EnvPinnedMemLimit], ","); first != "" {
		if _, v, ok := strings.Cut(first, "="); ok {
			if mib, err := strconv.ParseInt(strings.TrimSuffix(v, "M"), 10, 64); err == nil && mib >= 0 && mib < 1<<43 {
				h.mem = mib << 20
			}
		}
	}
}

// adoptOrphan re-adopts the workload of a lease cgroup under this mpsd's
// id that no state file names: it is accounted on an instance of its
// group (the one its environment names, else the group's first) and kept
// for its launcher as any re-adopted lease: a launcher that resumes it
// runs on, one that does not come back within the grace has it released.
func (d *Daemon) adoptOrphan(id cgroup.LeaseID, cg cgroup.Lease, pids []int) {
	h := readOrphanHint(d.proc, id.Lease, pids)
	d.mu.Lock()
	defer d.mu.Unlock()
	g, known := d.cfg.Group(id.Group)
	insts := d.groupInstancesLocked(id.Group)
	if !known || len(insts) == 0 || api.ValidLeaseID(id.Lease) != nil {
		d.log.Warn("lease cgroup under this mpsd's id is in no state file and its group has no instance; left alone",
			"cgroup", cg.Path(), "instance_id", d.instanceID)
		return
	}
	in := insts[0]
	for _, x := range insts {
		if h.pipeDir != "" && x.pipeDir == h.pipeDir {
			in = x
		}
	}
	sm, mem := in.maxSM, in.maxMem
	if h.sm >= 1 && h.sm <= in.maxSM {
		sm = h.sm
	}
	if h.mem > 0 && h.mem <= in.maxMem {
		mem = h.mem
	}
	procs := 1
	if h.procs > 1 && h.procs <= sm && h.procs <= in.p.Budget.Clients {
		procs = h.procs
	}
	uid := uint32(0) // nobody's but root's, when no process says
	if h.haveUID {
		uid = h.uid
	}
	attempt := max(1, h.attempt)
	d.seq++
	now := d.clock.Now()
	l := &lease{
		id: id.Lease, group: id.Group, uid: uid, requeue: g.RequeueAttempts, attempt: attempt, ranAttempt: attempt,
		req:     policy.Request{Group: id.Group, UID: uid, SM: sm, Mem: mem, GPUs: len(in.gpus), Procs: procs, Priority: g.Priority, Seq: d.seq},
		created: now, queuedAt: now, awaySince: now, box: newMailbox(d.log), log: d.log,
		// Taken up running, as a saved running lease is: its processes run.
		state: leaseRunning,
	}
	l.cg = cg
	in.p.Assign(&l.req)
	in.leases[l.id] = l
	l.inst = in
	d.leases[l.id] = l
	d.dur.orphans[l.id] = true
	l.grace = d.clock.AfterFunc(d.opts.ReconnectGrace, func() { d.spawn(func() { d.graceOver(l) }) })
	// Recorded before its launcher is told of it.
	l.durable = d.store.request()
	in.log.Warn("lease cgroup under this mpsd's id is in no state file (unwritable, truncated or lost); its workload is re-adopted and kept for its launcher",
		"lease", l.id, "cgroup", cg.Path(), "uid", uid, "sm", sm, "mem", mem, "procs", procs, "processes", len(pids), "grace", d.opts.ReconnectGrace)
}

// resumeOrphanLocked takes a re-adopted orphan's attempt from its
// launcher, the one record of it left.
func (d *Daemon) resumeOrphanLocked(l *lease, req api.LeaseRequest) {
	if !d.dur.orphans[l.id] {
		return
	}
	delete(d.dur.orphans, l.id)
	if req.Attempt >= 1 {
		l.attempt, l.ranAttempt = req.Attempt, req.Attempt
		l.cgMu.Lock()
		l.cgAttempt = req.Attempt
		l.cgMu.Unlock()
	}
}

// noWaitTextLocked is the refusal of a --no-wait request not placed at
// once.
func (d *Daemon) noWaitTextLocked(group string, ahead int) string {
	if held := d.dur.held; held != "" {
		return fmt.Sprintf("no grant now in group %s: %s; --no-wait was given", group, held)
	}
	return fmt.Sprintf("no room now in group %s (%d queued ahead) and --no-wait was given", group, ahead)
}

// State file metrics.
var (
	descStateWritable = prometheus.NewDesc("mpsd_state_writable", "1 while mpsd's state file can be written (its last write succeeded); 0 while writes fail, and no lease is granted.", nil, nil)
	descStateFailures = prometheus.NewDesc("mpsd_state_write_failures_total", "Writes of mpsd's state file that failed (each is retried).", nil, nil)
)

// stateCollector exports the state file's health.
type stateCollector Daemon

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descStateWritable
	ch <- descStateFailures
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	failures, err := (*Daemon)(c).store.health()
	writable := 1.0
	if err != nil {
		writable = 0
	}
	ch <- prometheus.MustNewConstMetric(descStateWritable, prometheus.GaugeValue, writable)
	ch <- prometheus.MustNewConstMetric(descStateFailures, prometheus.CounterValue, float64(failures))
}
