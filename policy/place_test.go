package policy

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// budget40 is a group budget of a 40 GiB card: all SMs, 40G, 48 clients.
var budget40 = Usage{SM: 100, Mem: 40 * gib, Clients: 48}

// ready returns a ready instance of group g on GPU gpu with that usage.
func ready(g string, gpu int, alloc Usage) Instance {
	return Instance{Group: g, GPUs: []int{gpu}, State: InstanceReady, Budget: budget40, Alloc: alloc}
}

func withServer(in Instance, uid uint32) Instance {
	in.ServerUp, in.ServerUID = true, uid
	return in
}

func barred(in Instance, uids ...uint32) Instance {
	in.Barred = uids
	return in
}

func held(in Instance) Instance {
	in.ServerHeld = true
	return in
}

func contested(in Instance) Instance {
	in.ServerContested = true
	return in
}

func multiuser(in Instance) Instance {
	in.Multiuser = true
	return in
}

func inState(in Instance, s InstanceState) Instance {
	in.State = s
	return in
}

func req(g string, uid uint32, sm int, mem int64) Request {
	return Request{Group: g, UID: uid, SM: sm, Mem: mem, GPUs: 1}
}

func TestPlace(t *testing.T) {
	for _, tc := range []struct {
		name      string
		r         Request
		instances []Instance
		mode      Placement
		want      int
		err       error
	}{
		{"empty instance", req("a", 1, 25, 8*gib), []Instance{ready("a", 0, Usage{})}, Binpack, 0, nil},
		{"exact fit", req("a", 1, 25, 10*gib),
			[]Instance{ready("a", 0, Usage{SM: 75, Mem: 30 * gib, Clients: 3})}, Binpack, 0, nil},
		{"one SM too many", req("a", 1, 26, 10*gib),
			[]Instance{ready("a", 0, Usage{SM: 75, Mem: 30 * gib, Clients: 3})}, Binpack, -1, ErrNoRoomNow},
		{"one byte too many", req("a", 1, 25, 10*gib+1),
			[]Instance{ready("a", 0, Usage{SM: 75, Mem: 30 * gib, Clients: 3})}, Binpack, -1, ErrNoRoomNow},
		{"48th client", req("a", 1, 1, 1<<20), []Instance{ready("a", 0, Usage{SM: 47, Mem: 47 << 20, Clients: 47})}, Binpack, 0, nil},
		{"49th client", req("a", 1, 1, 1<<20), []Instance{ready("a", 0, Usage{SM: 48, Mem: 48 << 20, Clients: 48})}, Binpack, -1, ErrNoRoomNow},
		{"4 processes in the last 4 clients", Request{Group: "a", UID: 1, SM: 4, Mem: 1 << 20, GPUs: 1, Procs: 4},
			[]Instance{ready("a", 0, Usage{SM: 44, Mem: 44 << 20, Clients: 44})}, Binpack, 0, nil},
		{"4 processes in the last 3 clients", Request{Group: "a", UID: 1, SM: 4, Mem: 1 << 20, GPUs: 1, Procs: 4},
			[]Instance{ready("a", 0, Usage{SM: 45, Mem: 45 << 20, Clients: 45})}, Binpack, -1, ErrNoRoomNow},
		{"more processes than the client budget", Request{Group: "a", UID: 1, SM: 10, Mem: 1 << 20, GPUs: 1, Procs: 9},
			[]Instance{{Group: "a", GPUs: []int{0}, State: InstanceReady, Budget: Usage{SM: 100, Mem: gib, Clients: 8}}}, Binpack, -1, ErrNeverFits},
		{"over budget after a reload shrank it", req("a", 1, 1, 1<<20),
			[]Instance{ready("a", 0, Usage{SM: 100, Mem: 50 * gib, Clients: 1})}, Binpack, -1, ErrNoRoomNow},
		{"zero memory budget", req("a", 1, 1, 1<<20),
			[]Instance{{Group: "a", GPUs: []int{0}, State: InstanceReady, Budget: Usage{SM: 100, Mem: 0, Clients: 48}}}, Binpack, -1, ErrNeverFits},
		{"zero SM budget", req("a", 1, 1, 1<<20),
			[]Instance{{Group: "a", GPUs: []int{0}, State: InstanceReady, Budget: Usage{SM: 0, Mem: gib, Clients: 48}}}, Binpack, -1, ErrNeverFits},
		{"zero client budget", req("a", 1, 1, 1<<20),
			[]Instance{{Group: "a", GPUs: []int{0}, State: InstanceReady, Budget: Usage{SM: 100, Mem: gib, Clients: 0}}}, Binpack, -1, ErrNeverFits},
		{"bigger than the budget", req("a", 1, 10, 41*gib), []Instance{ready("a", 0, Usage{})}, Binpack, -1, ErrNeverFits},
		{"no instance of the group", req("b", 1, 10, gib), []Instance{ready("a", 0, Usage{})}, Binpack, -1, ErrNeverFits},
		{"no instances at all", req("a", 1, 10, gib), nil, Binpack, -1, ErrNeverFits},
		{"too few GPUs", Request{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 2}, []Instance{ready("a", 0, Usage{})}, Binpack, -1, ErrNeverFits},
		{"multi-GPU instance", Request{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 2},
			[]Instance{{Group: "a", GPUs: []int{0, 1}, State: InstanceReady, Budget: budget40}}, Binpack, 0, nil},
		{"drained GPU", req("a", 1, 10, gib), []Instance{inState(ready("a", 0, Usage{}), InstanceDraining)}, Binpack, -1, ErrOnlyClosed},
		{"drained GPU and a full one", req("a", 1, 10, gib), []Instance{inState(ready("a", 0, Usage{}), InstanceDraining), ready("a", 1, Usage{SM: 95, Mem: gib, Clients: 1})}, Binpack, -1, ErrNoRoomNow},
		{"drained GPU skipped", req("a", 1, 10, gib),
			[]Instance{inState(ready("a", 0, Usage{}), InstanceDraining), ready("a", 1, Usage{})}, Binpack, 1, nil},
		{"quarantined", req("a", 1, 10, gib), []Instance{inState(ready("a", 0, Usage{}), InstanceQuarantined)}, Binpack, -1, ErrOnlyClosed},
		{"quarantined and too small", req("a", 1, 10, 41*gib), []Instance{inState(ready("a", 0, Usage{}), InstanceQuarantined)}, Binpack, -1, ErrNeverFits},
		{"recovering", req("a", 1, 10, gib), []Instance{inState(ready("a", 0, Usage{}), InstanceRecovering)}, Binpack, -1, ErrNoRoomNow},
		{"server in FAULT", req("a", 1, 10, gib), []Instance{inFault(ready("a", 0, Usage{}))}, Binpack, -1, ErrNoRoomNow},
		{"server in FAULT passed over", req("a", 1, 10, gib), []Instance{inFault(ready("a", 0, Usage{})), ready("a", 1, Usage{SM: 50, Mem: gib, Clients: 1})}, Binpack, 1, nil},
		{"multiuser server in FAULT", req("a", 1, 10, gib), []Instance{func() Instance { in := inFault(ready("a", 0, Usage{})); in.Multiuser = true; return in }()}, Binpack, -1, ErrNoRoomNow},
		{"starting", req("a", 1, 10, gib), []Instance{inState(ready("a", 0, Usage{}), InstanceStarting)}, Binpack, -1, ErrNoRoomNow},
		{"uid mismatch with clients", req("a", 2, 10, gib),
			[]Instance{withServer(ready("a", 0, Usage{SM: 10, Mem: gib, Clients: 1}), 1)}, Binpack, -1, ErrNoRoomNow},
		{"uid mismatch placed away", req("a", 2, 10, gib),
			[]Instance{withServer(ready("a", 0, Usage{SM: 10, Mem: gib, Clients: 1}), 1), ready("a", 1, Usage{})}, Binpack, 1, nil},
		{"idle server of another uid is replaceable", req("a", 2, 10, gib),
			[]Instance{withServer(ready("a", 0, Usage{}), 1)}, Binpack, 0, nil},
		{"server of another uid held by an unleased client", req("a", 2, 10, gib),
			[]Instance{held(withServer(ready("a", 0, Usage{}), 1))}, Binpack, -1, ErrNoRoomNow},
		{"held server placed away", req("a", 2, 10, gib),
			[]Instance{held(withServer(ready("a", 0, Usage{}), 1)), ready("a", 1, Usage{SM: 90})}, Binpack, 1, nil},
		{"held server of the same uid shares", req("a", 1, 10, gib),
			[]Instance{held(withServer(ready("a", 0, Usage{}), 1))}, Binpack, 0, nil},
		{"contested: not even the holder's uid", req("a", 1, 10, gib),
			[]Instance{contested(held(withServer(ready("a", 0, Usage{SM: 10, Mem: gib, Clients: 1}), 1)))}, Binpack, -1, ErrNoRoomNow},
		{"contested: placed away", req("a", 1, 10, gib),
			[]Instance{contested(held(withServer(ready("a", 0, Usage{SM: 10, Mem: gib, Clients: 1}), 1))), ready("a", 1, Usage{SM: 90})}, Binpack, 1, nil},
		{"contested means nothing on a multiuser instance", req("a", 1, 10, gib),
			[]Instance{multiuser(contested(ready("a", 0, Usage{})))}, Binpack, 0, nil},
		{"uid barred: closed to it", req("a", 2, 10, gib),
			[]Instance{barred(ready("a", 0, Usage{}), 2)}, Binpack, -1, ErrOnlyClosed},
		{"uid barred: placed away", req("a", 2, 10, gib),
			[]Instance{barred(ready("a", 0, Usage{}), 2), ready("a", 1, Usage{SM: 90})}, Binpack, 1, nil},
		{"another uid barred: open to this one", req("a", 1, 10, gib),
			[]Instance{barred(ready("a", 0, Usage{}), 2)}, Binpack, 0, nil},
		{"no server change preferred over fuller", req("a", 2, 10, gib),
			[]Instance{withServer(ready("a", 0, Usage{}), 1), withServer(ready("a", 1, Usage{}), 2)}, Binpack, 1, nil},
		{"same uid shares", req("a", 1, 10, gib),
			[]Instance{withServer(ready("a", 0, Usage{SM: 10, Mem: gib, Clients: 1}), 1)}, Binpack, 0, nil},
		{"multiuser ignores uid", req("a", 2, 10, gib),
			[]Instance{func() Instance {
				in := withServer(ready("a", 0, Usage{SM: 10, Mem: gib, Clients: 1}), 0)
				in.Multiuser = true
				return in
			}()}, Binpack, 0, nil},
		{"binpack takes the fullest", req("a", 1, 10, gib),
			[]Instance{ready("a", 0, Usage{SM: 10, Mem: 5 * gib, Clients: 1}), ready("a", 1, Usage{SM: 10, Mem: 20 * gib, Clients: 1}), ready("a", 2, Usage{})},
			Binpack, 1, nil},
		{"spread takes the emptiest", req("a", 1, 10, gib),
			[]Instance{ready("a", 0, Usage{SM: 10, Mem: 5 * gib, Clients: 1}), ready("a", 1, Usage{SM: 10, Mem: 20 * gib, Clients: 1}), ready("a", 2, Usage{})},
			Spread, 2, nil},
		{"binpack ties on memory break on SM", req("a", 1, 10, gib),
			[]Instance{ready("a", 0, Usage{SM: 10, Mem: 5 * gib, Clients: 1}), ready("a", 1, Usage{SM: 50, Mem: 5 * gib, Clients: 1})}, Binpack, 1, nil},
		{"spread ties on memory break on SM", req("a", 1, 10, gib),
			[]Instance{ready("a", 0, Usage{SM: 50, Mem: 5 * gib, Clients: 1}), ready("a", 1, Usage{SM: 10, Mem: 5 * gib, Clients: 1})}, Spread, 1, nil},
		{"full tie takes the lower index", req("a", 1, 10, gib),
			[]Instance{ready("b", 0, Usage{}), ready("a", 1, Usage{}), ready("a", 2, Usage{})}, Spread, 1, nil},
		{"confined to one GPU passes the fuller one by", Request{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Only: []int{2}},
			[]Instance{ready("a", 0, Usage{SM: 10, Mem: 5 * gib, Clients: 1}), ready("a", 2, Usage{})}, Binpack, 1, nil},
		{"confined GPU full waits", Request{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Only: []int{0}},
			[]Instance{ready("a", 0, Usage{SM: 95, Mem: 5 * gib, Clients: 1}), ready("a", 1, Usage{})}, Binpack, -1, ErrNoRoomNow},
		{"confined to GPUs the group has no instance on", Request{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Only: []int{3}},
			[]Instance{ready("a", 0, Usage{}), ready("a", 1, Usage{})}, Binpack, -1, ErrNeverFits},
		{"multi-GPU instance half outside the confinement", Request{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Only: []int{0}},
			[]Instance{{Group: "a", GPUs: []int{0, 1}, State: InstanceReady, Budget: budget40}}, Binpack, -1, ErrNeverFits},
		{"empty confinement allows nothing", Request{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Only: []int{}},
			[]Instance{ready("a", 0, Usage{})}, Binpack, -1, ErrNeverFits},
		{"binpack skips the one without room", req("a", 1, 10, 10*gib),
			[]Instance{ready("a", 0, Usage{SM: 10, Mem: 35 * gib, Clients: 1}), ready("a", 1, Usage{SM: 10, Mem: 20 * gib, Clients: 1})}, Binpack, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(&tc.r, tc.instances, tc.mode)
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("Place = %d, %v; want %d, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestQueueOrder(t *testing.T) {
	q := []Request{
		{Seq: 1},
		{Seq: 2, Requeued: true},
		{Seq: 3, Priority: 5},
		{Seq: 0},
		{Seq: 4, Priority: 5, Requeued: true},
		{Seq: 5, Priority: -1, Requeued: true},
	}
	sorted := slices.Clone(q)
	slices.SortFunc(sorted, QueueOrder)
	var seqs []uint64
	for _, r := range sorted {
		seqs = append(seqs, r.Seq)
	}
	// Priority first, then requeued, then arrival.
	if want := []uint64{4, 3, 2, 0, 1, 5}; !slices.Equal(seqs, want) {
		t.Errorf("queue order %v, want %v", seqs, want)
	}
	if h := Head(q); q[h].Seq != 4 {
		t.Errorf("Head = request %d, want 4", q[h].Seq)
	}
	if h := Head(nil); h != -1 {
		t.Errorf("Head(nil) = %d", h)
	}
}

func TestNext(t *testing.T) {
	instances := []Instance{withServer(ready("a", 0, Usage{SM: 50, Mem: 30 * gib, Clients: 2}), 1)}
	for _, tc := range []struct {
		name   string
		queue  []Request
		qi, ii int
		err    error
	}{
		{"empty", nil, -1, -1, ErrEmptyQueue},
		{"the head blocks a smaller request behind it", []Request{{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Seq: 2}, {Group: "a", UID: 1, SM: 90, Mem: gib, GPUs: 1, Seq: 1}}, 1, -1, ErrNoRoomNow},
		{"strict order: head waits, nothing passes it", []Request{
			{Group: "a", UID: 2, SM: 10, Mem: gib, GPUs: 1, Seq: 1},
			{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Seq: 2},
		}, 0, -1, ErrNoRoomNow},
		{"requeued goes first", []Request{
			{Group: "a", UID: 1, SM: 10, Mem: gib, GPUs: 1, Seq: 1},
			{Group: "a", UID: 1, SM: 20, Mem: gib, GPUs: 1, Seq: 7, Requeued: true},
		}, 1, 0, nil},
		{"never fits is reported for the head", []Request{{Group: "a", UID: 1, SM: 10, Mem: 50 * gib, GPUs: 1}}, 0, -1, ErrNeverFits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qi, ii, err := Next(tc.queue, instances, Binpack)
			if qi != tc.qi || ii != tc.ii || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("Next = %d, %d, %v; want %d, %d, %v", qi, ii, err, tc.qi, tc.ii, tc.err)
			}
		})
	}
}

// A request only a quarantined (or drained) instance could hold waits for
// an operator, perhaps for hours: the strict queue lets the requests
// behind it pass, in queue order, and the waiting one keeps its place.
func TestNextPassesRequestsForClosedInstances(t *testing.T) {
	instances := []Instance{
		inState(ready("a", 0, Usage{}), InstanceQuarantined),
		ready("a", 1, Usage{SM: 50, Mem: gib, Clients: 1}),
		inState(ready("a", 2, Usage{}), InstanceDraining),
	}
	on := func(seq uint64, sm int, gpus ...int) Request {
		return Request{Group: "a", UID: 1, SM: sm, Mem: gib, GPUs: 1, Only: gpus, Seq: seq}
	}
	for _, tc := range []struct {
		name   string
		queue  []Request
		qi, ii int
		err    error
	}{
		{"confined to the quarantined GPU: the next one is placed", []Request{on(3, 10), on(1, 10, 0)}, 0, 1, nil},
		{"passed in queue order", []Request{on(4, 10), on(2, 10, 2), on(3, 20), on(1, 10, 0)}, 2, 1, nil},
		{"the next one waits for room: strict for it", []Request{on(2, 60), on(1, 10, 0), on(3, 10)}, 0, -1, ErrNoRoomNow},
		{"every one waits for closed instances", []Request{on(2, 10, 2), on(1, 10, 0)}, 1, -1, ErrOnlyClosed},
		{"recovering reopens by itself: strict", []Request{on(1, 10, 3), on(2, 10)}, 0, -1, ErrNoRoomNow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			insts := append(slices.Clone(instances), inState(ready("a", 3, Usage{}), InstanceRecovering))
			qi, ii, err := Next(tc.queue, insts, Binpack)
			if qi != tc.qi || ii != tc.ii || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("Next = %d, %d, %v; want %d, %d, %v", qi, ii, err, tc.qi, tc.ii, tc.err)
			}
		})
	}
}

