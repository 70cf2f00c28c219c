package mpsd

import (
	"maps"
	"slices"
	"testing"

	"github.com/mpsd/mpsd/mps"
)

// Every row of docs/architecture.md's table of server exits: what the
// model makes of an exit, by how it ended and which leases the instance
// has, with two uids on a daemon that is not multiuser (and a shared one).
func TestMPSModelServerExit(t *testing.T) {
	const alice, bob = 64021, 64022
	clean := mps.Event{PID: 10, ExitStatus: 0}
	killed := mps.Event{PID: 10, ExitStatus: -1, Signal: 9}
	failed := mps.Event{PID: 10, ExitStatus: 1}
	unseen := mps.Event{PID: 10, ExitStatus: -1}
	mk := func(id string, uid uint32, st leaseState) *lease {
		return &lease{id: id, uid: uid, state: st}
	}
	for _, tc := range []struct {
		name       string
		serverUID  int
		multiuser  bool
		shutDown   bool
		ev         mps.Event
		leases     []*lease
		want       exitKind
		candidates []string
	}{
		{"shut down by mpsd, a lease of its uid runs", alice, false, true, killed, []*lease{mk("a1", alice, leaseRunning)}, exitShutDown, nil},
		{"uid switch: alice's server ends, bob's lease waits", alice, false, false, clean, []*lease{mk("b1", bob, leaseRunning)}, exitNoClients, nil},
		{"no lease at all", alice, false, false, killed, nil, exitNoClients, nil},
		{"clean exit, a lease of its uid", alice, false, false, clean, []*lease{mk("a1", alice, leaseRunning), mk("b1", bob, leaseRunning)}, exitClean, []string{"a1"}},
		{"killed, a lease of its uid", alice, false, false, killed, []*lease{mk("a1", alice, leaseRunning), mk("b1", bob, leaseRunning)}, exitCrash, []string{"a1"}},
		{"status 1, a lease of its uid", alice, false, false, failed, []*lease{mk("a1", alice, leaseRunning)}, exitCrash, []string{"a1"}},
		{"status not seen, a lease of its uid", alice, false, false, unseen, []*lease{mk("a1", alice, leaseRunning)}, exitCrash, []string{"a1"}},
		{"a releasing lease is no candidate", alice, false, false, killed, []*lease{mk("a1", alice, leaseReleasing)}, exitNoClients, nil},
		{"shared server: every uid's lease", 0, true, false, killed, []*lease{mk("a1", alice, leaseRunning), mk("b1", bob, leaseRunning)}, exitCrash, []string{"a1", "b1"}},
		{"unknown uid: every lease", -1, false, false, clean, []*lease{mk("a1", alice, leaseRunning), mk("b1", bob, leaseRunning)}, exitClean, []string{"a1", "b1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMPSModel()
			m.serverStarted(10, tc.serverUID)
			if tc.shutDown && m.shuttingDown(10) == nil {
				t.Fatal("shuttingDown of a live server gave no channel")
			}
			leases := map[string]*lease{}
			for i, l := range tc.leases {
				l.req.Seq = uint64(i)
				leases[l.id] = l
			}
			v := m.serverExited(tc.ev, leases, tc.multiuser)
			if v.kind != tc.want {
				t.Errorf("kind %s, want %s", v.kind, tc.want)
			}
			var got []string
			for _, l := range v.candidates {
				got = append(got, l.id)
			}
			if len(got) != len(tc.candidates) || (len(got) > 0 && !slices.Equal(got, tc.candidates)) {
				t.Errorf("candidates %v, want %v", got, tc.candidates)
			}
			if len(m.servers) != 0 {
				t.Errorf("server still known after its exit: %v", m.servers)
			}
		})
	}
}

