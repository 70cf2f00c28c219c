package mpsd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/internal/clock"
	"github.com/mpsd/mpsd/internal/gpusel"
	"github.com/mpsd/mpsd/internal/mpsenv"
	"github.com/mpsd/mpsd/policy"
)

// lease is one client's claim, from its request to its end. Fields are
// guarded by Daemon.mu except the mailbox, which has its own lock, and
// cg and pids, guarded by cgMu.
type lease struct {
	id      string
	group   string
	uid     uint32
	req     policy.Request
	command []string
	jobID   string
	// willAttach: the client said it attaches a process once granted
	// (api.LeaseRequest.WillAttach); the grant then makes the cgroup.
	willAttach bool
	log        *slog.Logger
	// state is where the lease is in its life (leasestate.go); it
	// changes only through step.
	state leaseState
	// revokedFor is why the lease was last revoked, for a launcher that
	// resumes after it happened.
	revokedFor string
	// ranAttempt is the last attempt whose command was attached: only
	// then does an empty cgroup mean that the command has ended.
	ranAttempt int
	// requeue is how many times a revoked lease may be requeued for
	// faults charged to it; spared counts the requeues that were not (a
	// victim of another lease's fault, an operator's requeue), so it has
	// requeue+spared requeues in all. spareNext: the revocation under way
	// is not charged to it (revoke sets it, requeue takes it).
	requeue   int
	spared    int
	spareNext bool
	attempt   int
	created   time.Time
	queuedAt  time.Time
	// grantedAt: when the attempt running now was granted (status's run
	// time); zero while queued.
	grantedAt time.Time
	// user is the uid's name for the log ("" when unknown).
	user string
	// endWith, set by a revocation that ends the lease instead of
	// requeueing it (mpsctl shutdown), is the error its launcher is sent
	// once its processes are gone.
	endWith *api.Error

	inst       *instance // set while running, revoking or releasing
	position   int       // last position sent while queued
	waitReason string    // last wait reason sent while queued
	bound      bool      // a launcher's stream holds the lease
	// launcherPID: the process whose stream holds the lease now (its
	// peer credentials' pid when it connected); 0 while none does.
	launcherPID int
	// abandoned: the launcher left while the lease was being revoked; the
	// revocation drops it instead of requeueing it.
	abandoned bool
	// killStuck: its processes would not die; it keeps its capacity while
	// a goroutine of the daemon retries the kill (see retryKillLocked) and only
	// then finishes the release or requeue.
	killStuck bool
	// memOverSince: since when its processes have held more device memory
	// on a GPU than its mem (reconcile.go); zero while they do not.
	memOverSince time.Time
	// memUsed: the most device memory its processes held on one of its
	// GPUs at the last reading; nil before one.
	memUsed *uint64
	// clients: how many MPS clients of its processes the last reading saw
	// (reconcile.go); nil before one. More than req.Procs: it runs more
	// workers than it declared, and clientsOver is set (logged once).
	clients     *int
	clientsOver bool
	// For the history (history.go): memPeak, the most of its memUsed
	// readings (nil before one); waited, its time queued before its
	// grants; lastGPUs, the GPUs of its last run once it has left them;
	// exitStatus and exitSignal, how its command ended as its launcher
	// told in its release (nil: unknown); recorded, closed once its end
	// is in the history file (nil until it ends).
	memPeak    *uint64
	waited     time.Duration
	lastGPUs   []int
	exitStatus *int
	exitSignal string
	recorded   <-chan struct{}
	// durable is closed once the state file records the grant, so a
	// launcher is never told of a lease a crash could lose.
	durable <-chan struct{}
	grace   clock.Timer // re-adopted and waiting for its launcher
	// awaySince: when the launcher was last known gone (set while grace
	// runs), kept across restarts so the grace is not renewed by each.
	awaySince time.Time

	box mailbox

	// cgMu guards cg and pids, and is never held across a blocking call
	// on the cgroup's processes (a kill can take 30 s): killLease takes
	// the handle under it and kills outside it. An attach holds it for
	// quick work only: the cgroup's creation, the move, and the check of
	// what it moved through /proc, with the move back of a process that
	// took a reused pid (so no kill runs in between).
	cgMu sync.Mutex
	cg   cgroup.Lease
	// pids: the pids attached, and after each successful look at the
	// cgroup, what it held (what Status shows while a kill runs); pidsAt
	// when it was last read or added to, on the wall clock (it dates real
	// processes' exits, which no fake clock moves: culprithint.go).
	pids   []int
	pidsAt time.Time
	// left: pids a reading of the cgroup listed and the next one no
	// longer did, each with the time of the last reading that listed it,
	// kept for culpritSeenAge (at most maxLeftPids): a process that left
	// as it exited may be named as a fault's culprit just after.
	left map[int]time.Time
	// killing: a kill of cg is under way (without cgMu). closed: the
	// lease's end (revocation or release) has begun killing it; no process
	// joins it until its next grant. attach refuses both.
	killing bool
	closed  bool
	// cgAttempt is the attempt last granted (set with closed cleared): an
	// attach for another is refused.
	cgAttempt int
}

// running: placed on an instance (running, revoking or releasing).
func (l *lease) running() bool { return l.inst != nil }

