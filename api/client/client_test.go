package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLeaseRefusedBeforeStream(t *testing.T) {
	fake := apitest.New(t, nil)
	c := New(fake.Socket)
	// The fake decodes as strictly as mpsd, so an invalid request gets the
	// 400 Error body instead of a stream.
	_, err := c.Lease(t.Context(), api.LeaseRequest{SM: 500})
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Code != api.CodeBadRequest || !strings.Contains(apiErr.Message, "sm 500") {
		t.Fatalf("Lease = %v, want a bad_request api.Error", err)
	}
	err = c.Attach(t.Context(), "lease-9", 1, os.Getpid())
	if !errors.As(err, &apiErr) || apiErr.Code != api.CodeNotFound {
		t.Errorf("Attach to an unknown lease = %v, want not_found", err)
	}
}

// A granted stream carries its events through the chunked body, and
// Close releases the lease (the fake sees the connection go).
func TestLeaseStream(t *testing.T) {
	fake := apitest.New(t, nil)
	c := New(fake.Socket)
	type res struct {
		st  *Stream
		err error
	}
	ch := make(chan res, 1)
	go func() {
		st, err := c.Lease(context.Background(), api.LeaseRequest{})
		ch <- res{st, err}
	}()
	lc := fake.NextLease(t)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 2, Group: "g"})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if ev, err := r.st.Next(); err != nil || ev.Type != api.EventQueued || ev.Position != 2 {
		t.Fatalf("Next = %+v, %v", ev, err)
	}
	if ev, err := r.st.Next(); err != nil || ev.Type != api.EventGranted || ev.Lease.ID != "lease-1" {
		t.Fatalf("Next = %+v, %v", ev, err)
	}
	if err := c.Attach(t.Context(), "lease-1", 1, os.Getpid()); err == nil {
		t.Error("attach of the test process itself (not a child) accepted")
	}
	// Close unblocks a Next in another goroutine.
	next := make(chan error, 1)
	go func() { _, err := r.st.Next(); next <- err }()
	_ = r.st.Close()
	lc.WaitReleased(t)
	select {
	case <-next:
	case <-time.After(apitest.Wait):
		t.Fatal("Next still blocked after Close")
	}
}

// Cancelling the Lease context ends the stream with the context's error.
func TestLeaseStreamCancel(t *testing.T) {
	fake := apitest.New(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type res struct {
		st  *Stream
		err error
	}
	ch := make(chan res, 1)
	go func() {
		st, err := New(fake.Socket).Lease(ctx, api.LeaseRequest{})
		ch <- res{st, err}
	}()
	lc := fake.NextLease(t)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.st.Close()
	next := make(chan error, 1)
	go func() { _, err := r.st.Next(); next <- err }()
	cancel()
	select {
	case err := <-next:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Next after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(apitest.Wait):
		t.Fatal("Next still blocked after cancel")
	}
	_ = r.st.Close()
	lc.WaitReleased(t)
}

// A stream mpsd ends is io.EOF; one cut in the middle of its body is
// another error, and a bad line is ErrProtocol.
func TestLeaseStreamEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(*apitest.LeaseConn)
		want func(error) bool
	}{
		{"end", (*apitest.LeaseConn).End, func(err error) bool { return errors.Is(err, io.EOF) }},
		{"cut", (*apitest.LeaseConn).Cut, func(err error) bool { return err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, ErrProtocol) }},
		{"bad line", func(lc *apitest.LeaseConn) { _ = lc.SendRaw(`{"type":"nonsense"}`) }, func(err error) bool { return errors.Is(err, ErrProtocol) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := apitest.New(t, nil)
			c := New(fake.Socket)
			done := make(chan error, 1)
			go func() {
				st, err := c.Lease(context.Background(), api.LeaseRequest{})
				if err != nil {
					done <- err
					return
				}
				defer st.Close()
				_, err = st.Next()
				done <- err
			}()
			lc := fake.NextLease(t)
			tc.end(lc)
			if err := <-done; !tc.want(err) {
				t.Errorf("Next = %v", err)
			}
			lc.End()
		})
	}
}