func TestAssignRelease(t *testing.T) {
	in := ready("a", 0, Usage{})
	r1, r2 := req("a", 7, 30, 4*gib), req("a", 7, 20, 2*gib)
	r2.Procs = 4 // four clients, sharing its 20%
	in.Assign(&r1)
	in.Assign(&r2)
	if want := (Usage{SM: 50, Mem: 6 * gib, Clients: 5}); in.Alloc != want || !in.ServerUp || in.ServerUID != 7 {
		t.Fatalf("after Assign: %+v", in)
	}
	in.Release(&r1)
	in.Release(&r2)
	if in.Alloc != (Usage{}) || !in.ServerUp {
		t.Errorf("after Release: %+v; want no usage and the server still up", in)
	}
	multi := ready("a", 0, Usage{})
	multi.Multiuser = true
	multi.Assign(&r1)
	if multi.ServerUp {
		t.Error("Assign on a multiuser instance recorded a server owner")
	}
}

func TestInstanceStateString(t *testing.T) {
	for s, want := range map[InstanceState]string{InstanceStarting: "starting", InstanceReady: "ready", InstanceDraining: "draining",
		InstanceRecovering: "recovering", InstanceQuarantined: "quarantined", 99: "unknown"} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", s, got, want)
		}
	}
}

// TestPlaceNeverOvercommits drives random requests and releases through
// Place, Assign and Release and checks after every step that no budget is
// exceeded, that no uid lands on another uid's busy server, and that Place
// refuses only when a brute-force search finds no instance either.
func TestPlaceNeverOvercommits(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x6d707364))
		groups := []string{"a", "b", "c"}
		var instances []Instance
		for i := range 12 {
			in := Instance{
				Group:     groups[rng.IntN(len(groups))],
				GPUs:      []int{i},
				State:     InstanceState(rng.IntN(5)),
				Multiuser: rng.IntN(4) == 0,
				Budget:    Usage{SM: 1 + rng.IntN(100), Mem: int64(1+rng.IntN(64)) * gib, Clients: rng.IntN(49)},
			}
			if rng.IntN(3) == 0 && in.State == InstanceStarting {
				in.Budget = Usage{} // a zero budget
			}
			if rng.IntN(2) == 0 {
				in.GPUs = append(in.GPUs, i+100)
			}
			instances = append(instances, in)
		}
		type lease struct {
			r  Request
			on int
		}
		var leases []lease
		mode := []Placement{Binpack, Spread}[seed%2]
		for step := range 3000 {
			if len(leases) > 0 && rng.IntN(3) == 0 {
				k := rng.IntN(len(leases))
				instances[leases[k].on].Release(&leases[k].r)
				leases = slices.Delete(leases, k, k+1)
			} else {
				r := Request{
					Group: groups[rng.IntN(len(groups))], UID: uint32(rng.IntN(3)),
					SM: 1 + rng.IntN(60), Mem: int64(1+rng.IntN(24)) * gib, GPUs: 1 + rng.IntN(2),
				}
				if rng.IntN(4) == 0 { // a server of several processes
					r.Procs = rng.IntN(9)
				}
				i, err := Place(&r, instances, mode)
				fits, ever := bruteForce(&r, instances)
				switch {
				case err == nil:
					if !slices.Contains(fits, i) {
						t.Fatalf("seed %d step %d: Place chose %d, which cannot hold %+v (fits: %v)", seed, step, i, r, fits)
					}
					instances[i].Assign(&r)
					leases = append(leases, lease{r, i})
				case errors.Is(err, ErrNoRoomNow), errors.Is(err, ErrOnlyClosed):
					if len(fits) > 0 || !ever {
						t.Fatalf("seed %d step %d: %v for %+v but fits %v, ever %v", seed, step, err, r, fits, ever)
					}
				case errors.Is(err, ErrNeverFits):
					if ever {
						t.Fatalf("seed %d step %d: ErrNeverFits for %+v but an instance could hold it", seed, step, r)
					}
				default:
					t.Fatalf("Place: unexpected error %v", err)
				}
			}
			if rng.IntN(60) == 0 { // a uid is barred from an instance, or a bar lapses
				i := rng.IntN(len(instances))
				if len(instances[i].Barred) == 0 {
					instances[i].Barred = []uint32{uint32(rng.IntN(3))}
				} else {
					instances[i].Barred = nil
				}
			}
			if rng.IntN(40) == 0 { // an unleased client comes to, or leaves, a server
				i := rng.IntN(len(instances))
				instances[i].ServerHeld = !instances[i].ServerHeld
			}
			if rng.IntN(50) == 0 { // an instance changes state: drained, resumed, faulted
				instances[rng.IntN(len(instances))].State = InstanceState(rng.IntN(5))
			}
			for i, in := range instances {
				if in.Alloc.SM > in.Budget.SM || in.Alloc.Mem > in.Budget.Mem || in.Alloc.Clients > in.Budget.Clients ||
					in.Alloc.SM < 0 || in.Alloc.Mem < 0 || in.Alloc.Clients < 0 {
					t.Fatalf("seed %d step %d: instance %d over-committed: alloc %+v budget %+v", seed, step, i, in.Alloc, in.Budget)
				}
			}
			for _, l := range leases {
				if in := instances[l.on]; !in.Multiuser && in.ServerUID != l.r.UID {
					t.Fatalf("seed %d step %d: lease of uid %d on instance %d whose server is uid %d", seed, step, l.r.UID, l.on, in.ServerUID)
				}
			}
		}
	}
}

