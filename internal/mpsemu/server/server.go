package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/cstr"
	"github.com/mpsd/mpsd/internal/mpsemu/emuwire"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

// State is the server state get_server_status reports.
type State int

// Server states, as MPS names them.
const (
	Initializing State = iota
	Active
	Fault
)

func (s State) String() string {
	switch s {
	case Active:
		return "ACTIVE"
	case Fault:
		return "FAULT"
	}
	return "INITIALIZING"
}

// CUDA error numbers the server hands out.
const (
	ErrMemoryAllocation  = 2
	ErrIllegalAddress    = 700
	ErrConnectionFailed  = 805
	ErrServerNotReady    = 807
	ErrMaxClientsReached = 808
	ErrClientTerminated  = 810
)

type client struct {
	pid   int
	conn  *emuwire.Conn
	mem   []uint64 // limit per device
	used  []uint64
	order int
}

// Server is one emulated MPS server.
type Server struct {
	cfg Config

	mu        sync.Mutex
	state     State
	sm        float64
	pinned    []uint64
	multiuser bool
	clients   map[int]*client
	affected  map[int]bool
	seq       int
	shutdown  bool
	used      []uint64
	done      chan struct{} // closed when a requested shutdown completes
	doneOnce  sync.Once
	changed   chan struct{} // closed and replaced on every state change (tests)
	daemon    *emuwire.Conn
	conns     map[*emuwire.Conn]bool
}

// New returns a server for cfg; Run starts it.
func New(cfg Config) *Server {
	return &Server{
		cfg:      cfg,
		state:    Initializing,
		sm:       cfg.SM,
		pinned:   pinnedFor(cfg),
		clients:  map[int]*client{},
		affected: map[int]bool{},
		used:     make([]uint64, len(cfg.Devices)),
		done:     make(chan struct{}),
		changed:  make(chan struct{}),
		conns:    map[*emuwire.Conn]bool{},
	}
}

func pinnedFor(cfg Config) []uint64 {
	p := make([]uint64, len(cfg.Devices))
	copy(p, cfg.Pinned)
	return p
}

// logf writes a server.log line through the daemon's FIFO, as a real server
// does; without a daemon reading it the line is dropped. A standalone server
// writes none, like the stand-in servers tests give NVIDIA's daemon.
func (s *Server) logf(format string, args ...any) {
	if s.cfg.Standalone {
		return
	}
	_ = mpslog.SendFIFO(filepath.Join(s.cfg.PipeDir, "log"), mpslog.Record{
		Kind: mpslog.Other, PID: s.cfg.PID, Time: time.Now(), Msg: fmt.Sprintf(format, args...),
	})
}

// State returns the current state.
func (s *Server) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Changed returns a channel closed at the next state or client change.
func (s *Server) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// notifyLocked wakes Changed waiters; s.mu must be held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Clients returns the pids of the connected clients.
func (s *Server) Clients() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientPIDsLocked()
}

func (s *Server) clientPIDsLocked() []int {
	cs := make([]*client, 0, len(s.clients))
	for _, c := range s.clients {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].order < cs[j].order })
	pids := make([]int, len(cs))
	for i, c := range cs {
		pids[i] = c.pid
	}
	return pids
}

// Run serves until ctx ends (SIGINT/SIGTERM in the program) or a shutdown
// requested by the daemon completes. It returns nil on either.
func (s *Server) Run(ctx context.Context) error {
	ln, err := emuwire.Listen(emuwire.ServerSocket(s.cfg.PipeDir, s.cfg.PID))
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	listeners := []*net.UnixListener{ln}
	// Best effort: an orphaned older server may hold the shared name.
	if any, err := emuwire.Listen(emuwire.AnyServerSocket(s.cfg.PipeDir)); err == nil {
		listeners = append(listeners, any)
	}
	s.logf("Start")

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if d, err := s.dialDaemon(); err == nil {
		if err := s.register(d); err == nil {
			wg.Add(1)
			go func() { defer wg.Done(); s.serveDaemon(ctx, d) }()
		} else {
			d.Close()
			s.becomeActive()
		}
	} else {
		s.becomeActive()
	}
	s.logf("MPS Server is started")

	for _, l := range listeners {
		wg.Add(1)
		go func() { defer wg.Done(); s.accept(ctx, l, &wg) }()
	}
	select {
	case <-ctx.Done():
	case <-s.done:
	}
	cancel()
	for _, l := range listeners {
		l.Close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	if s.daemon != nil {
		s.daemon.Close()
	}
	s.mu.Unlock()
	wg.Wait()
	return nil
}

func (s *Server) dialDaemon() (*emuwire.Conn, error) {
	if s.cfg.Standalone {
		return nil, errStandalone
	}
	return emuwire.Dial(emuwire.DaemonSocket(s.cfg.PipeDir))
}

var errStandalone = errors.New("server: standalone, not registering")

func (s *Server) becomeActive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = Active
	s.notifyLocked()
}

