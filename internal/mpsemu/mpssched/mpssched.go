// Package mpssched is the MPS control daemon's scheduling of servers and
// clients, without processes or sockets: which uid's server runs, which
// clients wait, when a server is asked to exit and which server starts
// next. It is the one definition of these rules: the emulated control
// daemon (internal/mpsemu/control) decides with it, and mpsd's simulation
// of its core (mpsd/sim_test.go) runs its fake control daemon on it, so the
// two cannot drift apart.
//
// The rules are NVIDIA's, as docs/architecture.md ("The MPS model") and the
// conformance scenarios against the real daemons record them:
//   - A daemon without -multiuser-server runs servers of one uid at a
//     time. A client whose uid's server runs and is ready is handed to it
//     at once; any other client waits ("pending").
//   - A client of another uid queues a start of its uid's server and asks
//     the current server to exit once its clients are gone (a server that
//     is not ready yet cannot be asked; the daemon waits for it). The
//     server exits with status 0 when its last client leaves
//     (ExitsWhenIdle); the daemon then starts the first queued server.
//   - With -multiuser-server every client is served by one server of the
//     daemon's uid (root's): no uid switch, clients never wait for one.
//   - After quit no client is served: the waiting ones are refused, every
//     ready server is asked to exit, and the daemon ends with its last.
//
// A Sched is not safe for concurrent use: its owner holds its lock around
// every call, and the Host's methods run under it.
package mpssched

// A Client is a CUDA client that asked the daemon for a server.
type Client struct {
	PID int
	// UID is the uid of the server it needs (the daemon's own under
	// -multiuser-server).
	UID int32
	// Done: handed over, refused, or gone (it gave up waiting).
	Done bool
	// Ref is the host's own handle (the emulator's connection).
	Ref any
}

// A Server is a server process the daemon started.
type Server struct {
	PID int
	UID int32
	// Ready: the server connected back and took its configuration; only
	// a ready server takes clients or can be asked to exit.
	Ready bool
	// Stopping: asked to exit once its clients are gone.
	Stopping bool
	// Waiting are the clients to hand over once it is ready.
	Waiting []*Client
	// Ref is the host's own handle (the emulator's process and link).
	Ref any
}

type request struct {
	uid     int32
	clients []*Client
}

// A Host carries out the scheduler's decisions; its methods run under the
// lock that guards the Sched.
type Host interface {
	// StartServer starts a server of uid (not yet ready); nil when the
	// start failed (the host logs why).
	StartServer(uid int32) *Server
	// AskShutdown asks a ready server to exit once its clients are gone
	// (it is already marked Stopping).
	AskShutdown(sv *Server)
	// HandOver tells a client which server to connect to.
	HandOver(c *Client, sv *Server)
	// Refuse tells a waiting client that no server will come.
	Refuse(c *Client)
}

// Sched is one control daemon's servers and waiting clients.
type Sched struct {
	host      Host
	multiuser bool
	// sharedUID is the uid of a -multiuser-server server.
	sharedUID int32
	quitting  bool
	servers   []*Server
	pending   []*request
}

// New is the scheduling of a daemon, with -multiuser-server when
// multiuser; its shared server then runs as sharedUID.
func New(h Host, multiuser bool, sharedUID int32) *Sched {
	return &Sched{host: h, multiuser: multiuser, sharedUID: sharedUID}
}

// Multiuser reports whether one server serves every uid.
func (s *Sched) Multiuser() bool { return s.multiuser }

// Quitting reports whether quit was asked.
func (s *Sched) Quitting() bool { return s.quitting }

// Servers are the live servers, oldest first. The slice is the Sched's.
func (s *Sched) Servers() []*Server { return s.servers }

// Lookup is the live server of pid, nil if none.
func (s *Sched) Lookup(pid int) *Server {
	for _, sv := range s.servers {
		if sv.PID == pid {
			return sv
		}
	}
	return nil
}

// PendingUIDs are the uids whose server start is queued, in order.
func (s *Sched) PendingUIDs() []int32 {
	out := make([]int32, len(s.pending))
	for i, r := range s.pending {
		out[i] = r.uid
	}
	return out
}

// ServerUID is the uid of the server a client of uid needs.
func (s *Sched) ServerUID(uid int32) int32 {
	if s.multiuser {
		return s.sharedUID
	}
	return uid
}

// current is the server MPS serves now: the oldest live one.
func (s *Sched) current() *Server {
	if len(s.servers) == 0 {
		return nil
	}
	return s.servers[0]
}

// ServesAtOnce is the server a new client of uid would be handed to at
// once, nil when it would wait.
func (s *Sched) ServesAtOnce(uid int32) *Server {
	cur := s.current()
	if cur != nil && cur.Ready && cur.UID == s.ServerUID(uid) && !cur.Stopping && !s.quitting {
		return cur
	}
	return nil
}