func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.sock")
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	for _, tc := range []struct {
		socket, msg string
		absent      bool
	}{
		{missing, "cannot reach mpsd at " + missing + ": no such file or directory; hint", true},
		{stale, "cannot reach mpsd at " + stale + ": connection refused; hint", false},
	} {
		c := New(tc.socket)
		c.Hint = "; hint"
		_, _, err := c.Status(t.Context())
		if !errors.Is(err, ErrUnreachable) || err.Error() != tc.msg || SocketAbsent(err) != tc.absent {
			t.Errorf("Status via %s = %v (absent %v), want %q (absent %v)", tc.socket, err, SocketAbsent(err), tc.msg, tc.absent)
		}
	}
}

// DialLease's connection carries the LeaseOn that follows (the request
// arrives on it, the stream reads from it), and its failures are the ones
// Lease returns: ErrUnreachable, and SocketAbsent for a socket never there.
func TestDialLease(t *testing.T) {
	fake := apitest.New(t, nil)
	c := New(fake.Socket)
	conn, err := c.DialLease(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		st  *Stream
		err error
	}
	ch := make(chan res, 1)
	go func() {
		st, err := c.LeaseOn(context.Background(), conn, api.LeaseRequest{Group: "g", AttachPID: 42})
		ch <- res{st, err}
	}()
	lc := fake.NextLease(t)
	if lc.Request.Group != "g" || lc.Request.AttachPID != 42 {
		t.Errorf("the request mpsd got: %+v", lc.Request)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if ev, err := r.st.Next(); err != nil || ev.Type != api.EventGranted || ev.Lease.ID != "lease-1" {
		t.Fatalf("Next = %+v, %v", ev, err)
	}
	_ = r.st.Close()
	lc.WaitReleased(t)

	missing := filepath.Join(t.TempDir(), "none.sock")
	m := New(missing)
	_, err = m.DialLease(t.Context())
	_, lerr := m.Lease(t.Context(), api.LeaseRequest{})
	if !errors.Is(err, ErrUnreachable) || !SocketAbsent(err) || lerr == nil || err.Error() != lerr.Error() {
		t.Errorf("DialLease via %s = %v, want Lease's %v", missing, err, lerr)
	}
}

// mpsd dropping a request before its answer (as one that dies does) is
// ErrUnreachable with the reason, the socket being there.
func TestDropped(t *testing.T) {
	for _, tc := range []struct {
		how    apitest.Drop
		reason string
	}{
		{apitest.DropEOF, "mpsd closed the connection before answering"},
		{apitest.DropReset, "connection reset before mpsd answered"},
	} {
		fake := apitest.New(t, nil)
		fake.DropLeases(tc.how, 1)
		_, err := New(fake.Socket).Lease(t.Context(), api.LeaseRequest{})
		if !errors.Is(err, ErrUnreachable) || SocketAbsent(err) || !strings.HasSuffix(err.Error(), ": "+tc.reason) {
			t.Errorf("drop %d: Lease = %v, want unreachable: %s", tc.how, err, tc.reason)
		}
	}
}

// serveConns listens on a socket of the test and hands each connection,
// one after the other, to serve, until the test ends; it returns the
// socket.
func serveConns(t *testing.T, serve func(net.Conn)) string {
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return socket
}

// silent accepts connections and never answers.
func silent(t *testing.T) string {
	return serveConns(t, func(c net.Conn) {
		go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
	})
}

func TestTimeouts(t *testing.T) {
	socket := silent(t)
	c := New(socket)
	c.Timeout = 50 * time.Millisecond
	_, _, err := c.Status(t.Context())
	if want := "GET " + api.PathStatus + " via " + socket + ": no answer within 50ms"; !errors.Is(err, ErrUnreachable) || err.Error() != want {
		t.Errorf("Status = %v, want %q", err, want)
	}
	c = New(socket)
	c.HeaderTimeout = 50 * time.Millisecond
	_, err = c.Lease(t.Context(), api.LeaseRequest{})
	if !errors.Is(err, ErrUnreachable) || !strings.HasSuffix(err.Error(), "mpsd accepted the connection but did not answer in time") {
		t.Errorf("Lease = %v, want unreachable, no answer in time", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = New(socket).Lease(ctx, api.LeaseRequest{})
	if want := "POST " + api.PathLeases + " via " + socket + ": interrupted"; !errors.Is(err, context.Canceled) || err.Error() != want {
		t.Errorf("Lease = %v, want %q", err, want)
	}
}

// Answers framed as net/http's server frames them: Content-Length,
// chunked, a bad document, an error status.
func TestAnswers(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case api.PathStatus:
			w.Header().Set("Content-Type", api.ContentTypeJSON)
			_, _ = io.WriteString(w, `{"instances":[],"queue":{"v9":1}}`)
		case "/chunked":
			bw := bufio.NewWriter(w)
			_, _ = io.WriteString(bw, `{"a":`)
			_ = bw.Flush()
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, `"b"}`)
		case "/bad":
			_, _ = io.WriteString(w, `not json`)
		default:
			http.Error(w, "nope", http.StatusTeapot)
		}
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	c := New(socket)
	if st, raw, err := c.Status(t.Context()); err != nil || st.Queue["v9"] != 1 || !strings.Contains(string(raw), "v9") {
		t.Errorf("Status = %+v, %q, %v", st, raw, err)
	}
	var v struct{ A string }
	if _, err := c.Get(t.Context(), "/chunked", &v); err != nil || v.A != "b" {
		t.Errorf("chunked: %+v, %v", v, err)
	}
	if _, err := c.Get(t.Context(), "/bad", &v); !errors.Is(err, ErrBadAnswer) {
		t.Errorf("bad body: %v, want ErrBadAnswer", err)
	}
	var ae *api.Error
	if _, err := c.Post(t.Context(), "/other", struct{}{}, nil); !errors.As(err, &ae) || ae.Code != api.CodeInternal || !strings.Contains(ae.Message, "418") {
		t.Errorf("418: %v", err)
	}
}

// A GET whose connection mpsd's end cuts before the answer (mpsd going
// away) is sent once more on a new connection; a second cut stands.
func TestGetRetriedOnceAfterACut(t *testing.T) {
	for _, tc := range []struct {
		name string
		cuts int
		ok   bool
	}{
		{"one cut", 1, true},
		{"two cuts", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conns atomic.Int32
			socket := serveConns(t, func(c net.Conn) {
				n := conns.Add(1)
				buf := make([]byte, 4096)
				_, _ = c.Read(buf) // the request
				if int(n) > tc.cuts {
					body := `{"schema_version":1}`
					_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
				c.Close()
			})
			st, _, err := New(socket).Status(t.Context())
			switch {
			case tc.ok && (err != nil || st.SchemaVersion != 1):
				t.Errorf("Status after %d cut = %+v, %v; want the second connection's answer", tc.cuts, st, err)
			case !tc.ok && (!errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "mpsd closed the connection before answering")):
				t.Errorf("Status after %d cuts = %v; want the cut reported", tc.cuts, err)
			}
			if got, want := int(conns.Load()), 2; got != want {
				t.Errorf("%d connections, want %d (one retry)", got, want)
			}
		})
	}
}