// mailbox hands events from the admission core (under Daemon.mu) to the
// lease's stream handler without blocking the core: queued positions
// coalesce, nothing else is dropped.
type mailbox struct {
	mu  sync.Mutex
	evs []api.Event
	sig chan struct{}
	// revoked: a revoked event was sent since the last granted one; a
	// requeued event without it breaks the protocol (api/doc.go), which
	// push logs and reports as an illegal transition.
	revoked bool
	log     *slog.Logger
}

func newMailbox(log *slog.Logger) mailbox { return mailbox{sig: make(chan struct{}, 1), log: log} }

func (m *mailbox) push(ev api.Event) {
	m.mu.Lock()
	switch ev.Type {
	case api.EventGranted:
		m.revoked = false
	case api.EventRevoked:
		m.revoked = true
	case api.EventRequeued:
		if !m.revoked {
			err := fmt.Errorf("%w: requeued (attempt %d) sent without a revoked event before it", errIllegalTransition, ev.Attempt)
			if m.log != nil {
				m.log.Error("lease event out of protocol order (a bug of mpsd)", "err", err)
			}
			illegalTransition(err)
		}
	}
	if n := len(m.evs); n > 0 && ev.Type == api.EventQueued && m.evs[n-1].Type == api.EventQueued {
		m.evs[n-1] = ev
	} else {
		m.evs = append(m.evs, ev)
	}
	m.mu.Unlock()
	select {
	case m.sig <- struct{}{}:
	default:
	}
}

func (m *mailbox) take() []api.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	evs := m.evs
	m.evs = nil
	return evs
}

// reset drops what was not sent, for a launcher that resumes: it is told
// where the lease stands now. What it saw before is not known, so a
// requeue must again follow a revoked event sent from here on.
func (m *mailbox) reset() {
	m.mu.Lock()
	m.evs, m.revoked = nil, false
	m.mu.Unlock()
}

func newLeaseID(group string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return group + "-" + hex.EncodeToString(b[:])
}

// apiLeaseLocked is the granted lease as its launcher sees it, with the
// environment of docs/architecture.md#environment-of-a-lease. The MPS
// variables come from mpsenv, built from the GPUs the client sees (the
// instance's, by UUID, in its server's order), so their limits name only
// those devices; its thread percentage is the lease's share divided among
// its declared processes (mpsenv.WorkerPercentage). Should mpsenv refuse
// them (a GPU without a UUID, a share too small to divide), the
// lease carries none: mps-launch and the device plugin refuse a lease
// without them rather than run its command with no MPS limits.
func (l *lease) apiLeaseLocked() *api.Lease {
	in := l.inst
	procs := l.req.Clients()
	al := &api.Lease{ID: l.id, Group: l.group, SM: l.req.SM, MemBytes: l.req.Mem, Attempt: l.attempt, Procs: procs}
	for _, g := range in.gpus {
		al.GPUIndexes = append(al.GPUIndexes, g.Index)
		al.GPUUUIDs = append(al.GPUUUIDs, g.UUID)
	}
	al.Env = map[string]string{
		api.EnvLeaseID: l.id,
		api.EnvGroup:   l.group,
		api.EnvAttempt: strconv.Itoa(l.attempt),
		api.EnvProcs:   strconv.Itoa(procs),
	}
	dev, err := mpsenv.NewDevices(al.GPUUUIDs)
	var c mpsenv.Client
	var pct int
	if err == nil {
		// Each of the lease's processes gets its part of the share: MPS
		// limits every client process, not the lease.
		pct, err = mpsenv.WorkerPercentage(l.req.SM, procs)
	}
	if err == nil {
		// Whole MiB: what policy charged (mem is rounded down to MiB) is
		// exactly what MPS enforces.
		c, err = mpsenv.NewClient(in.pipeDir, dev, pct, l.req.Mem)
	}
	if err != nil {
		l.log.Error("no MPS environment can be made for the lease; its launcher will refuse it", "lease", l.id, "group", l.group, "err", err)
		return al
	}
	maps.Copy(al.Env, c.Env())
	if p, ok := clientPriority(in.driver, l.req.Priority); ok {
		al.Env[api.EnvClientPriority] = p
	}
	return al
}

// refusal is a request mpsd turns down before queueing it.
type refusal struct {
	status int
	code   api.ErrorCode
	msg    string
}

func (r *refusal) Error() string { return r.msg }

