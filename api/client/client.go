// Package client is the one client of mpsd's API (package api) over its
// unix socket, used by mps-launch (package launcher), mpsctl and the
// Kubernetes device plugin.
//
// It speaks the HTTP/1.1 subset the API needs itself (http11.go): one
// request per connection, a body with Content-Length, an answer with
// Content-Length, chunked (the lease stream) or ended by the close. It
// does not link net/http, which with its TLS and crypto dependencies
// doubled mps-launch's start-up for a protocol that never leaves the
// host.
//
// What it owns: the dialer, the timeouts, and one mapping of failures to
// errors callers branch on: ErrUnreachable (no socket, refused, reset or
// closed before mpsd answered, no answer in time: what an mpsd that is
// restarting looks like; SocketAbsent tells a socket never there apart),
// ErrBadAnswer (a 2xx answer whose body is not the document asked for),
// ErrProtocol (a lease stream that breaks package api's grammar), and
// *api.Error (mpsd's refusal). It keeps what mpsd's latest answer said of
// itself (Served: its API level and version) and words the warning of a
// skew (SkewWarning). It never retries: the launcher's outage window is
// the launcher's.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/api"
)

var (
	// ErrUnreachable is wrapped when mpsd's socket cannot be connected
	// to, or mpsd ended the connection before it answered (reset, EOF, no
	// answer in time): what a restarting mpsd looks like.
	ErrUnreachable = errors.New("cannot reach mpsd")
	// ErrBadAnswer is wrapped when mpsd answered 2xx with a body that is
	// not the document the request expects.
	ErrBadAnswer = errors.New("bad answer from mpsd")
	// ErrProtocol is wrapped when mpsd's answers break the protocol of
	// package api (a lease stream of another content type, a bad event
	// line, a malformed HTTP answer).
	ErrProtocol = errors.New("protocol violation")
)

// Defaults of Client's timeouts.
const (
	// DefaultHeaderTimeout: mpsd answers the headers at once, before
	// queueing (package api), so a silent daemon is a hung one.
	DefaultHeaderTimeout = 10 * time.Second
	// MaxResponseBytes bounds the body of one non-stream answer (a
	// status document of a large host stays far below it).
	MaxResponseBytes = 32 << 20
)

// Client makes requests to mpsd over its unix socket. Every request gets
// its own connection: the lease stream's connection is the lease, and is
// never shared or pooled. The zero value is not usable; use New.
type Client struct {
	socket string
	// Timeout bounds each request but the lease stream, from dial to the
	// end of the answer; 0 means none (HeaderTimeout still applies). Its
	// expiry reads "METHOD PATH via SOCKET: no answer within T" and wraps
	// ErrUnreachable.
	Timeout time.Duration
	// HeaderTimeout bounds the wait for the answer's headers; 0 means
	// DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// Hint ends the message of an ErrUnreachable error, after the reason:
	// what the user may do about it (" (is mpsd running?)").
	Hint string
	// served is what mpsd's latest answer said of itself (Served).
	served *served
}

// New talks to mpsd at the unix socket path.
func New(socket string) *Client { return &Client{socket: socket, served: &served{}} }

// Socket is the path the client connects to.
func (c *Client) Socket() string { return c.socket }

// Get sends GET path and decodes the 2xx answer into out (when not nil),
// ignoring fields this version does not know. It returns the body as
// received. A non-2xx answer is returned as an *api.Error.
//
// A GET is idempotent: one whose connection mpsd's end cut before it
// answered (mpsd went away: a restart, a watchdog kill) is sent once
// more, on a connection of its own, as net/http retries one. Under
// socket activation the new mpsd answers it.
func (c *Client) Get(ctx context.Context, path string, out any) ([]byte, error) {
	raw, err := c.unary(ctx, "GET", path, nil, out)
	var ue *unreachableError
	if errors.As(err, &ue) && ue.cut && ctx.Err() == nil {
		raw, err = c.unary(ctx, "GET", path, nil, out)
	}
	return raw, err
}

// Post sends body as JSON to path and decodes the 2xx answer into out
// (when not nil) like Get.
func (c *Client) Post(ctx context.Context, path string, body, out any) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode request for %s: %w", path, err)
	}
	return c.unary(ctx, "POST", path, b, out)
}

// Status fetches the status document; raw is the body as mpsd sent it.
func (c *Client) Status(ctx context.Context) (st api.Status, raw []byte, err error) {
	raw, err = c.Get(ctx, api.PathStatus, &st)
	if err != nil {
		return api.Status{}, nil, err
	}
	return st, raw, nil
}

