package mpsd

import (
	"maps"
	"slices"
	"sync"

	"github.com/mpsd/mpsd/mps"
)

// mpsModel is what MPS itself is doing on one instance, as far as mpsd
// can know it: the control daemon's verified servers and their uids, the
// servers mpsd shut down itself, each server's clients as the last
// reconciliation counted them, those of leases and those no lease holds
// (its unleased findings), and the leases whose clients MPS makes wait
// behind another uid's server (pending). From it mpsd decides what a
// server's exit means (exitVerdict) and whose server MPS serves now, which
// placement must respect (serving). It has a lock of its own, which each
// method holds while it runs: it does no I/O and calls nothing outside
// it, so it may be taken under Daemon.mu (the order is Daemon.mu, then
// the model's; the methods given the instance's leases read them under
// Daemon.mu, which their callers hold). Its fields are its own: the rest
// of mpsd asks and tells it through its methods.
//
// MPS's rules it follows (docs/architecture.md, "The MPS model"): a
// control daemon without -multiuser-server runs servers of one uid at a
// time; a client of another uid waits inside MPS (its CUDA initialisation
// blocks) until every client of the current server has gone, then MPS ends
// that server (exit status 0) and starts one for the waiting uid. MPS never
// ends a server that has clients; a server that crashed exits by a signal
// or with a status other than 0.
type mpsModel struct {
	mu sync.Mutex
	// servers: the live verified servers, by pid: their uid (-1 unknown).
	servers map[int]int
	// shutDown: servers a recovery stopped itself (restartServer), by
	// pid; the channel is closed when their exit is seen. Their exit is
	// no fault, whatever leases the instance has taken since.
	shutDown map[int]chan struct{}
	// unleased: clients of a server that no lease holds, by server pid
	// (their pids, sorted), as the last reconciliation confirmed them
	// (reconcile.go). While a server of one uid has any, MPS makes every
	// other uid wait.
	unleased map[int][]int
	// leased: the running leases' MPS clients each server serves, by
	// server pid, as the last reconciliation counted them (noteClients).
	leased map[int]int
	// noClient: the running leases that the last reconciliation counted
	// no MPS client of (noteClients), by lease id: their uid. One whose
	// uid has no live server while another uid's server has clients is
	// pending: MPS makes its clients wait (pending).
	noClient map[string]uint32
	// caps: what mpsd last set on each server, or found it to allow
	// (caps.go); absent, a new server, which starts with the group's.
	caps map[int]serverCaps
	// defaults: what mpsd last set as the daemon's defaults, which a new
	// server starts with; nil: the group's caps, set at the daemon's start.
	defaults *serverCaps
	// defaultsSet is closed once the daemon holds defaults (set by a
	// grant, caps.go); nil when no setting is under way. Grants that
	// need the same defaults meanwhile wait on it instead of setting
	// them again.
	defaultsSet chan struct{}
	// crashedUnhandled: servers whose crash mpsd saw as it stopped, too
	// late to recover from it, by pid: their uid. They stay in the server
	// list the state file keeps (saved), so the next mpsd finds them gone
	// and revokes their leases (lostWhileAway).
	crashedUnhandled map[int]int
	// faults: live servers MPS holds in FAULT after a fatal fault of a
	// client (refusing every new client while any client of the fault
	// lives), by pid. A fault's recovery revokes the leases; the clients
	// no lease holds keep the server in FAULT until a reconciliation that
	// began after it finds none of them (endFaults).
	faults   map[int]faultHold
	faultSeq uint64
}

// faultHold is a server held in FAULT: the fault's number (faultSeq when
// it was held) and the clients of no lease it had then (pids, sorted).
type faultHold struct {
	seq     uint64
	clients []int
}

func newMPSModel() *mpsModel { return &mpsModel{servers: map[int]int{}} }

// pids are the live servers' pids, sorted.
func (m *mpsModel) pids() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.servers))
}