// admit checks a new request against the config in force and queues it,
// then runs the group's queue, all under one hold of Daemon.mu so the
// decision and the queue never disagree. With NoWait a lease that is not
// placed at once is withdrawn: it is returned with the refusal, whose
// answer waits for its record in the history (lease.recorded).
func (d *Daemon) admit(c policy.Credentials, req api.LeaseRequest) (*lease, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shuttingDown {
		return nil, &refusal{503, api.CodeUnavailable, "mpsd is shutting down (mpsctl shutdown)"}
	}
	cfg := d.cfg
	name, err := cfg.Access.Choose(c, req.Group)
	if err != nil {
		msg, status := strings.TrimPrefix(err.Error(), "policy: "), 403
		switch {
		case errors.Is(err, policy.ErrUnknownGroup):
			msg = fmt.Sprintf("unknown group %q (groups you may use: %s)", req.Group, orNone(cfg.Access.Groups(c)))
		case errors.Is(err, policy.ErrGroupNeeded):
			status = 422 // allowed, once the request names its group
		}
		return nil, &refusal{status, api.CodeRefused, msg}
	}
	g, _ := cfg.Group(name)
	r, err := g.NewRequest(c.UID, policy.Demand{SM: req.SM, Mem: req.MemBytes, GPUs: req.GPUs, Procs: req.Procs})
	if err != nil {
		// Beyond what the group lets one client have: no amount of waiting
		// helps, so say so in the words the user looks for.
		return nil, &refusal{422, api.CodeRefused, fmt.Sprintf("request can never fit in group %s: %s", name, strings.TrimPrefix(err.Error(), "policy: invalid request: "))}
	}
	if len(req.GPUSelect) > 0 {
		if r.Only, err = d.resolveGPUSelect(req.GPUSelect); err != nil {
			return nil, &refusal{422, api.CodeRefused, err.Error()}
		}
	}
	insts := d.groupInstancesLocked(name)
	if r.Only != nil {
		sets := make([][]int, len(insts))
		for i, in := range insts {
			sets[i] = in.p.GPUs
		}
		if !r.WithinAny(sets) {
			// Said in the group's GPUs, not its budgets: no budget is why.
			where := policy.DescribeSets(sets)
			if where == "" {
				where = "no GPU"
			}
			return nil, &refusal{422, api.CodeRefused, fmt.Sprintf("--gpu %s: group %s has no instance on these GPUs; its instances are on %s",
				strings.Join(req.GPUSelect, ","), name, where)}
		}
	}
	if len(insts) > 0 && all(insts, func(in *instance) bool { return in.holds.retiring }) {
		return nil, &refusal{503, api.CodeUnavailable, fmt.Sprintf("group %s is being removed from the config", name)}
	}
	// Whether it could ever fit is judged against the group's instances
	// as if they were empty and ready.
	probe := make([]policy.Instance, len(insts))
	now := d.clock.Now()
	for i, in := range insts {
		probe[i] = in.policyViewAt(now)
		probe[i].State = policy.InstanceReady
		probe[i].Alloc = policy.Usage{}
		probe[i].ServerUp = false
	}
	if _, err := policy.Place(&r, probe, cfg.Placement); errors.Is(err, policy.ErrNeverFits) {
		where := ""
		if r.Only != nil {
			where = fmt.Sprintf(" within GPU(s) %s", strings.Join(req.GPUSelect, ","))
		}
		return nil, &refusal{422, api.CodeRefused, fmt.Sprintf("group %s: sm %d%%, mem %s on %d GPU(s)%s can never fit: %s", name, r.SM, fmtSize(r.Mem), r.GPUs, where, budgetText(g))}
	}
	requeue := g.RequeueAttempts
	if req.RequeueAttempts != nil {
		requeue = min(requeue, *req.RequeueAttempts)
	}
	d.seq++
	r.Seq = d.seq
	newID := newLeaseID
	if d.leaseID != nil {
		newID = d.leaseID
	}
	l := &lease{
		id: newID(name), group: name, uid: c.UID, req: r, command: keptCommand(req.Command), jobID: req.JobID, willAttach: req.WillAttach,
		requeue: requeue, attempt: 1, created: now, queuedAt: now, bound: true, box: newMailbox(d.log), log: d.log,
		user: d.users.cached(c.UID),
	}
	d.leases[l.id] = l
	d.queues[name] = append(d.queues[name], l)
	d.scheduleLocked(name)
	if !l.running() && req.NoWait {
		d.dequeueLocked(l, "no room and --no-wait")
		ahead := l.position - 1
		// l too: its refusal is told once the history has it.
		return l, &refusal{503, api.CodeWaitTimeout, d.noWaitTextLocked(name, ahead)}
	}
	if !l.running() {
		// Saved (without waiting for it), so that its launcher resumes
		// it in its place if mpsd restarts meanwhile.
		d.store.request()
	}
	return l, nil
}

// resolveGPUSelect turns a request's GPU selectors into NVML indexes of
// this host, naming every selector that matches no GPU.
func (d *Daemon) resolveGPUSelect(sel []string) ([]int, error) {
	sels, err := gpusel.ParseList(sel)
	if err != nil {
		return nil, fmt.Errorf("gpu_select: %s", oneLine(err))
	}
	host := d.host.GPUs()
	inv := make([]gpusel.GPU, len(host))
	for i, g := range host {
		inv[i] = gpusel.GPU{Index: g.Index, UUID: g.UUID}
	}
	pos, err := gpusel.Resolve(inv, sels)
	if err != nil {
		// The selector's reason says how many GPUs there are where that
		// is the point (an unknown index).
		return nil, fmt.Errorf("gpu_select: %s", oneLine(err))
	}
	only := make([]int, len(pos))
	for i, p := range pos {
		only[i] = inv[p].Index
	}
	return only, nil
}

// oneLine is a selector error as one line of an API refusal.
func oneLine(err error) string {
	return strings.ReplaceAll(strings.ReplaceAll(err.Error(), "gpusel: ", ""), "\n", "; ")
}

func orNone(groups []string) string {
	if len(groups) == 0 {
		return "none"
	}
	return strings.Join(groups, ", ")
}

func all[T any](s []T, f func(T) bool) bool {
	for _, x := range s {
		if !f(x) {
			return false
		}
	}
	return true
}

func budgetText(g *policy.Group) string {
	return fmt.Sprintf("each instance has %d GPU(s), sm budget %d%%, memory budget %s per GPU, max_sm %d, max_mem %s",
		g.GPUsPerInstance, g.SMPercent, fmtSize(g.Memory), g.MaxSM, fmtSize(g.MaxMem))
}