// Version asks mpsd for its build and the API level it serves
// (api.PathVersion). An mpsd from before api.LevelOperatorView answers 404
// (an *api.Error, CodeNotFound); an answer that is not a valid
// api.Version wraps ErrBadAnswer.
func (c *Client) Version(ctx context.Context) (api.Version, error) {
	raw, err := c.Get(ctx, api.PathVersion, nil)
	if err != nil {
		return api.Version{}, err
	}
	v, err := api.DecodeVersion(bytes.NewReader(raw))
	if err != nil {
		return api.Version{}, fmt.Errorf("%w at %s: GET %s: %w", ErrBadAnswer, c.socket, api.PathVersion, err)
	}
	return v, nil
}

// Admin posts target to an admin path (api.PathDrain, api.PathResume,
// api.PathRestart) and returns the instances mpsd changed.
func (c *Client) Admin(ctx context.Context, path string, target api.AdminTarget) (api.AdminResult, error) {
	var res api.AdminResult
	if _, err := c.Post(ctx, path, target, &res); err != nil {
		return api.AdminResult{}, err
	}
	return res, nil
}

// Requeue asks mpsd to revoke lease (an id) and requeue it, and returns
// the instances mpsd changed.
func (c *Client) Requeue(ctx context.Context, lease string) (api.AdminResult, error) {
	var res api.AdminResult
	if _, err := c.Post(ctx, api.PathRequeue, api.RequeueRequest{Lease: lease}, &res); err != nil {
		return api.AdminResult{}, err
	}
	return res, nil
}

// InjectXid asks mpsd to raise a simulated Xid (mpsd refuses it unless
// its GPU backend is the emulator's).
func (c *Client) InjectXid(ctx context.Context, req api.InjectXidRequest) error {
	var answer struct{} // {}: any JSON object will do
	_, err := c.Post(ctx, api.PathInjectXid, req, &answer)
	return err
}

// Attach asks mpsd to move pid, a child of this process started for the
// lease's run attempt, into the cgroup of lease id. A refusal (one for a
// lease now at another attempt included) is returned as an *api.Error.
func (c *Client) Attach(ctx context.Context, id string, attempt, pid int) error {
	_, err := c.Post(ctx, api.AttachPath(id), api.AttachRequest{PID: pid, Attempt: attempt}, nil)
	return err
}

// BindPod tells mpsd which running container holds lease id
// (api.PodPath; root only, for its own lease). A refusal is returned as
// an *api.Error.
func (c *Client) BindPod(ctx context.Context, id string, b api.BindPodRequest) error {
	_, err := c.Post(ctx, api.PodPath(id), b, nil)
	return err
}

// Release asks mpsd to release lease id, whose command ran under
// q.Attempt and has ended (with q.ExitStatus, where known), and waits for
// its answer: the lease is gone, and its end in mpsd's history, once it
// returns nil. A refusal is returned as an *api.Error (CodeRevoking: a
// revocation has the lease, or has taken that attempt already).
func (c *Client) Release(ctx context.Context, id string, q api.ReleaseRequest) error {
	_, err := c.Post(ctx, api.ReleasePath(id), q, nil)
	return err
}

// Shutdown asks mpsd to shut the host's MPS service down (api.PathShutdown)
// and returns what it did; mpsd exits after answering. Its answer comes
// once the leases have ended and the daemons quit: the caller's Timeout
// and HeaderTimeout must leave room for that.
func (c *Client) Shutdown(ctx context.Context) (api.ShutdownResult, error) {
	var res api.ShutdownResult
	if _, err := c.Post(ctx, api.PathShutdown, api.ShutdownRequest{}, &res); err != nil {
		return api.ShutdownResult{}, err
	}
	return res, nil
}

// Lease posts req and returns its event stream. The lease (or the place
// in the queue) is held until the stream is closed, or ctx is done
// (ctx bounds the stream's whole life; Timeout does not apply). A refusal
// before the stream starts is returned as an *api.Error.
func (c *Client) Lease(ctx context.Context, req api.LeaseRequest) (*Stream, error) {
	return c.LeaseOn(ctx, nil, req)
}

// DialLease connects to mpsd's socket for a lease request to follow on
// the connection (LeaseOn), so that the caller can overlap the connect
// with the work that completes the request (mps-launch starts its
// trampoline meanwhile, whose pid the request names). Its errors are the
// ones Lease would return for the connect.
func (c *Client) DialLease(ctx context.Context) (net.Conn, error) {
	return c.dial(ctx, "POST "+api.PathLeases, 0)
}