// An error answer whose body does not come whole: a lease stream's
// connection has no deadline after the headers, yet the body's read is
// bounded like the headers' wait, and the status keeps its meaning (mpsd's
// connection caps answer 503 over_limit: a 503 stays temporary).
func TestRefusalBodyNotWhole(t *testing.T) {
	const partial = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 80\r\n\r\n{\"code\":"
	for _, tc := range []struct {
		name string
		cut  bool // mpsd's end closes the connection; else it stays silent
		want string
	}{
		{"body never comes", false, "mpsd answered 503, but its error body did not come within 100ms"},
		{"body cut", true, "mpsd answered 503, but the connection ended in the middle of its error body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := serveConns(t, func(c net.Conn) {
				buf := make([]byte, 4096)
				_, _ = c.Read(buf) // the request
				_, _ = io.WriteString(c, partial)
				if !tc.cut {
					// Silent until the client gives up and closes.
					_, _ = io.Copy(io.Discard, c)
				}
				c.Close()
			})
			c := New(socket)
			c.HeaderTimeout = 100 * time.Millisecond
			// ctx outlasts the header wait many times over: the bound must
			// be the client's own, as the launcher's streams have none.
			ctx, cancel := context.WithTimeout(t.Context(), apitest.Wait)
			defer cancel()
			check := func(what string, err error) {
				t.Helper()
				var ae *api.Error
				if !errors.As(err, &ae) || !ae.Code.Temporary() || ae.Code != api.CodeUnavailable || !strings.HasSuffix(ae.Message, tc.want) {
					t.Errorf("%s = %v (%T), want a temporary refusal ending %q", what, err, err, tc.want)
				}
			}
			_, err := c.Lease(ctx, api.LeaseRequest{SM: 10})
			check("Lease", err)
			_, err = c.Get(ctx, api.PathStatus, nil)
			check("Get", err)
		})
	}
}