// register announces the server to the emulated daemon and applies the
// defaults it sends back.
func (s *Server) register(d *emuwire.Conn) error {
	if err := d.Send(emuwire.Msg{Op: emuwire.OpServerHello, PID: s.cfg.PID}); err != nil {
		return err
	}
	m, err := d.Recv()
	if err != nil {
		return err
	}
	if m.Op != emuwire.OpConfig {
		return fmt.Errorf("server: daemon answered %q", m.Op)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.daemon = d
	if cstr.ValidPercent(m.SM) {
		s.sm = m.SM
	}
	for i := range s.pinned {
		if i < len(m.Pinned) {
			s.pinned[i] = m.Pinned[i]
		}
	}
	s.multiuser = m.Multiuser
	s.state = Active
	s.notifyLocked()
	if s.sm != 100 {
		s.logfLocked("activeThreadsPercentage set to %f", s.sm)
	}
	return nil
}

func (s *Server) logfLocked(format string, args ...any) { s.logf(format, args...) }

// serveDaemon answers the daemon's requests. A daemon that goes away (it
// was killed) leaves the server running with its clients, as with MPS.
func (s *Server) serveDaemon(ctx context.Context, d *emuwire.Conn) {
	for ctx.Err() == nil {
		m, err := d.Recv()
		if err != nil {
			return
		}
		reply := s.handleDaemon(m)
		reply.ID = m.ID
		if err := d.Send(reply); err != nil {
			return
		}
	}
}

func (s *Server) handleDaemon(m emuwire.Msg) emuwire.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := emuwire.Msg{Op: emuwire.OpOK}
	switch m.Op {
	case emuwire.OpStatus:
		ok.Text = s.state.String()
	case emuwire.OpClients, emuwire.OpDeviceList:
		ok.PIDs = s.clientPIDsLocked()
	case emuwire.OpGetSM:
		ok.SM = s.sm
	case emuwire.OpSetSM:
		if cstr.ValidPercent(m.SM) {
			s.sm = m.SM
			s.logfLocked("activeThreadsPercentage set to %f", s.sm)
		}
		ok.SM = s.sm
	case emuwire.OpGetPinned:
		if m.Dev < 0 || m.Dev >= len(s.pinned) {
			return emuwire.Msg{Op: emuwire.OpError, Err: 101}
		}
		ok.Bytes = s.pinned[m.Dev]
	case emuwire.OpSetPinned:
		if m.Dev < 0 || m.Dev >= len(s.pinned) {
			return emuwire.Msg{Op: emuwire.OpError, Err: 101}
		}
		s.pinned[m.Dev] = m.Bytes
	case emuwire.OpTerminate:
		c, found := s.clients[m.PID]
		if !found {
			return emuwire.Msg{Op: emuwire.OpError, Err: 1}
		}
		_ = c.conn.Send(emuwire.Msg{Op: emuwire.OpTerminated, Err: ErrClientTerminated})
		s.dropLocked(c)
		c.conn.Close()
	case emuwire.OpShutdown:
		s.shutdown = true
		s.maybeFinishLocked()
	default:
		return emuwire.Msg{Op: emuwire.OpError, Text: "unknown request " + m.Op}
	}
	return ok
}

func (s *Server) maybeFinishLocked() {
	if s.shutdown && len(s.clients) == 0 {
		s.doneOnce.Do(func() { close(s.done) })
	}
}

func (s *Server) accept(ctx context.Context, l *net.UnixListener, wg *sync.WaitGroup) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		conn := emuwire.NewConn(c)
		s.mu.Lock()
		if ctx.Err() != nil {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = true
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveClient(conn)
			s.mu.Lock()
			delete(s.conns, conn)
			s.mu.Unlock()
			conn.Close()
		}()
	}
}

