package mpsd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/mps"
)

// The simulation's OS edges (sim_test.go): lease cgroups, the control
// daemon's client commands and the processes mpsd looks up by pid, over
// the simulated processes. mpsd's own code runs on them: a revocation's
// kill (revoke, killLease), a release's (release), an attach, and the
// facts that confirm a culprit a server's log names (culprithint.go).
//
// revoke kills its victims' cgroups in goroutines of its own; the kills
// are recorded here and the world applies them once revoke has returned,
// in pid order (simWorld.applyKills), so that a seed replays.

// simCgroups is the simulation's cgroup.Manager: a lease's cgroup is the
// set of its processes alive.
type simCgroups struct {
	mu     sync.Mutex
	groups map[cgroup.LeaseID]*simCgroup
	// killed: the pids a Kill or a terminate_client ended, not yet
	// applied to the world.
	killed []int
}

var _ cgroup.Manager = (*simCgroups)(nil)

func newSimCgroups() *simCgroups { return &simCgroups{groups: map[cgroup.LeaseID]*simCgroup{}} }

func (m *simCgroups) Create(id cgroup.LeaseID, _ cgroup.Limits) (cgroup.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.groups[id]; ok {
		return nil, fmt.Errorf("sim cgroup %s: %w", id, cgroup.ErrExist)
	}
	g := &simCgroup{m: m, id: id, pids: map[int]bool{}}
	m.groups[id] = g
	return g, nil
}

func (m *simCgroups) Open(id cgroup.LeaseID) (cgroup.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if g, ok := m.groups[id]; ok {
		return g, nil
	}
	return nil, fmt.Errorf("sim cgroup %s: %w", id, cgroup.ErrNotExist)
}

func (m *simCgroups) List() ([]cgroup.LeaseID, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.SortedFunc(maps.Keys(m.groups), func(a, b cgroup.LeaseID) int {
		return cmpStrings(a.String(), b.String())
	}), nil
}

func (m *simCgroups) Unowned() ([]string, error) { return nil, nil }

// exited: process pid ended by itself (or with its server); it leaves its
// cgroup.
func (m *simCgroups) exited(pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.groups {
		delete(g.pids, pid)
	}
}

// kill records pids as killed and takes them out of their cgroups.
func (m *simCgroups) killLocked(pids ...int) {
	m.killed = append(m.killed, pids...)
	for _, g := range m.groups {
		for _, pid := range pids {
			delete(g.pids, pid)
		}
	}
}

// takeKilled is the pids killed since the last call, sorted, each once.
func (m *simCgroups) takeKilled() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := slices.Compact(slices.Sorted(slices.Values(m.killed)))
	m.killed = nil
	return k
}

type simCgroup struct {
	m    *simCgroups
	id   cgroup.LeaseID
	pids map[int]bool // guarded by m.mu
}

func (g *simCgroup) ID() cgroup.LeaseID { return g.id }
func (g *simCgroup) Path() string       { return "sim/" + g.id.String() }

func (g *simCgroup) Attach(pid int) error {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	if g.m.groups[g.id] != g {
		return fmt.Errorf("sim cgroup %s: %w", g.id, cgroup.ErrNotExist)
	}
	g.pids[pid] = true
	return nil
}

func (g *simCgroup) Start(*exec.Cmd) error {
	return errors.New("the simulation starts no command")
}

func (g *simCgroup) Pids() ([]int, error) {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	return slices.Sorted(maps.Keys(g.pids)), nil
}

func (g *simCgroup) Kill(context.Context) error {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	g.m.killLocked(slices.Sorted(maps.Keys(g.pids))...)
	return nil
}

// Signal ends the processes as a kill does: the simulation's workloads
// do not trap signals.
func (g *simCgroup) Signal(unix.Signal) (int, error) {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	n := len(g.pids)
	g.m.killLocked(slices.Sorted(maps.Keys(g.pids))...)
	return n, nil
}

func (g *simCgroup) Delete() error {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	if len(g.pids) > 0 {
		return fmt.Errorf("sim cgroup %s: %w", g.id, cgroup.ErrNotEmpty)
	}
	if g.m.groups[g.id] == g {
		delete(g.m.groups, g.id)
	}
	return nil
}

func (g *simCgroup) Stats() (cgroup.Stats, error)   { return cgroup.Stats{}, nil }
func (g *simCgroup) Limits() (cgroup.Limits, error) { return cgroup.Limits{}, nil }

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// simControl is an instance's control daemon in the simulation: MPS's
// client list and terminate_client over the simulated servers (what a
// revocation asks of it); the rest is fakeControl's. A hung one answers
// nothing.
type simControl struct {
	*fakeControl
	si   *simInst
	hung bool
}

func (c *simControl) ClientList(ctx context.Context, server int) ([]int, error) {
	if c.hung {
		return nil, context.DeadlineExceeded
	}
	sv := c.si.servers[server]
	if sv == nil {
		return nil, fmt.Errorf("server %d: %w", server, mps.ErrServerNotFound)
	}
	return slices.Sorted(maps.Keys(sv.clients)), nil
}

// ReportedServerStatus is MPS's get_server_status (550 and newer): FAULT
// while a server holds clients of its fault.
func (c *simControl) ReportedServerStatus(_ context.Context, pid int) (mps.ServerState, error) {
	if c.hung {
		return mps.StateUnknown, context.DeadlineExceeded
	}
	sv := c.si.servers[pid]
	switch {
	case sv == nil:
		return mps.StateUnknown, fmt.Errorf("server %d: %w", pid, mps.ErrServerNotFound)
	case sv.faulted:
		return mps.StateFault, nil
	}
	return mps.StateActive, nil
}

func (c *simControl) TerminateClient(_ context.Context, server, client int) error {
	if c.hung {
		return context.DeadlineExceeded
	}
	sv := c.si.servers[server]
	if sv == nil || sv.clients[client] == nil {
		return fmt.Errorf("client %d of server %d: %w", client, server, mps.ErrServerNotFound)
	}
	m := c.si.w.cgs
	m.mu.Lock()
	m.killLocked(client)
	m.mu.Unlock()
	return nil
}

// simProcs is the simulation's processes (processes.go): each simulated
// client is a process from its start until it ends; pids are never taken
// again. A process ends only at a step of the world, so exitsWithin says
// what it is now.
type simProcs struct{ w *simWorld }

// simProc is one process's record: its start time (clock ticks after the
// simulation's boot) and whether it has ended.
type simProc struct {
	start uint64
	ended bool
	lease string // the lease whose command started it ("": none)
}

func (p simProcs) open(pid int) (process, error) {
	r := p.w.procs[pid]
	if r == nil || r.ended {
		return nil, fmt.Errorf("pidfd_open %d: no such process", pid)
	}
	return simProcHandle{r}, nil
}

func (p simProcs) bootTicks() (uint64, error) { return p.w.ticks(), nil }

type simProcHandle struct{ r *simProc }

func (h simProcHandle) startTime() uint64              { return h.r.start }
func (h simProcHandle) alive() bool                    { return !h.r.ended }
func (h simProcHandle) exitsWithin(time.Duration) bool { return h.r.ended }
func (h simProcHandle) close()                         {}