// bruteForce lists the instances that can take r now, and says whether
// any could ever hold it, straight from the rules.
func bruteForce(r *Request, instances []Instance) (fits []int, ever bool) {
	for i, in := range instances {
		procs := max(r.Procs, 1)
		if in.Group != r.Group || len(in.GPUs) < r.GPUs || in.Budget.Clients < procs || r.SM > in.Budget.SM || r.Mem > in.Budget.Mem {
			continue
		}
		ever = true
		room := in.State == InstanceReady && in.Alloc.Clients+procs <= in.Budget.Clients &&
			in.Alloc.SM+r.SM <= in.Budget.SM && in.Alloc.Mem+r.Mem <= in.Budget.Mem
		uidOK := in.Multiuser || !in.ServerUp || in.ServerUID == r.UID || in.Alloc.Clients == 0 && !in.ServerHeld
		if room && uidOK && !slices.Contains(in.Barred, r.UID) {
			fits = append(fits, i)
		}
	}
	return fits, ever
}

func TestNextAllocatesNothing(t *testing.T) {
	instances := make([]Instance, 64)
	for i := range instances {
		instances[i] = ready("a", i, Usage{SM: i, Mem: int64(i) * gib, Clients: i % 48})
	}
	queue := make([]Request, 1000)
	for i := range queue {
		queue[i] = Request{Group: "a", UID: 1, SM: 50, Mem: gib, GPUs: 1, Seq: uint64(1000 - i)}
	}
	if n := testing.AllocsPerRun(100, func() { Next(queue, instances, Spread) }); n != 0 {
		t.Errorf("Next allocates %v times per decision, want 0", n)
	}
}

// BenchmarkNext is one admission decision: the head of 1,000 queued
// requests, placed over 64 instances of 8 groups.
func BenchmarkNext(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	var instances []Instance
	for i := range 64 {
		in := withServer(ready("g"+string(rune('0'+i%8)), i, Usage{SM: rng.IntN(100), Mem: int64(rng.IntN(40)) * gib, Clients: rng.IntN(48)}), uint32(rng.IntN(4)))
		instances = append(instances, in)
	}
	queue := make([]Request, 1000)
	for i := range queue {
		queue[i] = Request{Group: "g3", UID: uint32(rng.IntN(4)), SM: 1 + rng.IntN(20), Mem: int64(1+rng.IntN(8)) * gib,
			GPUs: 1, Priority: rng.IntN(3), Requeued: rng.IntN(10) == 0, Seq: uint64(rng.IntN(1 << 30))}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Next(queue, instances, Binpack); err != nil && !errors.Is(err, ErrNoRoomNow) {
			b.Fatal(err)
		}
	}
}

// inFault is in with a server in FAULT (Instance.ServerFault).
func inFault(in Instance) Instance {
	in.ServerFault = true
	return in
}