// admit checks a new client against the server's state and limits.
func (s *Server) admit(conn *emuwire.Conn, hello emuwire.Msg) (*client, emuwire.Msg) {
	uid, err := conn.PeerUID()
	s.mu.Lock()
	defer s.mu.Unlock()
	refuse := func(code int, why string) (*client, emuwire.Msg) {
		return nil, emuwire.Msg{Op: emuwire.OpError, Err: code, Text: why}
	}
	switch {
	case err != nil:
		return refuse(ErrConnectionFailed, err.Error())
	case uid != s.cfg.UID && !s.multiuser:
		return refuse(ErrConnectionFailed, fmt.Sprintf("server runs as uid %d, client is uid %d", s.cfg.UID, uid))
	case s.shutdown:
		return refuse(ErrConnectionFailed, "server is shutting down")
	case s.state == Fault:
		return refuse(ErrServerNotReady, "server is recovering from a fatal fault")
	case len(s.clients) >= s.cfg.MaxClients:
		return refuse(ErrMaxClientsReached, fmt.Sprintf("%d clients per device", s.cfg.MaxClients))
	}
	sm := s.sm
	if p, n := cstr.Strtod(hello.EnvSM); hello.EnvSM != "" && n > 0 && cstr.ValidPercent(p) && p < sm {
		sm = p
	}
	own := ClientLimits(hello.EnvPinned, s.cfg.Devices)
	mem := make([]uint64, len(s.cfg.Devices))
	for i := range mem {
		mem[i] = s.cfg.DeviceMemory
		if s.pinned[i] > 0 && s.pinned[i] < mem[i] {
			mem[i] = s.pinned[i]
		}
		if own[i] > 0 && own[i] < mem[i] {
			mem[i] = own[i]
		}
	}
	s.seq++
	c := &client{pid: hello.PID, conn: conn, mem: mem, used: make([]uint64, len(mem)), order: s.seq}
	s.clients[c.pid] = c
	s.notifyLocked()
	s.logfLocked("Volta MPS Server: Received new client request")
	return c, emuwire.Msg{Op: emuwire.OpWelcome, ServerPID: s.cfg.PID, SM: sm, Mem: mem, UUIDs: s.cfg.Devices}
}

func (s *Server) serveClient(conn *emuwire.Conn) {
	hello, err := conn.Recv()
	if err != nil || hello.Op != emuwire.OpClientHello {
		return
	}
	c, reply := s.admit(conn, hello)
	if err := conn.Send(reply); err != nil || c == nil {
		if c != nil {
			s.disconnect(c)
		}
		return
	}
	defer s.disconnect(c)
	for {
		m, err := conn.Recv()
		if err != nil {
			return
		}
		switch m.Op {
		case emuwire.OpAlloc:
			_ = conn.Send(s.alloc(c, m))
		case emuwire.OpFault:
			s.fault(c)
		}
	}
}

func (s *Server) alloc(c *client, m emuwire.Msg) emuwire.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.Dev < 0 || m.Dev >= len(c.mem) {
		return emuwire.Msg{Op: emuwire.OpError, Err: 101, Text: "invalid device ordinal"}
	}
	if c.used[m.Dev]+m.Bytes > c.mem[m.Dev] || c.used[m.Dev]+m.Bytes < c.used[m.Dev] ||
		s.used[m.Dev]+m.Bytes > s.cfg.DeviceMemory {
		return emuwire.Msg{Op: emuwire.OpError, Err: ErrMemoryAllocation, Text: "out of memory"}
	}
	c.used[m.Dev] += m.Bytes
	s.used[m.Dev] += m.Bytes
	return emuwire.Msg{Op: emuwire.OpOK}
}

// fault handles a fatal fault raised by client c: MPS on Volta and newer
// reports it to every client of the server and refuses new clients until
// all of them have gone.
func (s *Server) fault(c *client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == Fault {
		return
	}
	s.state = Fault
	s.logfLocked("Volta MPS: fatal exception from client %d, server state is FAULT", c.pid)
	for pid, other := range s.clients {
		s.affected[pid] = true
		_ = other.conn.Send(emuwire.Msg{Op: emuwire.OpFault, Err: ErrIllegalAddress})
	}
	s.notifyLocked()
}

func (s *Server) disconnect(c *client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clients[c.pid] != c {
		return
	}
	s.dropLocked(c)
}

func (s *Server) dropLocked(c *client) {
	delete(s.clients, c.pid)
	for i, u := range c.used {
		s.used[i] -= u
	}
	c.used = make([]uint64, len(c.used))
	s.logfLocked("Volta MPS: Client disconnected. Number of active client contexts is %d", len(s.clients))
	if s.affected[c.pid] {
		delete(s.affected, c.pid)
		if s.state == Fault && len(s.affected) == 0 {
			s.state = Active
			s.logfLocked("Volta MPS: all faulted clients exited, server state is ACTIVE")
		}
	}
	s.notifyLocked()
	s.maybeFinishLocked()
}