// Whose server MPS serves, every row of docs/architecture.md's table.
func TestMPSModelServing(t *testing.T) {
	const alice, bob = 64021, 64022
	type want struct {
		up        bool
		uid       uint32
		held      bool
		contested bool
	}
	check := func(name string, m *mpsModel, leases map[string]*lease, w want) {
		t.Helper()
		var first *lease
		for _, l := range leases {
			if first == nil || l.req.Seq < first.req.Seq {
				first = l
			}
		}
		var placed uint32
		if first != nil {
			placed = first.uid
		}
		up, uid, held, contested := m.serving(placed, first != nil)
		if up != w.up || (up && uid != w.uid) || held != w.held || contested != w.contested {
			t.Errorf("%s: serving (%v, %d, held %v, contested %v), want (%v, %d, held %v, contested %v)", name, up, uid, held, contested, w.up, w.uid, w.held, w.contested)
		}
	}
	m := newMPSModel()
	check("no server", m, nil, want{})
	m.serverStarted(10, alice)
	check("alice's idle server", m, nil, want{true, alice, false, false})
	m.setUnleased(map[int][]int{10: {9100}})
	if !m.held() {
		t.Error("a server with an unleased client is not held")
	}
	check("alice's server held by her unleased client", m, nil, want{true, alice, true, false})
	check("alice's lease beside her unleased client", m, map[string]*lease{"a1": {id: "a1", uid: alice}}, want{true, alice, true, false})
	// Bob's lease waits inside MPS behind alice's unleased client; a new
	// client of either would wait too.
	check("bob's lease placed, alice's unleased client holds her server", m, map[string]*lease{"b1": {id: "b1", uid: bob}}, want{true, alice, true, true})
	m.setUnleased(map[int][]int{})
	check("the unleased client gone", m, nil, want{true, alice, false, false})
	m.setUnleased(map[int][]int{10: {9100, 9101}})
	m.serverExited(mps.Event{PID: 10, ExitStatus: 0}, nil, false)
	if m.held() {
		t.Error("a server gone is still held")
	}
	check("the held server gone", m, nil, want{})
	m.serverStarted(11, -1)
	check("a server of unknown uid", m, nil, want{})
	m.serverStarted(12, bob)
	m.daemonGone()
	check("the daemon gone", m, nil, want{})
}

// Each server's clients as the model holds them: the leases' clients go to
// the server MPS serves their uid with (one per uid, the lowest pid while
// a switch has two live; the one shared server of a multiuser daemon), a
// uid without a live server has none (its clients wait inside MPS), and a
// server's exit or a new incarnation of its pid forgets them.
func TestMPSModelClients(t *testing.T) {
	const alice, bob, carol = 64021, 64022, 64023
	m := newMPSModel()
	m.serverStarted(20, bob)
	m.serverStarted(10, alice)
	m.serverStarted(12, alice) // a switch's moment: two of alice's
	m.setUnleased(map[int][]int{20: {9200}})
	m.noteClients(map[uint32]int{alice: 3, bob: 2, carol: 4}, nil, false)
	want := []serverView{{pid: 10, uid: alice, leased: 3}, {pid: 12, uid: alice}, {pid: 20, uid: bob, leased: 2, unleased: 1}}
	if got := m.view(); !slices.Equal(got, want) {
		t.Errorf("view %+v; want %+v", got, want)
	}
	m.serverExited(mps.Event{PID: 20, ExitStatus: 0}, nil, false)
	m.serverStarted(10, alice)
	if got, want := m.view(), []serverView{{pid: 10, uid: alice}, {pid: 12, uid: alice}}; !slices.Equal(got, want) {
		t.Errorf("after bob's server exited and alice's pid 10 started again: view %+v; want %+v", got, want)
	}
	shared := newMPSModel()
	shared.serverStarted(30, 0)
	shared.noteClients(map[uint32]int{alice: 1, bob: 2}, nil, true)
	if got, want := shared.view(), []serverView{{pid: 30, uid: 0, leased: 3}}; !slices.Equal(got, want) {
		t.Errorf("multiuser: view %+v; want %+v", got, want)
	}
	shared.daemonGone()
	if got := shared.view(); len(got) != 0 {
		t.Errorf("after the daemon's end: view %+v; want none", got)
	}
}

