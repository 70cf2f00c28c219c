package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apihttp"
	"github.com/mpsd/mpsd/internal/units"
)

// Wait bounds every wait of a test on the fake; reaching it fails the
// test rather than hanging it.
const Wait = 20 * time.Second

// Server is the fake mpsd.
type Server struct {
	// Socket is the path of the unix socket it listens on.
	Socket string

	srv      *httptest.Server
	onLease  func(*LeaseConn)
	leases   chan *LeaseConn
	attaches chan Attach
	dropped  chan string

	mu       sync.Mutex
	answers  map[string]Answer
	requests []Request
	// answered gets each request answered from the canned answers, as
	// long as it has room (NextAnswered).
	answered chan Request
	// granted: the leases a granted event named; running: those whose
	// last event was a grant, not a revocation (mpsd attaches nothing to
	// a lease being revoked).
	granted map[string]bool
	running map[string]bool
	refuse  map[string]api.Error
	resumes map[string]api.Error
	drops   map[requestKind]drop
	// refusedFields are lease-request fields the fake refuses as an
	// older mpsd's strict decoder does (RefuseField).
	refusedFields []string
	// levelHeader and versionHeader are the api.HeaderAPILevel and
	// api.HeaderVersion of every answer (Serves); "" sends none.
	levelHeader, versionHeader string
}

// Drop is how the fake drops a request, as an mpsd that dies with the
// request in flight does: the launcher gets no answer at all.
type Drop int

const (
	// DropEOF reads the request, then closes the connection: the
	// launcher reads EOF where the answer should be.
	DropEOF Drop = iota + 1
	// DropReset closes the connection with the request unread, so the
	// kernel resets it: the launcher reads ECONNRESET.
	DropReset
)

type requestKind int

const (
	kindLease requestKind = iota + 1
	kindAttach
)

type drop struct {
	how Drop
	n   int
}

// Attach is one attach request the fake accepted.
type Attach struct {
	LeaseID string
	PID     int
	// Exe is where /proc/PID/exe pointed when the attach arrived: the
	// launcher's own binary while the trampoline waits for its release.
	Exe string
	// PeerPID is the pid of the process that sent it (SO_PEERCRED).
	PeerPID int
}

type credKey struct{}

// New starts a fake mpsd for the test and stops it when the test ends.
// onLease handles each lease stream in the server's goroutine; nil queues
// the streams for NextLease instead.
func New(t testing.TB, onLease func(*LeaseConn)) *Server {
	t.Helper()
	// A unix socket path has room for 107 bytes; t.TempDir's names grow
	// with the test's name, so the socket lives in a short directory.
	dir, err := os.MkdirTemp("", "mpsl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &Server{
		Socket:   filepath.Join(dir, "mpsd.sock"),
		onLease:  onLease,
		leases:   make(chan *LeaseConn, 64),
		attaches: make(chan Attach, 64),
		dropped:  make(chan string, 256),
		granted:  map[string]bool{},
		running:  map[string]bool{},
		refuse:   map[string]api.Error{},
		resumes:  map[string]api.Error{},
		drops:    map[requestKind]drop{},
		answers:  map[string]Answer{},
		answered: make(chan Request, 64),
	}
	inner, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ln := &dropListener{Listener: inner, s: s}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+api.PathLeases, s.serveLease)
	mux.HandleFunc("POST "+api.PathLeases+"/{id}/attach", s.serveAttach)
	mux.HandleFunc("/", s.serveAnswer)
	s.srv = httptest.NewUnstartedServer(s.withVersion(mux))
	s.srv.Listener = ln
	s.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, credKey{}, peerCred(c))
	}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

// peerCred returns the connecting process's credentials, or nil.
func peerCred(c net.Conn) *unix.Ucred {
	uc, ok := c.(*net.UnixConn)
	if dc, isDrop := c.(*dropConn); isDrop {
		uc, ok = dc.UnixConn, true
	}
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	return cred
}

// DropLeases makes the fake drop the next n lease requests as how says,
// before any answer.
func (s *Server) DropLeases(how Drop, n int) { s.setDrop(kindLease, how, n) }

// DropAttaches makes the fake drop the next n attach requests as how
// says, before any answer (and without attaching).
func (s *Server) DropAttaches(how Drop, n int) { s.setDrop(kindAttach, how, n) }