// serverStarted records a verified server (a new incarnation, if pid was
// a server's before).
func (m *mpsModel) serverStarted(pid, uid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.servers[pid] = uid
	delete(m.crashedUnhandled, pid)
	delete(m.shutDown, pid)
	delete(m.unleased, pid)
	delete(m.leased, pid)
	delete(m.caps, pid)
	delete(m.faults, pid)
}

// noteCaps records what a live server allows, as mpsd set or found it.
func (m *mpsModel) noteCaps(pid int, c serverCaps) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, live := m.servers[pid]; !live {
		return
	}
	if m.caps == nil {
		m.caps = map[int]serverCaps{}
	}
	m.caps[pid] = c
}

// daemonGone forgets every server: they went with their control daemon
// (or mpsd stopped it).
func (m *mpsModel) daemonGone() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.servers)
	clear(m.crashedUnhandled)
	clear(m.unleased)
	clear(m.leased)
	clear(m.noClient)
	clear(m.caps)
	clear(m.faults)
	m.defaults, m.defaultsSet = nil, nil
}

// shuttingDown marks a live server as one mpsd is stopping itself and
// returns the channel closed when its exit is seen; nil when pid is no
// live server.
func (m *mpsModel) shuttingDown(pid int) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, live := m.servers[pid]; !live {
		return nil
	}
	if done := m.shutDown[pid]; done != nil {
		return done
	}
	if m.shutDown == nil {
		m.shutDown = map[int]chan struct{}{}
	}
	done := make(chan struct{})
	m.shutDown[pid] = done
	return done
}

// holdFault records the end of a fatal fault's recovery on live server
// pid, whose leases it revoked: MPS keeps a server in FAULT, refusing new
// clients, until every client it had at the fault has gone. held reports
// whether the last reconciliation found clients of it that no lease holds
// (no revocation ends them): the server is then held in FAULT, and nothing
// is placed on the instance, until a reconciliation that began after now
// finds none of them (endFaults; a client of no lease that came since is
// one MPS accepted, after the FAULT). Without them the revocation ended
// every client of the fault.
func (m *mpsModel) holdFault(pid int) (held bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, live := m.servers[pid]; !live || len(m.unleased[pid]) == 0 {
		return false
	}
	if m.faults == nil {
		m.faults = map[int]faultHold{}
	}
	m.faultSeq++
	m.faults[pid] = faultHold{seq: m.faultSeq, clients: slices.Clone(m.unleased[pid])}
	return true
}

// faultMark is taken as a reconciliation begins: the faults held by then
// are those whose end it can see (endFaults).
func (m *mpsModel) faultMark() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.faultSeq
}

// faultEvidence is what a reconciliation saw of the servers held in FAULT
// (endFaults).
type faultEvidence struct {
	// unleased: the clients of no lease it confirmed, by server pid;
	// seen: the servers whose clients it saw (their list read, or NVML's
	// showing every MPS client leased).
	unleased map[int][]int
	seen     map[int]bool
	// state: what the control daemon's get_server_status reported of a
	// held server (550 and newer; 535 has no such command), by pid.
	state map[int]mps.ServerState
}

// endFaults ends the FAULT of each server held at or before mark, as a
// reconciliation which began at mark saw it: where the control daemon
// reported the server's state, by that state (anything but FAULT ends
// it: MPS serves again); otherwise once it saw the server's clients and
// found none of the fault's. It reports whether one ended.
func (m *mpsModel) endFaults(ev faultEvidence, mark uint64) (ended bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for pid, h := range m.faults {
		if h.seq > mark {
			continue
		}
		over := false
		if st, ok := ev.state[pid]; ok {
			over = st != mps.StateFault
		} else {
			over = ev.seen[pid] && !slices.ContainsFunc(h.clients, func(c int) bool { return slices.Contains(ev.unleased[pid], c) })
		}
		if over {
			delete(m.faults, pid)
			ended = true
		}
	}
	return ended
}

// faulted reports whether a server is held in FAULT (placement's view:
// nothing is placed meanwhile).
func (m *mpsModel) faulted() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.faults) > 0
}

// inFault lists the servers held in FAULT, sorted.
func (m *mpsModel) inFault() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.faults))
}