// MPS's pending clients as the model infers them: on a daemon without
// multiuser, a running lease with no MPS client, whose uid has no live
// server while another uid's server has clients (leased or not), waits
// behind that server; nobody waits behind an idle server (MPS replaces
// it), nor on a shared daemon, nor once its uid has a server.
func TestMPSModelPending(t *testing.T) {
	const alice, bob, carol = 64021, 64022, 64023
	m := newMPSModel()
	m.serverStarted(20, alice)
	m.noteClients(map[uint32]int{}, map[string]uint32{"b1": bob}, false)
	if got := m.pending(false); got != nil {
		t.Errorf("alice's server idle: pending %v; want none (MPS ends it for bob)", got)
	}
	m.setUnleased(map[int][]int{20: {9200}})
	if got, want := m.pending(false), map[int][]string{20: {"b1"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("alice's server held by a client of no lease: pending %v; want %v", got, want)
	}
	m.setUnleased(nil)
	m.noteClients(map[uint32]int{alice: 2}, map[string]uint32{"c1": carol, "b1": bob, "a2": alice}, false)
	if got, want := m.pending(false), map[int][]string{20: {"b1", "c1"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("alice's server with leased clients: pending %v; want %v (alice's own lease waits for nobody)", got, want)
	}
	m.serverStarted(30, bob) // the switch's moment: bob's server starts
	if got, want := m.pending(false), map[int][]string{20: {"c1"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("bob's server up: pending %v; want %v", got, want)
	}
	m.serverExited(mps.Event{PID: 20}, nil, false)
	if got := m.pending(false); got != nil {
		t.Errorf("alice's server gone, bob's without counted clients: pending %v; want none", got)
	}
	shared := newMPSModel()
	shared.serverStarted(40, 0)
	shared.setUnleased(map[int][]int{40: {9400}})
	shared.noteClients(map[uint32]int{alice: 1}, map[string]uint32{"b1": bob}, true)
	if got := shared.pending(true); got != nil {
		t.Errorf("multiuser: pending %v; want none (one server serves every uid)", got)
	}
	m.daemonGone()
	if got := m.pending(false); got != nil {
		t.Errorf("after the daemon's end: pending %v; want none", got)
	}
}

// A server's fatal fault: MPS keeps it in FAULT, refusing new clients,
// while any client of the fault lives. The model holds it only where its
// recovery's revocation left clients no lease holds, and ends it once a
// reconciliation that began after the fault finds none of those (a client
// of no lease that came since is one MPS accepted: the FAULT was over);
// the server's exit and the daemon's end end it too.
func TestMPSModelFault(t *testing.T) {
	const alice = 64021
	m := newMPSModel()
	m.serverStarted(20, alice)
	if m.holdFault(20) {
		t.Fatal("held in FAULT with no client of no lease found: the revocation ended every client")
	}
	if m.holdFault(99) {
		t.Fatal("a server that is not live held in FAULT")
	}
	m.setUnleased(map[int][]int{20: {501}})
	before := m.faultMark() // a reconciliation under way as the fault came
	if !m.holdFault(20) {
		t.Fatal("not held in FAULT with a client of no lease left")
	}
	if got := m.inFault(); !slices.Equal(got, []int{20}) || !m.faulted() {
		t.Fatalf("in FAULT %v (faulted %v); want [20]", got, m.faulted())
	}
	if v := m.view(); len(v) != 1 || !v[0].fault {
		t.Fatalf("view %+v; want server 20 in FAULT", v)
	}
	seen := map[int]bool{20: true}
	if m.endFaults(faultEvidence{seen: seen, state: map[int]mps.ServerState{20: mps.StateActive}}, before) {
		t.Fatal("a reconciliation that began before the fault ended it")
	}
	after := m.faultMark()
	if m.endFaults(faultEvidence{unleased: map[int][]int{20: {501, 502}}, seen: seen}, after) {
		t.Fatal("FAULT ended while its client of no lease is left")
	}
	if m.endFaults(faultEvidence{}, after) {
		t.Fatal("FAULT ended by a reconciliation that could not read the server's clients")
	}
	if m.endFaults(faultEvidence{seen: seen, state: map[int]mps.ServerState{20: mps.StateFault}}, after) {
		t.Fatal("FAULT ended while the daemon reports the server in FAULT")
	}
	if !m.endFaults(faultEvidence{unleased: map[int][]int{20: {502}}, seen: seen}, after) || len(m.inFault()) != 0 || m.faulted() {
		t.Fatalf("FAULT not ended once its client has gone (502 came since: MPS accepted it): %v", m.inFault())
	}
	// The daemon's own word decides where it has one: a server it reports
	// ACTIVE is out of FAULT, whatever clients of no lease it has (they
	// came after the FAULT).
	m.setUnleased(map[int][]int{20: {502}})
	m.holdFault(20)
	if !m.endFaults(faultEvidence{unleased: map[int][]int{20: {502}}, seen: seen, state: map[int]mps.ServerState{20: mps.StateActive}}, m.faultMark()) || m.faulted() {
		t.Fatal("FAULT not ended by the daemon reporting the server ACTIVE")
	}
	m.holdFault(20)
	m.serverExited(mps.Event{PID: 20}, nil, false)
	if got := m.inFault(); len(got) != 0 {
		t.Fatalf("in FAULT after the server's exit: %v", got)
	}
	m.serverStarted(30, alice)
	m.setUnleased(map[int][]int{30: {503}})
	m.holdFault(30)
	m.daemonGone()
	if got := m.inFault(); len(got) != 0 {
		t.Fatalf("in FAULT after the daemon's end: %v", got)
	}
}
