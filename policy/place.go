package policy

import (
	"cmp"
	"errors"
	"slices"
)

// Usage is an amount of an instance's capacity, per GPU: the sum of its
// clients' sm and mem, and their number; or the budget of those.
type Usage struct {
	SM      int
	Mem     int64
	Clients int
}

// InstanceState is where an instance is in its life; only a ready one
// takes new clients. The names are those of `mpsctl status --json`.
type InstanceState uint8

const (
	// InstanceStarting: the control daemon is being started or probed.
	InstanceStarting InstanceState = iota
	// InstanceReady: up and taking clients.
	InstanceReady
	// InstanceDraining: closed to new clients by mpsctl drain; existing
	// ones run on.
	InstanceDraining
	// InstanceRecovering: a fault is being handled; closed until it
	// reopens.
	InstanceRecovering
	// InstanceQuarantined: failed too often; closed until mpsctl resume.
	InstanceQuarantined
)

var instanceStateNames = [...]string{"starting", "ready", "draining", "recovering", "quarantined"}

func (s InstanceState) String() string {
	if int(s) < len(instanceStateNames) {
		return instanceStateNames[s]
	}
	return "unknown"
}

// Instance is what placement needs to know of one instance (one control
// daemon for a GPU set and a group). mpsd keeps these up to date; policy
// only reads them, except through Assign and Release.
type Instance struct {
	Group string
	// GPUs are the NVML indexes of the instance's GPU set.
	GPUs  []int
	State InstanceState
	// Multiuser: the server runs with -multiuser-server and serves every
	// uid.
	Multiuser bool
	// ServerUp says a server runs (or is being started) as ServerUID. MPS
	// runs one server uid at a time: a client of another uid would wait
	// until every client of the current server is gone.
	ServerUp  bool
	ServerUID uint32
	// ServerHeld: that server has clients no lease accounts for (a
	// member's client started without mps-launch). MPS makes a client of
	// another uid wait behind them as behind leased ones.
	ServerHeld bool
	// ServerContested: clients of two uids hold the instance: running
	// leases of one uid and a server of another with clients no lease
	// accounts for. MPS makes a new client of either uid wait (the
	// leased ones wait behind the unleased; a new client of the holder's
	// uid waits behind the leased ones' pending start), so nothing is
	// placed until one side has gone.
	ServerContested bool
	// ServerFault: a server of the instance is in FAULT after a client's
	// fatal fault and refuses every new client until the clients of the
	// fault have gone (some no lease holds are left): nothing is placed.
	ServerFault bool
	// Barred are uids the instance refuses for now: their clients' faults
	// kept taking its server down. It is closed to them as a quarantine
	// closes it to everyone; it lapses by itself.
	Barred []uint32
	// Budget is the group's per-GPU budget (Group.Budget); Alloc is what
	// the instance's leases hold of it. A config reload may leave Alloc
	// above a smaller Budget; the instance then takes nobody until enough
	// leases end.
	Budget Usage
	Alloc  Usage
	// UserCap is the most clients the running leases of one uid other
	// than 0 may hold on the instance (limits.running_per_user); 0 means
	// no cap. A uid with no client there may always take one lease.
	UserCap int
	// Running is what each uid's leases hold of Alloc.Clients, kept by
	// Assign and Release; copies of an Instance share it, so only the
	// instance's owner calls those two.
	Running []UserClients
}

// UserClients is how many of an instance's clients one uid's leases hold.
type UserClients struct {
	UID     uint32
	Clients int
}

// UserClients returns how many clients uid's leases hold on the instance.
func (in *Instance) UserClients(uid uint32) int {
	for _, u := range in.Running {
		if u.UID == uid {
			return u.Clients
		}
	}
	return 0
}

// OverUserCap reports whether placing r on the instance would take r's
// uid over UserCap: the uid holds clients there already, and those and
// r's exceed the cap. uid 0 has no cap.
func (in *Instance) OverUserCap(r *Request) bool {
	if in.UserCap <= 0 || r.UID == 0 {
		return false
	}
	n := in.UserClients(r.UID)
	return n > 0 && n+r.Clients() > in.UserCap
}