// Request handles a client of uid asking for a server: it is handed over
// at once (immediate), waits for the current server to be ready, or waits
// for a server of its uid, which is queued while the current one is asked
// to exit. After quit it is refused. The client is returned for the host
// to mark Done when it gives up.
func (s *Sched) Request(pid int, uid int32, ref any) (c *Client, immediate bool) {
	c = &Client{PID: pid, UID: s.ServerUID(uid), Ref: ref}
	if cur := s.ServesAtOnce(uid); cur != nil {
		c.Done = true
		s.host.HandOver(c, cur)
		return c, true
	}
	if s.quitting {
		s.refuse(c)
		return c, false
	}
	cur := s.current()
	if cur != nil && cur.UID == c.UID && !cur.Stopping {
		cur.Waiting = append(cur.Waiting, c)
		return c, false
	}
	queued := false
	for _, r := range s.pending {
		if r.uid == c.UID {
			r.clients = append(r.clients, c)
			queued = true
		}
	}
	if !queued {
		s.pending = append(s.pending, &request{uid: c.UID, clients: []*Client{c}})
	}
	if cur != nil {
		s.AskShutdown(cur)
	}
	s.schedule()
	return c, false
}

// StartServer is start_server -uid uid: queue a server of uid unless one
// runs or is queued.
func (s *Sched) StartServer(uid int32) {
	if s.quitting {
		return
	}
	for _, sv := range s.servers {
		if sv.UID == uid {
			return
		}
	}
	for _, r := range s.pending {
		if r.uid == uid {
			return
		}
	}
	s.pending = append(s.pending, &request{uid: uid})
	s.schedule()
}

// AskShutdown asks a ready server to exit once its clients are gone; a
// server that is not ready, or already asked, is left alone.
func (s *Sched) AskShutdown(sv *Server) {
	if !sv.Ready || sv.Stopping {
		return
	}
	sv.Stopping = true
	s.host.AskShutdown(sv)
}

// Ready marks a server ready: its waiting clients are handed over, and
// after quit it is asked to exit at once.
func (s *Sched) Ready(sv *Server) {
	sv.Ready = true
	for _, c := range sv.Waiting {
		if !c.Done {
			c.Done = true
			s.host.HandOver(c, sv)
		}
	}
	sv.Waiting = nil
	if s.quitting {
		s.AskShutdown(sv)
	}
}

// Exited forgets a server that exited. Its clients still waiting are
// served first by its successor (or refused after quit). last reports
// that quit was asked and no server is left: the daemon ends.
func (s *Sched) Exited(sv *Server) (last bool) {
	for i, x := range s.servers {
		if x == sv {
			s.servers = append(s.servers[:i], s.servers[i+1:]...)
			break
		}
	}
	if s.quitting {
		for _, c := range sv.Waiting {
			s.refuse(c)
		}
		sv.Waiting = nil
		return len(s.servers) == 0
	}
	if live := liveClients(sv.Waiting); len(live) > 0 {
		s.pending = append([]*request{{uid: sv.UID, clients: live}}, s.pending...)
	}
	sv.Waiting = nil
	s.schedule()
	return false
}

// Quit stops serving: every waiting client is refused and every ready
// server asked to exit. dropped is the number of queued server starts
// dropped; none reports that no server runs, so the daemon ends at once.
func (s *Sched) Quit() (dropped int, none bool) {
	if s.quitting {
		return 0, false
	}
	s.quitting = true
	dropped = len(s.pending)
	for _, r := range s.pending {
		for _, c := range r.clients {
			s.refuse(c)
		}
	}
	s.pending = nil
	for _, sv := range s.servers {
		for _, c := range sv.Waiting {
			s.refuse(c)
		}
		sv.Waiting = nil
	}
	if len(s.servers) == 0 {
		return dropped, true
	}
	for _, sv := range s.servers {
		s.AskShutdown(sv)
	}
	return dropped, false
}

func (s *Sched) refuse(c *Client) {
	if c.Done {
		return
	}
	c.Done = true
	s.host.Refuse(c)
}

// schedule starts the first queued server when none runs.
func (s *Sched) schedule() {
	if s.quitting || len(s.servers) > 0 || len(s.pending) == 0 {
		return
	}
	r := s.pending[0]
	s.pending = s.pending[1:]
	sv := s.host.StartServer(r.uid)
	if sv == nil {
		// NVIDIA's daemon drops the request; its clients wait on until
		// they give up (seen with a uid whose server cannot start).
		return
	}
	s.servers = append(s.servers, sv)
	sv.Waiting = append(sv.Waiting, r.clients...)
}

func liveClients(cs []*Client) []*Client {
	var out []*Client
	for _, c := range cs {
		if !c.Done {
			out = append(out, c)
		}
	}
	return out
}

// ExitsWhenIdle is a server's own rule: asked to exit (stopping), it does
// so once it has no client left, with status 0.
func ExitsWhenIdle(stopping bool, clients int) bool { return stopping && clients == 0 }