// setUnleased records what a reconciliation confirmed: the unleased
// clients of each server it listed (their pids).
func (m *mpsModel) setUnleased(byServer map[int][]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unleased = map[int][]int{}
	for pid, cs := range byServer {
		if len(cs) > 0 {
			m.unleased[pid] = slices.Sorted(slices.Values(cs))
		}
	}
}

// noteClients records the running leases' MPS clients a reconciliation
// counted, by the leases' uid, as clients of the servers that serve them
// by MPS's rules: a shared (multiuser) daemon's one server serves every
// uid; otherwise each uid has a server of its own (the lowest pid, in the
// moment of a switch when two live). Clients of a uid without a live
// server wait inside MPS for one (pending): they are no server's.
// noClient are the running leases it counted no client of, by id: their
// uid (pending).
func (m *mpsModel) noteClients(byUID map[uint32]int, noClient map[string]uint32, multiuser bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.noClient = noClient
	m.leased = map[int]int{}
	for uid, n := range byUID {
		if n <= 0 {
			continue
		}
		best := 0
		for pid, u := range m.servers {
			if (multiuser || u == int(uid)) && (best == 0 || pid < best) {
				best = pid
			}
		}
		if best != 0 {
			m.leased[best] += n
		}
	}
}

// serverView is one live server as the model holds it.
type serverView struct {
	pid, uid         int
	leased, unleased int
	fault            bool // held in FAULT (holdFault)
}

// view lists the live servers, by pid.
func (m *mpsModel) view() []serverView {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]serverView, 0, len(m.servers))
	for _, pid := range slices.Sorted(maps.Keys(m.servers)) {
		_, fault := m.faults[pid]
		out = append(out, serverView{pid: pid, uid: m.servers[pid], leased: m.leased[pid], unleased: len(m.unleased[pid]), fault: fault})
	}
	return out
}

// pending lists, by the pid of the server they wait behind, the running
// leases whose clients MPS makes wait (MPS's pending list): on a daemon
// without multiuser, a lease the last reconciliation counted no MPS
// client of, whose uid has no live server while a server of another uid
// has clients (leased or not). MPS starts no server for their uid until
// those clients have gone, so their processes that reach CUDA wait inside
// it (one that has not reached CUDA yet will wait once it does). MPS
// lists no pending client (its client lists are its servers'; NVML shows
// a client once its server runs), and its log line of one is anyone's to
// write, so the model infers them by MPS's rule. Each list is sorted; nil
// when nobody waits, and on a daemon that shares one server among uids
// (multiuser).
func (m *mpsModel) pending(multiuser bool) map[int][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if multiuser || len(m.noClient) == 0 {
		return nil
	}
	served := map[int]bool{} // the uids with a live server
	behind := 0              // the lowest pid of a server with clients
	for pid, u := range m.servers {
		served[u] = true
		if u >= 0 && m.leased[pid]+len(m.unleased[pid]) > 0 && (behind == 0 || pid < behind) {
			behind = pid
		}
	}
	if behind == 0 {
		return nil
	}
	var out map[int][]string
	for id, uid := range m.noClient {
		if served[int(uid)] {
			continue
		}
		if out == nil {
			out = map[int][]string{}
		}
		out[behind] = append(out[behind], id)
	}
	for _, ids := range out {
		slices.Sort(ids)
	}
	return out
}

// held reports whether a live server has clients no lease holds.
func (m *mpsModel) held() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for pid, cs := range m.unleased {
		if _, live := m.servers[pid]; live && len(cs) > 0 {
			return true
		}
	}
	return false
}

// exitKind is what a server's exit means, by MPS's rules.
type exitKind uint8

const (
	// exitShutDown: mpsd stopped it itself; its clients were revoked first.
	exitShutDown exitKind = iota
	// exitNoClients: no lease on the instance can have been its client
	// (none of its uid, or none at all).
	exitNoClients
	// exitClean: it exited with status 0, as MPS ends a server whose
	// clients are gone (a uid switch, quit): no fault (exitVerdict.victims).
	exitClean
	// exitCrash: killed by a signal, a status other than 0, or a status
	// mpsd could not read: its clients went with it.
	exitCrash
)