// Request is one client's ask as placement and the queue see it: already
// validated and completed by Group.NewRequest.
type Request struct {
	Group string
	UID   uint32
	SM    int
	Mem   int64
	// GPUs is how many GPUs the client needs; an instance with fewer
	// cannot hold it.
	GPUs int
	// Procs is how many MPS client processes the lease runs: each is a
	// client of the server, so it takes Procs of the instance's clients
	// (0, a lease saved before procs existed, counts as 1). SM is the
	// lease's whole share, divided among them.
	Procs int
	// Only, when not nil, confines the request to instances whose GPUs
	// (NVML indexes) are all in it: the GPUs a batch system gave the job.
	Only []int
	// Priority orders the queue, higher first (the group's priority).
	Priority int
	// Requeued: a lease revoked by a fault, waiting again; it goes before
	// fresh requests of its priority.
	Requeued bool
	// Seq is the arrival order; lower arrived earlier. mpsd keeps a
	// requeued lease's original Seq.
	Seq uint64
}

// Clients is how many of an instance's clients r takes: Procs, at least 1.
func (r *Request) Clients() int { return max(r.Procs, 1) }

// QueueOrder compares requests in queue order: higher Priority first,
// then requeued before fresh, then earlier arrival (lower Seq). It suits
// slices.SortFunc; equal Seqs compare equal.
func QueueOrder(a, b Request) int { return queueOrder(&a, &b) }