// groupInstancesLocked returns a group's instances in key order, so
// placement ties break the same way every time. The slice is shared:
// callers read it and never change it.
func (d *Daemon) groupInstancesLocked(group string) []*instance {
	if d.byGroup == nil {
		// Built once per change of the instances, not per grant: every
		// admission, placement and queue position asks for it.
		d.byGroup = map[string][]*instance{}
		for _, in := range d.instanceList() {
			d.byGroup[in.group] = append(d.byGroup[in.group], in)
		}
	}
	return d.byGroup[group]
}

// scheduleLocked places the head of a group's queue while it fits, then
// tells every waiting lease its position.
func (d *Daemon) scheduleLocked(group string) {
	q := d.queues[group]
	if len(q) > 0 && !d.grantsHeldLocked() {
		insts := d.groupInstancesLocked(group)
		pis := make([]policy.Instance, len(insts))
		reqs := make([]policy.Request, 0, len(q))
		now := d.clock.Now()
		for len(q) > 0 {
			for i, in := range insts {
				pis[i] = in.policyViewAt(now)
				pis[i].UserCap = d.cfg.Limits.UserClients(pis[i].Budget.Clients)
			}
			reqs = reqs[:0]
			for _, l := range q {
				reqs = append(reqs, l.req)
			}
			qi, ii, err := policy.Next(reqs, pis, d.cfg.Placement)
			if errors.Is(err, policy.ErrNeverFits) {
				// A reload shrank the group under a waiting request.
				l := q[qi]
				q = slices.Delete(q, qi, qi+1)
				d.queues[group] = q
				d.failLocked(l, api.EndedRefused, api.CodeRefused, fmt.Sprintf("group %s changed and the request (sm %d%%, mem %s) can no longer fit", group, l.req.SM, fmtSize(l.req.Mem)))
				continue
			}
			if err != nil {
				break
			}
			l := q[qi]
			q = slices.Delete(q, qi, qi+1)
			d.queues[group] = q
			d.grantLocked(l, insts[ii])
		}
	}
	d.positionsLocked(group)
}

func (d *Daemon) positionsLocked(group string) {
	q := slices.Clone(d.queues[group])
	if len(q) == 0 {
		return
	}
	slices.SortStableFunc(q, func(a, b *lease) int { return policy.QueueOrder(a.req, b.req) })
	base := d.waitReasonLocked(group)
	notes := d.barNotesLocked(group, d.clock.Now())
	held := d.heldInstancesLocked(group)
	var insts []*instance // fetched for the first uid with a cap
	for i, l := range q {
		reason := base
		if l.uid != 0 {
			if insts == nil {
				insts = d.groupInstancesLocked(group)
			}
			if note := d.userCapNoteLocked(insts, l); note != "" {
				reason = note
			}
		}
		if note := notes[l.uid]; note != "" {
			reason += "; " + note
		}
		for _, h := range held {
			if h.uid != l.uid {
				reason += fmt.Sprintf("; GPU %s serves another user, whose clients of no lease hold its MPS server (MPS serves one user at a time)", h.gpus)
			}
		}
		if l.position != i+1 || l.waitReason != reason {
			l.position, l.waitReason = i+1, reason
			l.box.push(api.Event{Type: api.EventQueued, Position: l.position, Group: group, Reason: reason, LeaseID: l.id})
		}
	}
}

// heldInstance is a ready instance of a daemon without multiuser whose
// server clients of no lease hold for their uid: MPS makes every other
// uid wait there, so placement passes it over for them.
type heldInstance struct {
	gpus string
	uid  uint32
}

// heldInstancesLocked lists group's held instances, in a stable order.
func (d *Daemon) heldInstancesLocked(group string) []heldInstance {
	var out []heldInstance
	for _, in := range d.groupInstancesLocked(group) {
		if in.p.Multiuser || in.placementState() != policy.InstanceReady || !in.mps.held() {
			continue
		}
		if _, uid, held, _ := in.mps.serving(in.placedUID()); held {
			out = append(out, heldInstance{gpus: gpuList(in), uid: uid})
		}
	}
	return out
}

// userCapNoteLocked says why l waits when its uid holds its
// limits.running_per_user on every instance of insts that could ever hold
// it (policy.Place passes those over); "" when it does not.
func (d *Daemon) userCapNoteLocked(insts []*instance, l *lease) string {
	held, capped := 0, 0
	for _, in := range insts {
		p := &in.p
		if len(p.GPUs) < l.req.GPUs || p.Budget.Clients < l.req.Clients() {
			continue
		}
		c := *p
		c.UserCap = d.cfg.Limits.UserClients(p.Budget.Clients)
		if !c.OverUserCap(&l.req) {
			return ""
		}
		held, capped = max(held, c.UserClients(l.uid)), c.UserCap
	}
	if capped == 0 {
		return ""
	}
	return fmt.Sprintf("waiting for a lease of uid %d to end: its running leases hold %d clients of each instance, and %d more would pass limits.running_per_user (%d)",
		l.uid, held, l.req.Clients(), capped)
}