var exitKindNames = [...]string{"shut down by mpsd", "no client", "clean", "crash"}

func (k exitKind) String() string { return exitKindNames[k] }

// exitVerdict is serverExited's decision: the kind of exit and the
// leases that could have been the server's clients.
type exitVerdict struct {
	kind exitKind
	uid  int // the server's uid, -1 unknown
	// candidates: the running leases that could be its clients: those of
	// its uid (every one when the server is shared or its uid unknown).
	candidates []*lease
}

// serverExited forgets an exited server and says what its exit means.
// leases are the instance's; multiuser says the daemon shares one server
// among uids. ev is the exit as the server's pidfd told it.
func (m *mpsModel) serverExited(ev mps.Event, leases map[string]*lease, multiuser bool) exitVerdict {
	m.mu.Lock()
	defer m.mu.Unlock()
	uid, known := m.servers[ev.PID]
	if !known {
		uid = -1
	}
	delete(m.servers, ev.PID)
	delete(m.unleased, ev.PID)
	delete(m.leased, ev.PID)
	delete(m.caps, ev.PID)
	delete(m.faults, ev.PID)
	v := exitVerdict{uid: uid}
	if done, ours := m.shutDown[ev.PID]; ours {
		delete(m.shutDown, ev.PID)
		close(done)
		v.kind = exitShutDown
		return v
	}
	for _, l := range leases {
		if l.state == leaseRunning && (multiuser || uid < 0 || l.uid == uint32(uid)) {
			v.candidates = append(v.candidates, l)
		}
	}
	slices.SortFunc(v.candidates, func(a, b *lease) int { return int(a.req.Seq - b.req.Seq) })
	switch {
	case len(v.candidates) == 0:
		v.kind = exitNoClients
	case ev.Signal == 0 && ev.ExitStatus == 0:
		v.kind = exitClean
	default:
		v.kind = exitCrash
	}
	return v
}

// victims are the leases a server's exit took down: every candidate of a
// crash, and none of any other exit. A clean exit (status 0, read from the
// server's pidfd) is MPS's own: a server exits so once its last client has
// gone after it was asked to (a uid switch, quit), or on SIGINT, which only
// its own uid or root can send (shutdown_server -f, quit -t; mpsd's are
// exitShutDown). A candidate that still runs a process was then no client
// of it: a process that has not reached CUDA yet (an inference server
// loading its model) waits inside MPS for the next server of its uid. A
// tenant who stops its own server ends its own clients, whose commands say
// so. (mpsd's simulation found the alternative, "a clean exit with a live
// candidate is a crash", revoking a lease whose process had not yet
// connected when a member's unleased client made MPS switch uids.)
func (v exitVerdict) victims() []*lease {
	if v.kind == exitCrash {
		return v.candidates
	}
	return nil
}

// serving says whose server MPS serves on the instance now, as placement
// must see it (policy.Instance's ServerUp, ServerUID, ServerHeld and
// ServerContested): that of a server with clients no lease holds, if any
// (held: MPS makes every other uid wait behind them; contested when placed
// leases of another uid wait too: then nobody new is placed); else the uid
// of the placed leases (placedUID, when placed: admission keeps them to
// one uid on a daemon that is not multiuser; the earliest placed's when
// they are of several, instance.placedUID); else that of an idle server,
// which MPS ends for a client of another uid. (mpsd's simulation found the
// running leases' uid taken first: another lease of that uid was granted,
// and waited inside MPS, behind an unleased holder mpsd knew of; and with
// the holder's uid taken alone, a lease of the holder's uid was granted
// and waited behind the leased clients.)
func (m *mpsModel) serving(placedUID uint32, placed bool) (up bool, uid uint32, held, contested bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// The lowest pid of a kind, so that the answer does not depend on
	// the map's order (MPS runs one server at a time; two are a moment
	// of a switch).
	heldPID, idlePID := 0, 0
	for pid, u := range m.servers {
		switch {
		case u < 0:
		case len(m.unleased[pid]) > 0:
			if heldPID == 0 || pid < heldPID {
				heldPID = pid
			}
		case idlePID == 0 || pid < idlePID:
			idlePID = pid
		}
	}
	if heldPID != 0 {
		uid := uint32(m.servers[heldPID])
		return true, uid, true, placed && placedUID != uid
	}
	if placed {
		return true, placedUID, false, false
	}
	if idlePID != 0 {
		return true, uint32(m.servers[idlePID]), false, false
	}
	return false, 0, false, false
}

