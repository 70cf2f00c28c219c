package policy

import (
	"errors"
	"testing"
)

// One uid's small leases stop at the instance's UserCap: the next waits
// (ErrOnlyClosed, so it holds back nobody) and another uid is placed; a
// uid with nothing on the instance may take one lease of any size; uid 0
// has no cap; a lease's procs count.
func TestPlaceUserCap(t *testing.T) {
	in := []Instance{{Group: "g", GPUs: []int{0}, State: InstanceReady, Multiuser: true,
		Budget: Usage{SM: 100, Mem: 1 << 30, Clients: 8}, UserCap: 4}}
	small := func(uid uint32, seq uint64) Request {
		return Request{Group: "g", UID: uid, SM: 1, Mem: 1 << 20, GPUs: 1, Procs: 1, Seq: seq}
	}
	for i := range 4 {
		r := small(1000, uint64(i))
		if _, err := Place(&r, in, Binpack); err != nil {
			t.Fatalf("lease %d of uid 1000: %v", i, err)
		}
		in[0].Assign(&r)
	}
	if got := in[0].UserClients(1000); got != 4 {
		t.Fatalf("uid 1000 holds %d clients, want 4", got)
	}
	over := small(1000, 10)
	if _, err := Place(&over, in, Binpack); !errors.Is(err, ErrOnlyClosed) {
		t.Fatalf("fifth lease of uid 1000: %v, want ErrOnlyClosed (it waits, holding back nobody)", err)
	}
	other := small(1001, 11)
	queue := []Request{over, other}
	if qi, ii, err := Next(queue, in, Binpack); err != nil || qi != 1 || ii != 0 {
		t.Fatalf("Next = %d, %d, %v; want uid 1001's request placed past uid 1000's", qi, ii, err)
	}
	root := small(0, 12)
	if _, err := Place(&root, in, Binpack); err != nil {
		t.Errorf("uid 0 over the cap: %v, want placed", err)
	}
	big := Request{Group: "g", UID: 1002, SM: 8, Mem: 1 << 20, GPUs: 1, Procs: 6, Seq: 13}
	in[0].Alloc = Usage{}
	if _, err := Place(&big, in, Binpack); err != nil {
		t.Errorf("first lease of 6 procs with a cap of 4: %v, want placed", err)
	}
	in[0].Assign(&big)
	one := small(1002, 14)
	if _, err := Place(&one, in, Binpack); !errors.Is(err, ErrOnlyClosed) {
		t.Errorf("uid 1002 holding 6 clients, one more: %v, want ErrOnlyClosed", err)
	}
	in[0].Release(&big)
	if got := in[0].UserClients(1002); got != 0 || len(in[0].Running) != 1 {
		t.Errorf("after release uid 1002 holds %d, Running %v; want 0 and only uid 1000", got, in[0].Running)
	}
	in[0].UserCap = 0
	if _, err := Place(&over, in, Binpack); err != nil {
		t.Errorf("no cap: %v, want placed", err)
	}
}

func TestLimitsUserClients(t *testing.T) {
	for _, c := range []struct{ set, maxClients, want int }{{0, 48, 24}, {0, 7, 4}, {0, 1, 1}, {10, 48, 10}, {48, 8, 48}} {
		if got := (LimitsConfig{RunningPerUser: c.set}).UserClients(c.maxClients); got != c.want {
			t.Errorf("running_per_user %d, max_clients %d: cap %d, want %d", c.set, c.maxClients, got, c.want)
		}
	}
}