// waitReasonLocked says in a few words what a group's queue waits for:
// room, or instances that are closed and why, or the state directory
// (durability.go).
func (d *Daemon) waitReasonLocked(group string) string {
	if held := d.heldReasonLocked(); held != "" {
		return held
	}
	var closed []string
	for _, in := range d.groupInstancesLocked(group) {
		if st := in.placementState(); st != policy.InstanceReady {
			why := fmt.Sprintf("GPU %s %s", gpuList(in), in.shownState())
			// Closed until an operator reopens it: a wait nothing else
			// ends, which a batch log should say (with the drain's
			// reason, which status shows everyone).
			switch {
			case in.holds.quarantined:
				why += " until an admin's mpsctl resume"
			case in.holds.drained:
				why += " (" + in.drain.reason + ") until an admin's mpsctl resume"
			}
			closed = append(closed, why)
		} else if in.mps.faulted() {
			if f := in.mps.inFault(); len(f) > 0 {
				closed = append(closed, fmt.Sprintf("GPU %s: MPS server %d in FAULT until its clients of no lease have gone", gpuList(in), f[0]))
			}
		}
	}
	if len(closed) == 0 {
		return "waiting for room"
	}
	return "waiting for room; " + strings.Join(closed, ", ")
}

func gpuList(in *instance) string {
	s := make([]string, len(in.gpus))
	for i, g := range in.gpus {
		s[i] = strconv.Itoa(g.Index)
	}
	return strings.Join(s, ",")
}

func (d *Daemon) grantLocked(l *lease, in *instance) {
	eff, err := l.step(leaseGrant, "placed")
	if err != nil {
		return
	}
	in.p.Assign(&l.req)
	in.leases[l.id] = l
	l.inst = in
	l.grantedAt = d.clock.Now()
	l.waited += l.grantedAt.Sub(l.queuedAt)
	l.position, l.waitReason = 0, ""
	if eff&effPersist != 0 {
		l.durable = d.store.request()
	}
	if set := d.capsForGrantLocked(in, l); set != nil {
		// The grant is told once its server's caps (or the daemon's
		// defaults) allow l what it was granted and no more, and once the
		// state file records it.
		written, ready := l.durable, make(chan struct{})
		l.durable = ready
		if !d.spawn(func() {
			defer close(ready)
			set()
			if written != nil {
				select {
				case <-written:
				case <-d.ctx.Done():
				}
			}
		}) {
			l.durable = written // shutting down: the caps stay as they are
		}
	}
	l.cgMu.Lock()
	l.closed = false // its new attempt's command may join
	l.cgAttempt = l.attempt
	l.cgMu.Unlock()
	if eff&effTellGranted != 0 {
		l.box.push(api.Event{Type: api.EventGranted, Lease: l.apiLeaseLocked()})
		if l.willAttach {
			d.spawn(func() { d.prepareCgroup(l) })
		}
	}
	d.observeGrantLocked(l)
	d.mu.logAfter(in.log, "lease granted", l.logAttrs("attempt", l.attempt, "sm", l.req.SM, "mem", l.req.Mem, "waited", l.grantedAt.Sub(l.queuedAt))...)
}

// dequeueLocked withdraws a queued lease.
func (d *Daemon) dequeueLocked(l *lease, why string) { d.dequeueAsLocked(l, api.EndedWithdrawn, why) }

// dequeueAsLocked withdraws a queued lease that ended how (the history's
// api.Ended* value: withdrawn, cancelled).
func (d *Daemon) dequeueAsLocked(l *lease, how, why string) {
	if _, err := l.step(leaseWithdraw, why); err != nil {
		return
	}
	q := d.queues[l.group]
	if i := slices.Index(q, l); i >= 0 {
		d.queues[l.group] = slices.Delete(q, i, i+1)
	}
	delete(d.leases, l.id)
	d.recordEnded(l, how, why)
	d.positionsLocked(l.group)
}

// failLocked withdraws a queued lease (the caller has taken it off the
// queue) with an error event; how is how it ended, for the history.
func (d *Daemon) failLocked(l *lease, how string, code api.ErrorCode, msg string) {
	if _, err := l.step(leaseWithdraw, msg); err != nil {
		return
	}
	delete(d.leases, l.id)
	d.recordEnded(l, how, msg)
	l.box.push(api.Event{Type: api.EventError, Code: code, Message: msg})
}

// timeoutLocked withdraws a queued lease whose wait ran out; false when it
// was placed meanwhile.
func (d *Daemon) timeoutLocked(l *lease, wait time.Duration) bool {
	if l.running() || d.leases[l.id] != l {
		return false
	}
	pos := l.position
	d.dequeueLocked(l, "wait ran out")
	d.store.request() // it may be saved (admit)
	l.box.push(api.Event{Type: api.EventError, Code: api.CodeWaitTimeout,
		Message: fmt.Sprintf("waited %s in the queue of group %s (position %d); giving up as --wait says", wait, l.group, pos)})
	return true
}

// revocationComingLocked reports whether a revocation has taken run
// attempt of l (0: whichever runs): l is past that attempt (it was revoked
// and requeued), being revoked, or running on an instance whose pending
// faults (or the faults its recovery handles now) name it, so that a
// revocation is about to take it. d.mu is held.
func (l *lease) revocationComingLocked(attempt int) bool {
	switch {
	case attempt != 0 && l.attempt > attempt:
		return true
	case l.state == leaseRevoking:
		return true
	case l.state != leaseRunning || l.inst == nil:
		return false
	}
	_, pending := faultVictim(l.inst.pending, l.id)
	_, handling := faultVictim(l.inst.handling, l.id)
	return pending || handling
}