// dial connects for the request what, within timeout when it is set; its
// failure is that request's error.
func (c *Client) dial(ctx context.Context, what string, timeout time.Duration) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, c.requestError(ctx, what, err, 0)
	}
	var d net.Dialer
	if timeout > 0 {
		d.Deadline = time.Now().Add(timeout)
	}
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, c.requestError(ctx, what, &dialError{err: err}, timeout)
	}
	return conn, nil
}

// LeaseOn is Lease on conn, a connection from DialLease that nothing else
// has used (the stream owns it from here, and a failure closes it), or on
// a connection of its own when conn is nil.
func (c *Client) LeaseOn(ctx context.Context, conn net.Conn, req api.LeaseRequest) (*Stream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, fmt.Errorf("encode request for %s: %w", api.PathLeases, err)
	}
	what := "POST " + api.PathLeases
	rc, err := c.roundTripOn(ctx, conn, "POST", api.PathLeases, b, api.ContentTypeNDJSON, 0)
	if err != nil {
		return nil, err
	}
	if rc.resp.status != 200 {
		defer rc.close()
		return nil, c.refusal(ctx, rc, what)
	}
	if ct := rc.resp.contentType; !hasPrefix(ct, api.ContentTypeNDJSON) {
		rc.close()
		return nil, fmt.Errorf("%w: %s via %s: lease stream has content type %q, want %s", ErrProtocol, what, c.socket, ct, api.ContentTypeNDJSON)
	}
	// The stream lasts as long as the lease: no deadline from here on,
	// only ctx (its cancellation closes the connection) and Close.
	if err := rc.conn.SetDeadline(time.Time{}); err != nil || ctx.Err() != nil {
		rc.close()
		return nil, c.requestError(ctx, what, cmpErr(ctx.Err(), err), 0)
	}
	id := rc.resp.leaseID
	if api.ValidLeaseID(id) != nil {
		id = "" // not a lease id: as if mpsd had named none
	}
	return &Stream{ctx: ctx, rc: rc, dec: api.NewEventDecoder(rc.resp.body), leaseID: id}, nil
}

// Stream is one lease's event stream; closing it releases the lease.
type Stream struct {
	ctx     context.Context
	rc      *roundTrip
	dec     *api.EventDecoder
	leaseID string
}

// LeaseID is the lease mpsd named in the stream's answer (api.HeaderLeaseID),
// or "" if it named none (an mpsd from before the header).
func (s *Stream) LeaseID() string { return s.leaseID }

// Next returns the next event; see api.EventDecoder.Next for the
// results. Errors wrap ErrProtocol when mpsd sent a bad line or a bad
// chunk; io.EOF is an end without an error event (mpsd stopped); the
// Lease context's error once it is done; any other error a connection
// that ended in the middle (mpsd killed).
func (s *Stream) Next() (api.Event, error) {
	ev, err := s.dec.Next()
	switch {
	case err == nil, errors.Is(err, io.EOF):
	case errors.Is(err, api.ErrInvalid) || errors.Is(err, api.ErrTooLarge) || errors.Is(err, errChunked):
		return api.Event{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	case s.ctx.Err() != nil:
		return api.Event{}, s.ctx.Err()
	}
	return ev, err
}

// Close ends the stream and so releases the lease. It unblocks a Next in
// another goroutine.
func (s *Stream) Close() error {
	s.rc.close()
	return nil
}

// unary makes a request whose answer is one document.
func (c *Client) unary(ctx context.Context, method, path string, body []byte, out any) ([]byte, error) {
	what := method + " " + path
	rc, err := c.roundTrip(ctx, method, path, body, api.ContentTypeJSON, c.Timeout)
	if err != nil {
		return nil, err
	}
	defer rc.close()
	if rc.resp.status < 200 || rc.resp.status > 299 {
		return nil, c.refusal(ctx, rc, what)
	}
	raw, err := io.ReadAll(io.LimitReader(rc.resp.body, MaxResponseBytes+1))
	if err != nil {
		if errors.Is(err, errChunked) {
			return nil, fmt.Errorf("%w at %s: %s: %w", ErrBadAnswer, c.socket, what, err)
		}
		return nil, c.requestError(ctx, what, err, rc.timeout)
	}
	if len(raw) > MaxResponseBytes {
		return nil, fmt.Errorf("%w at %s: %s: answer larger than %d bytes", ErrBadAnswer, c.socket, what, MaxResponseBytes)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%w at %s: %s: %v", ErrBadAnswer, c.socket, what, err)
		}
	}
	return raw, nil
}