// The model's fields are its own: the rest of mpsd asks and tells it
// through these methods, never reading or writing a field
// (TestMPSModelFieldsAreItsOwn).

// serverUIDs is a copy of the live servers' uids, by pid.
func (m *mpsModel) serverUIDs() map[int]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.servers)
}

// crashUnhandled records that the crash of server pid (of uid) was seen
// while mpsd stopped, and left to the next mpsd.
func (m *mpsModel) crashUnhandled(pid, uid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashedUnhandled == nil {
		m.crashedUnhandled = map[int]int{}
	}
	m.crashedUnhandled[pid] = uid
}

// saved is the server list the state file keeps, by pid: their uid. The
// live servers, and those whose crash is left to the next mpsd, which
// finds them gone (lostWhileAway); nil when there is none.
func (m *mpsModel) saved() map[int]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.servers) == 0 && len(m.crashedUnhandled) == 0 {
		return nil
	}
	s := maps.Clone(m.servers)
	if s == nil {
		s = map[int]int{}
	}
	maps.Copy(s, m.crashedUnhandled)
	return s
}

// uidOf is the live server pid's uid (-1 unknown); false if pid is no
// live server.
func (m *mpsModel) uidOf(pid int) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	uid, live := m.servers[pid]
	return uid, live
}

// capsOf is what mpsd last set on, or found a live server pid to allow;
// false if nothing is known (a new server starts with the defaults).
func (m *mpsModel) capsOf(pid int) (serverCaps, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.caps[pid]
	return c, ok
}

// newServerCaps is what a server the daemon starts now allows: the
// defaults mpsd last set (or is setting), else group, the caps the
// daemon started with.
func (m *mpsModel) newServerCaps(group serverCaps) serverCaps {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.defaults != nil {
		return *m.defaults
	}
	return group
}

// defaultsInFlight is the channel closed once the defaults being set now
// are held, nil when no setting is under way.
func (m *mpsModel) defaultsInFlight() chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.defaultsSet
}

// defaultsHold reports whether the daemon's defaults, as mpsd last set
// them, allow at least want.
func (m *mpsModel) defaultsHold(want serverCaps) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.defaults != nil && m.defaults.sm >= want.sm && m.defaults.mem >= want.mem
}

// defaultsSetting is a setting of the daemon's defaults under way
// (beginDefaults): what they were before, and its channel.
type defaultsSetting struct {
	prev *serverCaps
	done chan struct{}
}

// beginDefaults records want as the daemon's defaults now, before the
// command that sets them runs, so that grants needing the same wait on
// the setting instead of setting them again.
func (m *mpsModel) beginDefaults(want serverCaps) defaultsSetting {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := defaultsSetting{prev: m.defaults, done: make(chan struct{})}
	m.defaults, m.defaultsSet = &want, s.done
	return s
}

// defaultsTarget is the newest defaults decided (a later grant may have
// raised them while an earlier setting waited); nil: the group's.
func (m *mpsModel) defaultsTarget() *serverCaps {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.defaults
}

// endDefaults ends setting s, which set target (err: it failed, and the
// defaults fall back to what they were, unless a later decision replaced
// them). The caller closes s.done.
func (m *mpsModel) endDefaults(s defaultsSetting, target *serverCaps, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.defaultsSet == s.done {
		m.defaultsSet = nil
	}
	if err != nil && m.defaults == target {
		m.defaults = s.prev // the next grant tries again
	}
}