// claimNamingLocked is the decided channel of a fault record on l's
// instance that waits for its Xid, or is being acted on, and would take l,
// running, if confirmed; nil if there is none. d.mu is held.
func (l *lease) claimNamingLocked() <-chan struct{} {
	if l.state != leaseRunning || l.inst == nil {
		return nil
	}
	for _, c := range slices.Concat(l.inst.claims, l.inst.deciding) {
		if _, ok := faultVictim([]fault{c.f}, l.id); ok {
			return c.decided
		}
	}
	return nil
}

// release ends a lease whose launcher is gone: a queued one simply leaves
// the queue; a running one has its processes killed (they may outlive the
// launcher) before its capacity is handed back, so the next client never
// shares the GPU with a leftover.
func (d *Daemon) release(l *lease, why string) { d.releaseUnless(l, why, nil) }

// releaseIf is release; with unboundOnly it does nothing to a lease a
// launcher holds (one that resumed it after mpsd restarted).
func (d *Daemon) releaseIf(l *lease, why string, unboundOnly bool) {
	d.releaseUnless(l, why, func(l *lease) bool { return unboundOnly && l.bound })
}

// releaseUnless is release, unless keep, asked under the same lock as the
// release's first step, says to leave the lease as it is.
func (d *Daemon) releaseUnless(l *lease, why string, keep func(*lease) bool) {
	d.mu.Lock()
	if d.leases[l.id] != l || (keep != nil && keep(l)) {
		d.mu.Unlock()
		return
	}
	switch l.state {
	case leaseRevoking, leaseReleasing:
		l.abandoned = true
		d.mu.Unlock()
		return
	case leaseQueued:
		d.dequeueLocked(l, why)
		d.store.request() // it may be saved (admit)
		d.mu.Unlock()
		return
	}
	if _, err := l.step(leaseRelease, why); err != nil {
		d.mu.Unlock()
		return
	}
	if l.grace != nil {
		l.grace.Stop()
	}
	d.mu.Unlock()

	if err := d.killLease(l); err != nil {
		// The lease stays accounted: capacity held by processes that would
		// not die must not be handed out again. The kill is retried and
		// the release finished once it succeeds.
		d.killFailed(l, "release", err)
		d.mu.Lock()
		d.retryKillLocked(l, func() { d.finishRelease(l, why) })
		d.mu.Unlock()
		return
	}
	d.finishRelease(l, why)
}

// finishRelease hands back the capacity of a released lease whose
// processes are gone.
func (d *Daemon) finishRelease(l *lease, why string) {
	d.mu.Lock()
	in := l.inst
	if in == nil || d.leases[l.id] != l || l.state != leaseReleasing {
		d.mu.Unlock()
		return
	}
	if _, err := l.step(leaseReleased, why); err != nil {
		d.mu.Unlock()
		return
	}
	in.p.Release(&l.req)
	delete(in.leases, l.id)
	delete(d.leases, l.id)
	// Its log line once the history has it.
	d.endedLocked(l, releasedHow(why), why, in.log, "lease released", "why", why, "ran", d.clock.Since(l.grantedAt))
	l.inst = nil
	d.store.request()
	d.retireIfEmptyLocked(in)
	d.scheduleLocked(in.group)
	d.mu.Unlock()
}

// Bounds of the backoff between retries of a kill that failed.
const (
	killRetryInitial = time.Second
	killRetryMax     = time.Minute
)

// killFailed reports a kill that failed: an error line naming the lease,
// its group, GPUs and cgroup, and the failure counter.
func (d *Daemon) killFailed(l *lease, during string, err error) {
	d.mu.Lock()
	d.metrics.killFailures[l.group]++
	gpus, uuid := "", ""
	if l.inst != nil {
		gpus, uuid = gpuList(l.inst), l.inst.gpus[0].UUID
	}
	d.mu.Unlock()
	cg := ""
	l.cgMu.Lock()
	if l.cg != nil {
		cg = l.cg.Path()
	}
	l.cgMu.Unlock()
	d.log.Error("lease processes would not die; its capacity stays held and the kill is retried",
		"lease", l.id, "group", l.group, "gpu", uuid, "gpu_index", gpus, "cgroup", cg, "during", during, "err", err)
}

// retryKillLocked marks l stuck in a failed kill and starts the daemon's
// goroutine that retries it, backing off from killRetryInitial to
// killRetryMax, and calls then once the lease's processes are gone. l
// keeps its place on its instance (and so its capacity) meanwhile. At
// mpsd's stop the goroutine ends; the lease is saved as it stands and the
// next mpsd takes it up again.
func (d *Daemon) retryKillLocked(l *lease, then func()) {
	if l.killStuck {
		return
	}
	l.killStuck = true
	retry := func() {
		backoff := killRetryInitial
		if d.opts.killRetryInitial > 0 {
			backoff = d.opts.killRetryInitial
		}
		t := d.clock.NewTimer(backoff)
		defer t.Stop()
		for {
			select {
			case <-d.ctx.Done():
				return
			case <-t.C():
			}
			err := d.killLease(l)
			if err == nil {
				break
			}
			if d.ctx.Err() != nil {
				return
			}
			d.killFailed(l, "retry", err)
			backoff = min(2*backoff, killRetryMax)
			t.Reset(backoff)
		}
		d.mu.Lock()
		l.killStuck = false
		d.mu.Unlock()
		d.log.Warn("lease processes are gone after a failed kill; finishing its end", "lease", l.id, "group", l.group)
		then()
	}
	if !d.spawn(retry) {
		// mpsd is stopping: the saved state keeps the lease for the next.
		l.killStuck = false
	}
}