// roundTrip is one request on its own connection, its answer's headers
// read; close ends it.
type roundTrip struct {
	conn    net.Conn
	resp    *response
	stop    func() bool
	timeout time.Duration // the Timeout in force, for its message
	// end is Timeout's deadline, zero when none (the lease stream's).
	end time.Time
}

func (rc *roundTrip) close() {
	rc.stop()
	_ = rc.conn.Close()
}

// roundTrip dials, sends the request and reads the answer's headers.
// timeout, when set, bounds the whole exchange (the caller reads the body
// under it); the header wait is bounded by HeaderTimeout either way.
func (c *Client) roundTrip(ctx context.Context, method, path string, body []byte, accept string, timeout time.Duration) (*roundTrip, error) {
	return c.roundTripOn(ctx, nil, method, path, body, accept, timeout)
}

// roundTripOn is roundTrip on conn, already connected, unless it is nil.
func (c *Client) roundTripOn(ctx context.Context, conn net.Conn, method, path string, body []byte, accept string, timeout time.Duration) (*roundTrip, error) {
	what := method + " " + path
	switch err := ctx.Err(); {
	case err != nil && conn != nil:
		_ = conn.Close()
		return nil, c.requestError(ctx, what, err, 0)
	case conn == nil:
		if conn, err = c.dial(ctx, what, timeout); err != nil {
			return nil, err
		}
	}
	// ctx's end (cancel or deadline) interrupts whatever is blocked on
	// the connection: a deadline in the past fails reads and writes at
	// once, and requestError tells it from mpsd's doing by ctx.Err.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	rc := &roundTrip{conn: conn, stop: stop, timeout: timeout}
	// The deadline in force until the headers: Timeout's (headerDeadline
	// says so), or the header wait's if that ends first.
	now := time.Now()
	headerBy := now.Add(c.headerTimeout())
	var (
		end            time.Time
		headerDeadline time.Duration
	)
	if timeout > 0 {
		end = now.Add(timeout)
		if !headerBy.Before(end) {
			headerBy, headerDeadline = end, timeout
		}
	}
	if err := conn.SetDeadline(headerBy); err != nil || ctx.Err() != nil {
		rc.close()
		return nil, c.requestError(ctx, what, cmpErr(ctx.Err(), err), 0)
	}
	if _, err := conn.Write(encodeRequest(method, path, accept, body)); err != nil {
		rc.close()
		return nil, c.requestError(ctx, what, err, headerDeadline)
	}
	resp, err := readResponse(conn)
	if err != nil {
		rc.close()
		if errors.Is(err, errMalformed) {
			return nil, fmt.Errorf("%w: %s via %s: %w", ErrProtocol, what, c.socket, err)
		}
		return nil, c.requestError(ctx, what, err, headerDeadline)
	}
	rc.resp, rc.end = resp, end
	if c.served != nil {
		c.served.record(resp)
	}
	if err := conn.SetDeadline(end); err != nil || ctx.Err() != nil {
		rc.close()
		return nil, c.requestError(ctx, what, cmpErr(ctx.Err(), err), 0)
	}
	return rc, nil
}

// refusal reads the body of a non-2xx answer and returns mpsd's error.
// mpsd writes the body with the headers, so the read is bounded like the
// headers' (HeaderTimeout, or Timeout's deadline if sooner): a lease
// stream's connection has no deadline of its own, and a body that never
// comes would otherwise hold the caller (the launcher's reconnect) for as
// long as ctx lasts. A body that does not come whole leaves the status to
// say what it can (statusCode): a 503 stays a temporary refusal.
func (c *Client) refusal(ctx context.Context, rc *roundTrip, what string) error {
	wait := c.headerTimeout()
	by := time.Now().Add(wait)
	if !rc.end.IsZero() && rc.end.Before(by) {
		by, wait = rc.end, time.Until(rc.end)
	}
	// ctx's AfterFunc may have set a deadline in the past already: its
	// end is checked after this one is set, as roundTrip does.
	if err := rc.conn.SetDeadline(by); err != nil || ctx.Err() != nil {
		return c.requestError(ctx, what, cmpErr(ctx.Err(), err), 0)
	}
	body, err := io.ReadAll(io.LimitReader(rc.resp.body, api.MaxEventBytes))
	if err == nil {
		return api.DecodeError(rc.resp.status, bytes.NewReader(body))
	}
	if ctx.Err() != nil {
		// The caller's end, not mpsd's doing.
		return c.requestError(ctx, what, err, 0)
	}
	var (
		ne  net.Error
		why string
	)
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		why = "its error body did not come within " + wait.Round(time.Millisecond).String()
	case errors.Is(err, errChunked):
		why = "its error body broke the chunked encoding"
	default:
		why = "the connection ended in the middle of its error body"
	}
	return &api.Error{Code: statusCode(rc.resp.status),
		Message: fmt.Sprintf("%s via %s: mpsd answered %d, but %s", what, c.socket, rc.resp.status, why)}
}