func (s *Server) setDrop(k requestKind, how Drop, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n <= 0 {
		delete(s.drops, k)
		return
	}
	s.drops[k] = drop{how: how, n: n}
}

// takeDrop returns how to drop a request to path, using one of its
// kind's drops, or 0 to serve it.
func (s *Server) takeDrop(path string) Drop {
	k := kindLease
	if strings.HasSuffix(path, "/attach") {
		k = kindAttach
	} else if path != api.PathLeases {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.drops[k]
	if !ok {
		return 0
	}
	if d.n--; d.n == 0 {
		delete(s.drops, k)
	} else {
		s.drops[k] = d
	}
	select {
	case s.dropped <- path:
	default: // nobody counts them
	}
	return d.how
}

// NextDrop returns the path of the next request dropped, failing the test
// if none is within Wait.
func (s *Server) NextDrop(t testing.TB) string {
	t.Helper()
	select {
	case p := <-s.dropped:
		return p
	case <-time.After(Wait):
		t.Fatalf("apitest: no request dropped within %s", Wait)
		return ""
	}
}

func (s *Server) dropping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.drops) > 0
}

// dropListener hands out connections that may be dropped at their first
// read, once the request line says what the request is.
type dropListener struct {
	net.Listener
	s *Server
}

func (l *dropListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if uc, ok := c.(*net.UnixConn); ok {
		return &dropConn{UnixConn: uc, s: l.s}, nil
	}
	return c, nil
}

// dropConn is a server connection that, while drops are set, peeks at
// the request line before the server reads anything, and drops the
// connection if a drop for the request's kind is due.
type dropConn struct {
	*net.UnixConn
	s       *Server
	checked bool
}

// errDropped is what the server reads from a dropped connection.
var errDropped = errors.New("apitest: connection dropped")

func (c *dropConn) Read(b []byte) (int, error) {
	if c.checked || !c.s.dropping() {
		c.checked = true
		return c.UnixConn.Read(b)
	}
	c.checked = true
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	buf := make([]byte, api.MaxRequestBytes+4096)
	var n int
	var perr error
	err = raw.Read(func(fd uintptr) bool {
		n, _, perr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK)
		return !errors.Is(perr, unix.EAGAIN)
	})
	if err != nil || perr != nil || n == 0 {
		return c.UnixConn.Read(b)
	}
	// "POST /v1/leases HTTP/1.1"
	fields := strings.Fields(strings.SplitN(string(buf[:n]), "\n", 2)[0])
	how := Drop(0)
	if len(fields) >= 2 {
		how = c.s.takeDrop(fields[1])
	}
	switch how {
	case DropEOF:
		_, _ = io.ReadFull(c.UnixConn, buf[:n])
	case DropReset:
	default:
		return c.UnixConn.Read(b)
	}
	_ = c.UnixConn.Close()
	return 0, errDropped
}

// Serves makes the fake send level and version in the api.HeaderAPILevel
// and api.HeaderVersion headers of every answer from now on, as mpsd
// does; level "" (the fake's default) sends neither, as an mpsd from
// before API levels. A level that is not one is sent as it is.
func (s *Server) Serves(level, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.levelHeader, s.versionHeader = level, version
}

// withVersion sets the headers Serves chose on every answer of h.
func (s *Server) withVersion(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		level, version := s.levelHeader, s.versionHeader
		s.mu.Unlock()
		if level != "" {
			w.Header().Set(api.HeaderAPILevel, level)
			w.Header().Set(api.HeaderVersion, version)
		}
		h.ServeHTTP(w, r)
	})
}

// Answer is a canned answer of the fake to a request other than a lease
// stream or an attach (status, admin requests).
type Answer struct {
	Status int
	// Body is written as it is; ContentType defaults to JSON.
	Body        string
	ContentType string
}

// Request is a request the fake answered from its canned answers.
type Request struct {
	Method, Path, ContentType, Body string
	// Query is the request's raw query (after the "?").
	Query string
}

// Answer makes the fake answer every `METHOD PATH` request with a (a
// request with no answer gets 404 not_found).
func (s *Server) Answer(method, path string, a Answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[method+" "+path] = a
}

