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
	"github.com/mpsd/mpsd/internal/mpsemu/mpssched"
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
	ErrNoDevice          = 100
	ErrIllegalAddress    = 700
	ErrConnectionFailed  = 805
	ErrServerNotReady    = 807
	ErrMaxClientsReached = 808
	ErrClientTerminated  = 810
)

type client struct {
	pid   int
	conn  *emuwire.Conn
	devs  []int    // the server's devices the client sees, in its order
	mem   []uint64 // limit per device of devs
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
	priority  int
	// contextsGone: the contexts were destroyed after a fault and are
	// created again for the next client.
	contextsGone bool
	// resetGen counts faults, so a device-reset timer of an older one
	// changes nothing.
	resetGen int
	clients  map[int]*client
	affected map[int]bool
	seq      int
	shutdown bool
	used     []uint64
	done     chan struct{} // closed when a requested shutdown completes
	doneOnce sync.Once
	changed  chan struct{} // closed and replaced on every state change (tests)
	daemon   *emuwire.Conn
	conns    map[*emuwire.Conn]bool
}

// New returns a server for cfg; Run starts it.
func New(cfg Config) *Server {
	return &Server{
		cfg:      cfg,
		state:    Initializing,
		sm:       cfg.SM,
		priority: cfg.Priority,
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

// DeviceName is the name the emulated GPUs carry in server.log, where a
// real server names the card ("NVIDIA H200").
const DeviceName = "MPS Emulated GPU"

// logf writes a server.log line through the daemon's FIFO, as a real server
// does; without a daemon reading it the line is dropped. A standalone server
// writes none, like the stand-in servers tests give NVIDIA's daemon. The
// messages are those a real server wrote on an H200 (docs/gpu-probe): the
// start-up lines as "Other", everything after as "Server".
func (s *Server) logf(format string, args ...any) { s.logKind(mpslog.Server, format, args...) }

func (s *Server) logOther(format string, args ...any) { s.logKind(mpslog.Other, format, args...) }

func (s *Server) logKind(kind mpslog.Kind, format string, args ...any) {
	if s.cfg.Standalone {
		return
	}
	_ = mpslog.SendFIFO(filepath.Join(s.cfg.PipeDir, "log"), mpslog.Record{
		Kind: kind, PID: s.cfg.PID, Time: time.Now(), Msg: fmt.Sprintf(format, args...),
	})
}

// logContextsLocked logs the creation or destruction of the per-device
// server contexts (verb "Creating" or "Destroy", as MPS writes them).
func (s *Server) logContextsLocked(verb string) {
	for i := range s.cfg.Devices {
		s.logfLocked("%s server context on device %d (%s)", verb, i, DeviceName)
	}
}

// logStartedLocked logs the limits the server runs with and that it has
// started, in a real server's words and order.
func (s *Server) logStartedLocked() {
	s.logContextsLocked("Creating")
	if s.cfg.BinaryVersion != 0 {
		// A 580 server on an H200 (docs/gpu-probe); the region's name
		// carries the server's uid (0 there) and pid.
		s.logfLocked("Created anonymous shared memory region mps.shm.%d.%d", s.cfg.UID, s.cfg.PID)
		s.logfLocked("CUDA MPS Server for Linux/Unix. Binary version: %d", s.cfg.BinaryVersion)
		s.logfLocked("Display Driver version: %d", s.cfg.DriverMajor)
	}
	if s.sm != 100 {
		s.logfLocked("Active Threads Percentage set to %.1f", s.sm)
	}
	for i, b := range s.pinned {
		if b > 0 {
			s.logfLocked("Device pinned memory limit for device %d set to %#x bytes", i, b)
		}
	}
	s.logfLocked("Server Priority set to %d", s.priority)
	s.logfLocked("Server has started")
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
	s.logOther("Startup")
	s.logOther("Connecting to control daemon on socket: %s", filepath.Join(s.cfg.PipeDir, "control"))
	s.logOther("Initializing server process")

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
	s.mu.Lock()
	s.logStartedLocked()
	s.mu.Unlock()

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
	s.priority = m.Priority
	s.state = Active
	s.notifyLocked()
	s.reportProcsLocked()
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
			s.logfLocked("Active Threads Percentage set to %.1f", s.sm)
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
		if !s.shutdown {
			s.logfLocked("Server has been notified to shutdown")
			if len(s.clients) > 0 {
				s.logfLocked("Waiting for current clients to finish")
			}
		}
		s.shutdown = true
		s.maybeFinishLocked()
	default:
		return emuwire.Msg{Op: emuwire.OpError, Text: "unknown request " + m.Op}
	}
	return ok
}

func (s *Server) maybeFinishLocked() {
	if mpssched.ExitsWhenIdle(s.shutdown, len(s.clients)) {
		s.doneOnce.Do(func() {
			s.logfLocked("Exiting")
			close(s.done)
		})
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
	devs := ClientDevices(hello.EnvVisible, hello.HasVisible, s.cfg.Devices)
	if len(devs) == 0 {
		return refuse(ErrNoDevice, "CUDA_VISIBLE_DEVICES selects none of the server's devices")
	}
	uuids := make([]string, len(devs))
	for i, d := range devs {
		uuids[i] = s.cfg.Devices[d]
	}
	own := ClientLimits(hello.EnvPinned, uuids)
	mem := make([]uint64, len(devs))
	for i, d := range devs {
		mem[i] = s.cfg.DeviceMemory
		if s.pinned[d] > 0 && s.pinned[d] < mem[i] {
			mem[i] = s.pinned[d]
		}
		if own[i] > 0 && own[i] < mem[i] {
			mem[i] = own[i]
		}
	}
	s.seq++
	c := &client{pid: hello.PID, conn: conn, devs: devs, mem: mem, used: make([]uint64, len(mem)), order: s.seq}
	s.clients[c.pid] = c
	s.notifyLocked()
	s.reportProcsLocked()
	if s.contextsGone {
		s.contextsGone = false
		s.logContextsLocked("Creating")
	}
	// A CUDA process opens two contexts on the server (MPS logs both).
	s.logfLocked("Client {PID: %d, Context ID: 0} connected", c.pid)
	s.logfLocked("Creating worker thread for client {PID: %d, Context ID: 0}", c.pid)
	s.logfLocked("Received new client request for {PID: %d, Context ID: 0}", c.pid)
	s.logfLocked("Client {PID: %d, Context ID: 1} connected", c.pid)
	s.logfLocked("Creating worker thread for client {PID: %d, Context ID: 1}", c.pid)
	for _, uuid := range uuids {
		s.logfLocked("Device %s (uuid %s) is associated", DeviceName, uuid)
	}
	s.logfLocked("Status of client {PID: %d, Context ID: 1} is ACTIVE", c.pid)
	return c, emuwire.Msg{Op: emuwire.OpWelcome, ServerPID: s.cfg.PID, SM: sm, Mem: mem, UUIDs: uuids}
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
	d := c.devs[m.Dev]
	if c.used[m.Dev]+m.Bytes > c.mem[m.Dev] || c.used[m.Dev]+m.Bytes < c.used[m.Dev] ||
		s.used[d]+m.Bytes > s.cfg.DeviceMemory {
		return emuwire.Msg{Op: emuwire.OpError, Err: ErrMemoryAllocation, Text: "out of memory"}
	}
	c.used[m.Dev] += m.Bytes
	s.used[d] += m.Bytes
	s.reportProcsLocked()
	return emuwire.Msg{Op: emuwire.OpOK}
}

// reportProcsLocked tells the daemon, per device, which clients the server
// has and what each has allocated there, as the driver knows it and NVML
// reports it; the emulated daemon passes it on to the simulated GPUs.
func (s *Server) reportProcsLocked() {
	if s.daemon == nil {
		return
	}
	pids := s.clientPIDsLocked()
	for i, uuid := range s.cfg.Devices {
		mem := make([]uint64, len(pids))
		for j, pid := range pids {
			c := s.clients[pid]
			if c == nil {
				continue
			}
			for k, dev := range c.devs { // the client's ordinals → the server's devices
				if dev == i && k < len(c.used) {
					mem[j] += c.used[k]
				}
			}
		}
		_ = s.daemon.Send(emuwire.Msg{Op: emuwire.OpProcs, UUIDs: []string{uuid}, PIDs: pids, Mem: mem})
	}
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
	s.logfLocked("Client {PID: %d, Context: 1} encountered a fatal GPU error.", c.pid)
	s.logfLocked("Server is handling a fatal GPU error.")
	pids := s.clientPIDsLocked()
	for i := range s.cfg.Devices {
		for _, pid := range pids {
			s.logfLocked("Client {PID: %d, Context ID: 1} on device %d to be torn down", pid, i)
		}
	}
	for _, pid := range pids {
		s.logfLocked("All clients belonging to error trigging process %d will be torn down", pid)
		s.logfLocked("Client {PID: %d, Context ID: 1} on the error-trigging process %d to be torn down", pid, pid)
	}
	s.logfLocked("The following devices will be reset:")
	for i := range s.cfg.Devices {
		s.logfLocked("%d", i)
	}
	s.logfLocked("The following client process have a sticky error set:")
	for _, pid := range pids {
		s.logfLocked("%d", pid)
	}
	for pid, other := range s.clients {
		s.affected[pid] = true
		_ = other.conn.Send(emuwire.Msg{Op: emuwire.OpFault, Err: ErrIllegalAddress})
	}
	// The driver reports the fault as an Xid (31, an MMU fault, for an
	// illegal address) on the device it happened on; the emulated daemon
	// passes it on to the simulated GPUs.
	if s.daemon != nil && len(s.cfg.Devices) > 0 {
		_ = s.daemon.Send(emuwire.Msg{Op: emuwire.OpXid, UUIDs: s.cfg.Devices[:1], Err: XidMMUFault})
	}
	s.notifyLocked()
}

// XidMMUFault is the Xid the driver reports for a client's illegal
// memory access (NVIDIA's Xid catalogue: 31, GPU memory page fault).
const XidMMUFault = 31

func (s *Server) disconnect(c *client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clients[c.pid] != c {
		return
	}
	s.dropLocked(c)
}

// resetDone ends the device reset of fault number gen: the server is
// ACTIVE again.
func (s *Server) resetDone(gen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resetGen != gen || s.state != Fault || len(s.affected) > 0 {
		return
	}
	s.state = Active
	s.notifyLocked()
}

func (s *Server) dropLocked(c *client) {
	delete(s.clients, c.pid)
	for i, u := range c.used {
		s.used[c.devs[i]] -= u
	}
	c.used = make([]uint64, len(c.used))
	s.reportProcsLocked()
	// "recevie" is MPS's spelling.
	s.logfLocked("Server failed to recevie command with status 806, assuming client {PID: %d, Context ID: 1} exit", c.pid)
	s.logfLocked("Client {PID: %d, Context ID: 1} exiting. Number of active client contexts is %d.", c.pid, len(s.clients))
	s.logfLocked("Server failed to recevie command with status 806, assuming client {PID: %d, Context ID: 0} exit", c.pid)
	s.logfLocked("Client process %d disconnected", c.pid)
	if s.affected[c.pid] {
		delete(s.affected, c.pid)
		if s.state == Fault && len(s.affected) == 0 {
			// The faulted contexts are torn down; the next client gets new
			// ones once the devices are reset: until then the server stays
			// FAULT and refuses clients, as a real one does while it resets.
			s.logContextsLocked("Destroy")
			s.contextsGone = true
			s.resetGen++
			if s.cfg.FaultReset <= 0 {
				s.state = Active
			} else {
				gen := s.resetGen
				time.AfterFunc(s.cfg.FaultReset, func() { s.resetDone(gen) })
			}
		}
	}
	s.notifyLocked()
	s.maybeFinishLocked()
}