// statusCode is the error code a refusal with status most likely carries,
// for one whose body could not be read: the temporary ones (mpsd's
// connection caps answer 429 or 503 over_limit, a stopping mpsd 503
// unavailable) keep their meaning, the others are CodeInternal, as
// api.DecodeError makes a body that is not an error.
func statusCode(status int) api.ErrorCode {
	switch status {
	case 429:
		return api.CodeOverLimit
	case 503:
		return api.CodeUnavailable
	}
	return api.CodeInternal
}

func (c *Client) headerTimeout() time.Duration {
	if c.HeaderTimeout > 0 {
		return c.HeaderTimeout
	}
	return DefaultHeaderTimeout
}

// cmpErr is the first non-nil error.
func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func hasPrefix(s, prefix string) bool { return len(s) >= len(prefix) && s[:len(prefix)] == prefix }

// dialError marks a failure to connect, as opposed to one after mpsd
// accepted the connection.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// unreachableError is ErrUnreachable with what was found: the reason in a
// few words, and whether the socket is absent (nothing to connect to at
// the path, or no permission to) rather than there with no mpsd answering
// on it. mpsd's socket outlives a restart (socket activation keeps it, a
// killed mpsd leaves it), so only an absent one may mean no mpsd at all.
type unreachableError struct {
	socket string
	reason string
	hint   string
	absent bool
	// cut: the connection was made, and ended before the answer (a
	// reset or EOF).
	cut bool
	err error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("%s at %s: %s%s", ErrUnreachable, e.socket, e.reason, e.hint)
}

func (e *unreachableError) Is(target error) bool { return target == ErrUnreachable }
func (e *unreachableError) Unwrap() error        { return e.err }

// timeoutError is a request that outlasted Client.Timeout.
type timeoutError struct {
	what, socket string
	timeout      time.Duration
	err          error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%s via %s: no answer within %v", e.what, e.socket, e.timeout)
}

func (e *timeoutError) Is(target error) bool { return target == ErrUnreachable }
func (e *timeoutError) Unwrap() error        { return e.err }

// interruptedError is a request whose context was canceled: never mpsd's
// doing.
type interruptedError struct {
	what, socket string
	err          error
}

func (e *interruptedError) Error() string {
	return fmt.Sprintf("%s via %s: interrupted", e.what, e.socket)
}
func (e *interruptedError) Unwrap() error { return e.err }

// SocketAbsent reports whether err, from a request, found no socket to
// connect to (as opposed to a socket with no mpsd answering).
func SocketAbsent(err error) bool {
	var ue *unreachableError
	return errors.As(err, &ue) && ue.absent
}

// requestError maps a failure of the exchange: ctx canceled (never
// mpsd's doing) reads "interrupted"; a deadline passing when the one in
// force was Timeout (timeout, when set) reads "no answer within"; a failure to connect, a reset or EOF before
// the answer, the caller's deadline or the header timeout passing are
// ErrUnreachable; anything else is wrapped as it is.
func (c *Client) requestError(ctx context.Context, what string, err error, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return &interruptedError{what: what, socket: c.socket, err: ctx.Err()}
	}
	ue := &unreachableError{socket: c.socket, hint: c.Hint, err: err}
	var (
		de    *dialError
		errno syscall.Errno
		ne    net.Error
	)
	timedOut := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
	switch {
	case timedOut && timeout > 0 && ctx.Err() == nil:
		return &timeoutError{what: what, socket: c.socket, timeout: timeout, err: err}
	case errors.As(err, &de) && !timedOut:
		ue.reason = de.err.Error()
		if errors.As(de.err, &errno) {
			ue.reason = errno.Error()
			ue.absent = errno == syscall.ENOENT || errno == syscall.ENOTDIR || errno == syscall.EACCES ||
				errno == syscall.EPERM || errno == syscall.ENOTSOCK || errno == syscall.EPROTOTYPE
		}
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED):
		ue.reason, ue.cut = "connection reset before mpsd answered", true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.EPIPE):
		ue.reason, ue.cut = "mpsd closed the connection before answering", true
	case timedOut:
		ue.reason = "mpsd accepted the connection but did not answer in time"
	default:
		return fmt.Errorf("%s via %s: %w", what, c.socket, err)
	}
	return ue
}