// Requests lists the requests answered from the canned answers (or
// refused for want of one), in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) serveAnswer(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(io.LimitReader(r.Body, api.MaxRequestBytes+1))
	s.mu.Lock()
	req := Request{r.Method, r.URL.Path, r.Header.Get("Content-Type"), string(b), r.URL.RawQuery}
	s.requests = append(s.requests, req)
	a, ok := s.answers[r.Method+" "+r.URL.Path]
	s.mu.Unlock()
	select {
	case s.answered <- req:
	default:
	}
	if !ok {
		apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, "fake mpsd: no "+r.Method+" "+r.URL.Path)
		return
	}
	ct := a.ContentType
	if ct == "" {
		ct = api.ContentTypeJSON
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(a.Status)
	_, _ = io.WriteString(w, a.Body)
}

// NextAnswered returns the next request answered from the canned answers
// (or refused for want of one) that is `METHOD PATH`, skipping others;
// it fails the test if none comes within Wait.
func (s *Server) NextAnswered(t testing.TB, method, path string) Request {
	t.Helper()
	timeout := time.After(Wait)
	for {
		select {
		case r := <-s.answered:
			if r.Method == method && r.Path == path {
				return r
			}
		case <-timeout:
			t.Fatalf("apitest: no %s %s within %s", method, path, Wait)
			return Request{}
		}
	}
}

// RefuseResume makes a lease request that resumes lease id fail with e
// before the stream starts, as mpsd refuses a lease it does not know
// (CodeNotFound, 404).
func (s *Server) RefuseResume(id string, e api.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resumes[id] = e
}

// RefuseAttach makes attaches to lease id fail with e.
func (s *Server) RefuseAttach(id string, e api.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse[id] = e
}

// NextLease returns the next lease stream opened while onLease is nil,
// failing the test if none comes within Wait.
func (s *Server) NextLease(t testing.TB) *LeaseConn {
	t.Helper()
	select {
	case lc := <-s.leases:
		return lc
	case <-time.After(Wait):
		t.Fatalf("apitest: no lease request within %s", Wait)
		return nil
	}
}

// Leases delivers the lease streams opened while onLease is nil, for a
// test that must wait on something else at the same time.
func (s *Server) Leases() <-chan *LeaseConn { return s.leases }

// NextAttach returns the next accepted attach, failing the test if none
// comes within Wait.
func (s *Server) NextAttach(t testing.TB) Attach {
	t.Helper()
	select {
	case a := <-s.attaches:
		return a
	case <-time.After(Wait):
		t.Fatalf("apitest: no attach within %s", Wait)
		return Attach{}
	}
}

// RefuseField makes the fake answer a lease or attach request that has
// the field name with mpsd's 400 for an unknown field, as an mpsd older
// than the field does.
func (s *Server) RefuseField(name string) {
	s.mu.Lock()
	s.refusedFields = append(s.refusedFields, name)
	s.mu.Unlock()
}

// readRefusing reads r's body, or answers the 400 of a refused field
// (RefuseField) and returns false.
func (s *Server) readRefusing(w http.ResponseWriter, r *http.Request, what string) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, api.MaxRequestBytes+1))
	if err != nil {
		apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return nil, false
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(body, &fields)
	s.mu.Lock()
	refusedFields := slices.Clone(s.refusedFields)
	s.mu.Unlock()
	for _, f := range refusedFields {
		if _, ok := fields[f]; ok {
			apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("%s: json: unknown field %q", what, f))
			return nil, false
		}
	}
	return body, true
}