func queueOrder(a, b *Request) int {
	if a.Priority != b.Priority {
		return cmp.Compare(b.Priority, a.Priority)
	}
	if a.Requeued != b.Requeued {
		if a.Requeued {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.Seq, b.Seq)
}

// Head returns the index of the first request of queue in queue order,
// or -1 when it is empty. The queue need not be sorted.
func Head(queue []Request) int {
	head := -1
	for i := range queue {
		if head < 0 || queueOrder(&queue[i], &queue[head]) < 0 {
			head = i
		}
	}
	return head
}

// Place chooses the instance for r and returns its index in instances.
//
// A candidate belongs to r's group, has at least r.GPUs GPUs, all of them
// in r.Only when that is set, is ready,
// has room for r.SM, r.Mem and r.Clients() more clients within its budget,
// would not take r's uid over the instance's UserCap, and runs
// no server of another uid that still has clients, leased or not (unless
// multiuser).
// Among candidates, those needing no server change come first (an idle
// server of another uid must be replaced); then binpack takes the least
// free memory after placement, then the least free SM, and spread the
// most; ties go to the lower index. Any mode other than Spread is binpack.
//
// When none is a candidate, the error is ErrNeverFits if no instance of
// the group could hold r even empty and ready (no instance, too few GPUs,
// budgets smaller than r, a client budget below r.Clients()), ErrOnlyClosed if the
// only ones that could are drained or quarantined, or bar r's uid, or hold
// r's uid's clients up to their UserCap, else
// ErrNoRoomNow. The
// errors are the bare sentinels: Place allocates nothing.
func Place(r *Request, instances []Instance, mode Placement) (int, error) {
	spread := mode == Spread
	best := -1
	var bestSwap bool
	var bestMem int64
	var bestSM int
	ever := false
	reopens := false // a candidate is open, or will reopen by itself
	for i := range instances {
		in := &instances[i]
		if in.Group != r.Group || len(in.GPUs) < r.GPUs || !r.allows(in.GPUs) ||
			r.SM > in.Budget.SM || r.Mem > in.Budget.Mem || in.Budget.Clients < r.Clients() {
			continue
		}
		ever = true
		if slices.Contains(in.Barred, r.UID) || in.OverUserCap(r) {
			continue // closed to r's uid: r waits without holding back the rest
		}
		if in.State != InstanceDraining && in.State != InstanceQuarantined {
			reopens = true
		}
		if in.State != InstanceReady || in.Alloc.Clients+r.Clients() > in.Budget.Clients {
			continue
		}
		freeSM := in.Budget.SM - in.Alloc.SM - r.SM
		freeMem := in.Budget.Mem - in.Alloc.Mem - r.Mem
		if freeSM < 0 || freeMem < 0 {
			continue
		}
		swap := !in.Multiuser && in.ServerUp && in.ServerUID != r.UID
		if swap && (in.Alloc.Clients > 0 || in.ServerHeld) || !in.Multiuser && in.ServerContested {
			continue // would wait behind another uid's clients
		}
		if in.ServerFault {
			continue // MPS refuses its clients until the fault's have gone
		}
		if best >= 0 {
			if swap != bestSwap {
				if swap {
					continue
				}
			} else if c := cmp.Compare(freeMem, bestMem); c != 0 {
				if (c > 0) != spread {
					continue
				}
			} else if c := cmp.Compare(freeSM, bestSM); c == 0 || (c > 0) != spread {
				continue
			}
		}
		best, bestSwap, bestMem, bestSM = i, swap, freeMem, freeSM
	}
	switch {
	case best >= 0:
		return best, nil
	case !ever:
		return -1, ErrNeverFits
	case !reopens:
		return -1, ErrOnlyClosed
	default:
		return -1, ErrNoRoomNow
	}
}

// allows reports whether every GPU of an instance is one r may use.
func (r *Request) allows(gpus []int) bool {
	if r.Only == nil {
		return true
	}
	for _, g := range gpus {
		if !slices.Contains(r.Only, g) {
			return false
		}
	}
	return true
}

// Next is one admission decision for a group's queue: the head of queue
// in queue order and the instance Place chooses for it. The queue is
// strict: when the head does not fit now (ErrNoRoomNow) nothing behind it
// is placed, so a large request or one waiting for another uid's server
// to empty is never starved by a stream of smaller ones. A request that
// only drained or quarantined instances could hold (one confined to such a
// GPU) waits for an operator, maybe for long, and one whose uid holds its
// UserCap on every instance that could hold it waits for one of that uid's
// leases to end: it keeps its place but does
// not hold back the rest, and Next decides for the first request after it
// in queue order instead (ErrOnlyClosed when every request is such). With
// ErrNeverFits (say a reload shrank the budgets) mpsd refuses that request
// and asks again. An empty queue gives ErrEmptyQueue. Next allocates
// nothing.
func Next(queue []Request, instances []Instance, mode Placement) (qi, ii int, err error) {
	head := Head(queue)
	if head < 0 {
		return -1, -1, ErrEmptyQueue
	}
	for qi = head; qi >= 0; qi = after(queue, qi) {
		ii, err = Place(&queue[qi], instances, mode)
		if !errors.Is(err, ErrOnlyClosed) {
			return qi, ii, err
		}
	}
	return head, -1, ErrOnlyClosed
}

// after returns the index of the request that follows queue[prev] in
// queue order (equal ones by index), or -1. Quadratic over a passage of
// the queue, but only requests waiting for closed instances are passed,
// and it allocates nothing.
func after(queue []Request, prev int) int {
	later := func(i int) bool {
		c := queueOrder(&queue[i], &queue[prev])
		return c > 0 || c == 0 && i > prev
	}
	next := -1
	for i := range queue {
		if !later(i) {
			continue
		}
		if next < 0 {
			next = i
			continue
		}
		if c := queueOrder(&queue[i], &queue[next]); c < 0 || c == 0 && i < next {
			next = i
		}
	}
	return next
}

// Assign records r as placed on the instance: its usage grows, and the
// server is now (or will be started as) r's uid.
func (in *Instance) Assign(r *Request) {
	in.Alloc.SM += r.SM
	in.Alloc.Mem += r.Mem
	in.Alloc.Clients += r.Clients()
	in.addUser(r.UID, r.Clients())
	if !in.Multiuser {
		in.ServerUp, in.ServerUID = true, r.UID
	}
}

// Release records that a lease placed by Assign ended. The server stays
// up: MPS does not stop an idle server.
func (in *Instance) Release(r *Request) {
	in.Alloc.SM -= r.SM
	in.Alloc.Mem -= r.Mem
	in.Alloc.Clients -= r.Clients()
	in.addUser(r.UID, -r.Clients())
}

// addUser changes uid's count in Running by n, dropping it at 0.
func (in *Instance) addUser(uid uint32, n int) {
	for i := range in.Running {
		if in.Running[i].UID == uid {
			if in.Running[i].Clients += n; in.Running[i].Clients <= 0 {
				in.Running = slices.Delete(in.Running, i, i+1)
			}
			return
		}
	}
	if n > 0 {
		in.Running = append(in.Running, UserClients{UID: uid, Clients: n})
	}
}