// errLeaseEnding: the lease is ending (its processes are being killed):
// nothing joins it.
var errLeaseEnding = errors.New("the lease is ending: its processes are being killed")

// deleteReaped deletes a lease cgroup whose kill has just emptied it. A
// process that has exited but is not yet reaped by its parent still keeps
// a v1 hierarchy's directory busy (the unified one already reads empty),
// and there is no event for its reaping on v1: Delete is tried again,
// from a millisecond apart up to 50 ms apart, for at most a second
// (within ctx), before it counts as a failed kill.
func deleteReaped(ctx context.Context, cg cgroup.Lease) error {
	wait := time.Millisecond
	deadline := time.Now().Add(time.Second)
	for {
		err := cg.Delete()
		if err == nil || !errors.Is(err, cgroup.ErrNotEmpty) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// errStaleAttempt: an attach names an attempt the lease is no longer at.
var errStaleAttempt = errors.New("the lease has been granted again since")

// staleAttemptError is an attach refused for an attempt the lease is no
// longer at; it wraps errStaleAttempt.
type staleAttemptError struct {
	lease     string
	at, asked int
}

func (e *staleAttemptError) Error() string {
	return fmt.Sprintf("lease %s is at attempt %d, not %d: nothing was attached", e.lease, e.at, e.asked)
}

func (e *staleAttemptError) Unwrap() error { return errStaleAttempt }

// killLease empties and removes the lease's cgroup. The handle is taken
// under cgMu and the kill (up to 30 s) runs without it, so status, Xid
// handling and attaches to other leases never wait on it; an attach to
// this lease is refused meanwhile. Only the owner of the lease's end (its
// revocation or release) kills it, so kills do not overlap.
func (d *Daemon) killLease(l *lease) error {
	if d.opts.killLocking != nil {
		d.opts.killLocking(l)
	}
	l.cgMu.Lock()
	l.closed = true
	cg := l.cg
	if cg == nil {
		l.cgMu.Unlock()
		return nil
	}
	if l.killing {
		l.cgMu.Unlock()
		return fmt.Errorf("kill lease %s: %w", l.id, errLeaseEnding)
	}
	l.killing = true
	l.cgMu.Unlock()
	// Most leases end empty (the command exited and the launcher then
	// released): Delete removes an empty cgroup at once, and refuses a
	// populated one, which is then killed and deleted.
	err := cg.Delete()
	if err != nil {
		if p, err := cg.Pids(); err == nil {
			l.cgMu.Lock()
			l.readLocked(p, d.clock.Now())
			l.cgMu.Unlock()
		}
		ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
		err = cg.Kill(ctx)
		if err != nil {
			err = fmt.Errorf("kill lease %s: %w", l.id, err)
		} else if err = deleteReaped(ctx, cg); err != nil {
			err = fmt.Errorf("delete cgroup of lease %s: %w", l.id, err)
		}
		cancel()
	}
	l.cgMu.Lock()
	l.killing = false
	if err == nil {
		l.cg, l.pids = nil, nil
	}
	l.cgMu.Unlock()
	return err
}

// prepareCgroup creates the cgroup of a lease just granted whose client
// said it will attach (api.LeaseRequest.WillAttach), ahead of the attach
// of its command: the creation (a few directories in every
// hierarchy, half a millisecond or more) then overlaps the state write,
// the granted event's way to mps-launch and the attach request, and the
// attach, on the launch's critical path, only moves the process. It
// checks what attach checks: a lease whose end has begun gets none (its
// kill has run or is running, and would miss it). A failure is left to
// the attach, which tries again and reports it.
func (d *Daemon) prepareCgroup(l *lease) {
	l.cgMu.Lock()
	defer l.cgMu.Unlock()
	if l.killing || l.closed {
		return
	}
	if err := d.ensureCgroupLocked(l); err != nil {
		d.log.Debug("lease cgroup not created ahead of the attach", "lease", l.id, "err", err)
	}
}

// ensureCgroupLocked creates the lease's cgroup unless it has one (or
// opens it if it is there already); the caller holds cgMu and has checked
// that the lease is not ending.
func (d *Daemon) ensureCgroupLocked(l *lease) error {
	if l.cg != nil {
		return nil
	}
	id := cgroup.LeaseID{Group: l.group, Lease: l.id}
	cg, err := d.cg.Create(id, cgroup.Limits{})
	if errors.Is(err, cgroup.ErrExist) {
		cg, err = d.cg.Open(id)
	}
	if err != nil {
		return fmt.Errorf("cgroup of lease %s: %w", l.id, err)
	}
	l.cg = cg
	return nil
}

// attach moves pid into the lease's cgroup, creating it on first use
// (prepareCgroup normally has), then runs same (when not nil), which
// checks that the process moved is the one the caller checked and moves
// back one that is not. Creating, attaching and that check are quick
// writes to cgroupfs and reads of /proc, done under cgMu so that a kill
// (which takes the handle under it) sees the pid, and never runs between
// the move of a process that took a reused pid and its move back.
func (d *Daemon) attach(l *lease, attempt, pid int, same func() error) error {
	l.cgMu.Lock()
	defer l.cgMu.Unlock()
	if attempt != 0 && attempt != l.cgAttempt {
		// A child started for an attempt since revoked, the lease granted
		// again (perhaps elsewhere): it must not run under the new one.
		return &staleAttemptError{lease: l.id, at: l.cgAttempt, asked: attempt}
	}
	if l.killing || l.closed {
		// Checked here, not only by the caller's look at the lease's
		// state: a kill that began and ended since would otherwise let
		// the pid into a fresh cgroup no revocation covers.
		return fmt.Errorf("attach pid %d to lease %s: %w", pid, l.id, errLeaseEnding)
	}
	if err := d.ensureCgroupLocked(l); err != nil {
		return err
	}
	if err := l.cg.Attach(pid); err != nil {
		return fmt.Errorf("attach pid %d to lease %s: %w", pid, l.id, err)
	}
	l.pids, l.pidsAt = append(l.pids, pid), d.clock.Now()
	if d.opts.attachMoved != nil {
		d.opts.attachMoved(l)
	}
	if same != nil {
		return same()
	}
	return nil
}

// logAttrs are the lease's fields every log line of its grant, release,
// revocation and requeue carries (lease, job, uid, user), then more; its
// logger adds group, gpu (the first GPU's UUID, as the metrics label it)
// and gpu_index.
func (l *lease) logAttrs(more ...any) []any {
	return append([]any{"lease", l.id, "job", l.jobID, "uid", l.uid, "user", l.user}, more...)
}

// logger is the logger of the lease's instance (with its gpu and
// gpu_index) while it is on one, else mpsd's.
func (l *lease) logger() *slog.Logger {
	switch {
	case l.inst != nil && l.inst.log != nil:
		return l.inst.log
	case l.log != nil:
		return l.log.With("group", l.group)
	}
	return slog.New(slog.DiscardHandler)
}

func (l *lease) statusLocked() api.LeaseStatus {
	procs := l.req.Clients()
	st := api.LeaseStatus{ID: l.id, Group: l.group, UID: l.uid, SM: l.req.SM, MemBytes: l.req.Mem,
		Attempt: l.attempt, State: api.LeaseQueued, GPUIndexes: []int{}, PIDs: []int{}, JobID: l.jobID,
		Command: l.command, Procs: procs, SMPerProcess: l.req.SM / procs, LauncherPID: l.launcherPID}
	if l.inst != nil {
		st.State = api.LeaseRunning
		st.RunningSince = l.grantedAt
		for _, g := range l.inst.gpus {
			st.GPUIndexes = append(st.GPUIndexes, g.Index)
		}
		if l.memUsed != nil {
			v := *l.memUsed
			st.MemUsedBytes = &v
		}
		if l.clients != nil {
			n := *l.clients
			st.Clients = &n
		}
	} else {
		// The position and reason last sent to its launcher: status and
		// mps-launch say the same.
		st.QueuedSince, st.Position, st.WaitReason = l.queuedAt, l.position, l.waitReason
	}
	return st
}

// maxLeftPids bounds lease.left.
const maxLeftPids = 256

// readLocked records a reading p of the lease's cgroup taken at now
// (under cgMu): the pids the last reading listed and this one does not
// join left.
func (l *lease) readLocked(p []int, now time.Time) {
	maps.DeleteFunc(l.left, func(_ int, at time.Time) bool { return now.Sub(at) > culpritSeenAge })
	// One pass over each list, however many processes a tenant forks in
	// its cgroup: no lookup of every old pid in the new list.
	var listed map[int]bool
	if len(l.pids) > 0 && !slices.Equal(l.pids, p) {
		listed = make(map[int]bool, len(p))
		for _, pid := range p {
			listed[pid] = true
		}
	}
	for _, pid := range l.pids {
		if listed == nil || len(l.left) >= maxLeftPids {
			break
		}
		if !listed[pid] {
			if l.left == nil {
				l.left = map[int]time.Time{}
			}
			l.left[pid] = l.pidsAt
		}
	}
	l.pids, l.pidsAt = p, now
}

// seenAt says when a reading of the lease's cgroup (or an attach) last
// listed pid, if one did within culpritSeenAge; what mpsd knows without
// looking again.
func (l *lease) seenAt(pid int, now time.Time) (time.Time, bool) {
	l.cgMu.Lock()
	defer l.cgMu.Unlock()
	at, ok := l.left[pid]
	if slices.Contains(l.pids, pid) {
		at, ok = l.pidsAt, true
	}
	return at, ok && !at.IsZero() && now.Sub(at) <= culpritSeenAge
}

// livePids lists the lease's processes: the cgroup's when it has one
// (read without cgMu, and kept, stamped on clk, mpsd's clock, for when it
// cannot be read), else the pids last known.
func (l *lease) livePids(clk clock.Clock) []int {
	pids, _ := l.readPids(clk)
	return pids
}

// readPids is livePids, and whether they are a reading of the cgroup just
// now (else the pids last known).
func (l *lease) readPids(clk clock.Clock) (pids []int, now bool) {
	l.cgMu.Lock()
	cg := l.cg
	l.cgMu.Unlock()
	if cg != nil {
		if p, err := cg.Pids(); err == nil {
			l.cgMu.Lock()
			if l.cg == cg {
				// Stamped once read, under cgMu: readings are kept in
				// the order of their times.
				l.readLocked(p, clk.Now())
			}
			l.cgMu.Unlock()
			return slices.Clone(p), true
		}
	}
	l.cgMu.Lock()
	defer l.cgMu.Unlock()
	return slices.Clone(l.pids), false
}