func (s *Server) serveLease(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readRefusing(w, r, "lease request")
	if !ok {
		return
	}
	req, err := api.DecodeLeaseRequest(bytes.NewReader(body))
	switch {
	case errors.Is(err, api.ErrTooLarge):
		apihttp.WriteError(w, http.StatusRequestEntityTooLarge, api.CodeTooLarge, err.Error())
		return
	case err != nil:
		apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	refusal, refused := s.resumes[req.ResumeLeaseID]
	s.mu.Unlock()
	if refused && req.ResumeLeaseID != "" {
		status := http.StatusConflict
		if refusal.Code == api.CodeNotFound {
			status = http.StatusNotFound
		}
		apihttp.WriteError(w, status, refusal.Code, refusal.Message)
		return
	}
	w.Header().Set("Content-Type", api.ContentTypeNDJSON)
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	lc := &LeaseConn{
		Request:  req,
		srv:      s,
		w:        w,
		released: r.Context().Done(),
		end:      make(chan struct{}),
	}
	if cred, _ := r.Context().Value(credKey{}).(*unix.Ucred); cred != nil {
		lc.PeerPID = int(cred.Pid)
	}
	if s.onLease != nil {
		s.onLease(lc)
		lc.End()
		return
	}
	s.leases <- lc
	select {
	case <-lc.end:
	case <-r.Context().Done():
	}
	lc.End()
	lc.mu.Lock()
	cut := lc.cut
	lc.mu.Unlock()
	if cut {
		// No end of the chunked body: the launcher reads an unexpected
		// EOF, as from an mpsd killed in the middle of its stream.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	}
}

func (s *Server) serveAttach(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, ok := s.readRefusing(w, r, "attach request")
	if !ok {
		return
	}
	req, err := api.DecodeAttachRequest(bytes.NewReader(body))
	if err != nil {
		apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	known, running, refusal := s.granted[id], s.running[id], s.refuse[id]
	s.mu.Unlock()
	if !known {
		apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no lease %s", id))
		return
	}
	if !running {
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is not running", id))
		return
	}
	if refusal.Message != "" {
		apihttp.WriteError(w, http.StatusForbidden, refusal.Code, refusal.Message)
		return
	}
	cred, _ := r.Context().Value(credKey{}).(*unix.Ucred)
	ppid, err := parentPID(req.PID)
	if cred == nil || err != nil || ppid != int(cred.Pid) {
		apihttp.WriteError(w, http.StatusForbidden, api.CodeForbidden,
			fmt.Sprintf("pid %d is not a child of the caller", req.PID))
		return
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", req.PID))
	select {
	case s.attaches <- Attach{LeaseID: id, PID: req.PID, Exe: exe, PeerPID: int(cred.Pid)}:
	default: // nobody reads them (a benchmark); the attach still succeeds
	}
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	_, _ = w.Write([]byte("{}\n"))
}

// Attaches returns the attaches accepted and not yet taken by NextAttach,
// without waiting.
func (s *Server) Attaches() []Attach {
	var as []Attach
	for {
		select {
		case a := <-s.attaches:
			as = append(as, a)
		default:
			return as
		}
	}
}

// ParentPID is the parent of pid, as /proc/pid/stat says.
func ParentPID(pid int) (int, error) { return parentPID(pid) }

// parentPID reads the parent of pid from /proc/pid/stat.
func parentPID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name in parentheses may hold spaces and parentheses;
	// the fields after the last ')' are "state ppid ...".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("apitest: /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("apitest: /proc/%d/stat: unexpected format", pid)
	}
	return strconv.Atoi(f[1])
}

// LeaseConn is one lease stream: the request and the means to answer it.
type LeaseConn struct {
	Request api.LeaseRequest
	// PeerPID is the requesting process (SO_PEERCRED).
	PeerPID int

	srv      *Server
	released <-chan struct{}
	end      chan struct{}

	mu    sync.Mutex
	w     http.ResponseWriter
	ended bool
	cut   bool
	lease string // the lease the stream's last grant named
}

// Send writes ev to the stream. A granted lease becomes attachable, and a
// revoked one is not until its next grant, as with mpsd (an attach to it
// is refused: 409, CodeConflict).
func (c *LeaseConn) Send(ev api.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return errors.New("apitest: stream already ended")
	}
	switch {
	case ev.Type == api.EventGranted && ev.Lease != nil:
		c.lease = ev.Lease.ID
		c.srv.mu.Lock()
		c.srv.granted[ev.Lease.ID] = true
		c.srv.running[ev.Lease.ID] = true
		c.srv.mu.Unlock()
	case ev.Type == api.EventRevoked && c.lease != "":
		c.srv.mu.Lock()
		c.srv.running[c.lease] = false
		c.srv.mu.Unlock()
	}
	return api.WriteEvent(c.w, ev)
}

// SendRaw writes line and a newline to the stream unchecked, to break
// the protocol on purpose.
func (c *LeaseConn) SendRaw(line string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return errors.New("apitest: stream already ended")
	}
	if _, err := io.WriteString(c.w, line+"\n"); err != nil {
		return err
	}
	c.w.(http.Flusher).Flush()
	return nil
}

// MustSend is Send failing the test on error.
func (c *LeaseConn) MustSend(t testing.TB, ev api.Event) {
	t.Helper()
	if err := c.Send(ev); err != nil {
		t.Fatalf("apitest: send %s: %v", ev.Type, err)
	}
}

// End closes the stream from mpsd's side, as a restarting mpsd does.
func (c *LeaseConn) End() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended {
		c.ended = true
		close(c.end)
	}
}

// Cut ends the stream as a killed mpsd does: the connection closes in
// the middle of the stream's body.
func (c *LeaseConn) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended {
		c.ended, c.cut = true, true
		close(c.end)
	}
}

// Released is closed when the launcher has closed the stream (released
// the lease).
func (c *LeaseConn) Released() <-chan struct{} { return c.released }

// WaitReleased fails the test unless the launcher releases the lease
// within Wait.
func (c *LeaseConn) WaitReleased(t testing.TB) {
	t.Helper()
	select {
	case <-c.released:
	case <-time.After(Wait):
		t.Fatalf("apitest: lease not released within %s", Wait)
	}
}

// Granted is a granted event for the request, as mpsd would make it: the
// request's sm and mem (or 25% and 1G), one GPU, and the MPS environment
// (the thread percentage sm divided among the request's procs).
func Granted(req api.LeaseRequest, id string, attempt int) api.Event {
	sm, mem := req.SM, req.MemBytes
	if sm == 0 {
		sm = 25
	}
	if mem == 0 {
		mem = units.GiB
	}
	group := req.Group
	if group == "" {
		group = "default"
	}
	limit, _ := units.MPSLimit(mem)
	procs := max(req.Procs, 1)
	return api.Event{Type: api.EventGranted, Lease: &api.Lease{
		ID: id, Group: group, GPUIndexes: []int{0}, GPUUUIDs: []string{"GPU-fake-0"},
		SM: sm, MemBytes: mem, Attempt: attempt, Procs: req.Procs,
		Env: map[string]string{
			api.EnvPipeDirectory:    "/run/mpsd/" + group + "/GPU-fake-0/pipe",
			api.EnvThreadPercentage: strconv.Itoa(sm / procs),
			api.EnvProcs:            strconv.Itoa(procs),
			api.EnvPinnedMemLimit:   "0=" + limit,
			"CUDA_VISIBLE_DEVICES":  "GPU-fake-0",
			api.EnvLeaseID:          id,
			api.EnvGroup:            group,
			api.EnvAttempt:          strconv.Itoa(attempt),
		},
	}}
}

// Grant serves a lease at once: granted, then hold until the launcher
// releases. Use it as New's onLease.
func Grant(lc *LeaseConn) {
	if lc.Send(Granted(lc.Request, "lease-1", 1)) != nil {
		return
	}
	<-lc.Released()
}

// ProgramFDs lists the open descriptors of process pid, and the ones a
// program this process starts should see there: 0, 1 and 2, plus those
// this process itself inherited without close-on-exec (a wrapper passes
// them through like a shell does). Anything more leaked from mps-launch.
func ProgramFDs(t testing.TB, pid int) (got, want []int) {
	t.Helper()
	return openFDs(t, pid, false), append([]int{0, 1, 2}, slices.DeleteFunc(openFDs(t, os.Getpid(), true), func(fd int) bool { return fd <= 2 })...)
}

// openFDs lists pid's open descriptors, in order; inheritable keeps only
// those without close-on-exec.
func openFDs(t testing.TB, pid int, inheritable bool) []int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("apitest: %v", err)
	}
	var fds []int
	for _, n := range names {
		fd, err := strconv.Atoi(n.Name())
		if err != nil {
			t.Fatalf("apitest: %s/%s: %v", dir, n.Name(), err)
		}
		if inheritable {
			info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
			if err != nil {
				continue // the descriptor ReadDir itself used, now closed
			}
			if flags, ok := fdFlags(string(info)); !ok || flags&unix.O_CLOEXEC != 0 {
				continue
			}
		}
		fds = append(fds, fd)
	}
	slices.Sort(fds)
	return fds
}

// fdFlags reads the octal "flags:" line of a /proc fdinfo file.
func fdFlags(info string) (int64, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// OpenPTY opens a pseudo-terminal pair for tests of what mps-launch shows on
// a terminal; both ends are closed when the test ends. It skips the test
// on a host without pseudo-terminals.
func OpenPTY(t testing.TB) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals on this host: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return m, s
}
