package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/api"
)

// Client speaks the lease protocol of package api to mpsd over its unix
// socket. Every request gets its own connection: the lease stream's
// connection is the lease, and must never be shared or pooled.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient talks to mpsd at the unix socket path.
func NewClient(socket string) *Client {
	c := &Client{socket: socket}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", socket)
			if err != nil {
				return nil, &dialError{err: err}
			}
			return conn, nil
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
		// mpsd answers the headers at once, before queueing (package api),
		// so a silent daemon is a hung one.
		ResponseHeaderTimeout: 10 * time.Second,
	}
	c.hc = &http.Client{Transport: tr}
	return c
}

// dialError marks a failure to connect, as opposed to one after mpsd
// accepted the connection, so the message can name the socket plainly.
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
	absent bool
	err    error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("%s at %s: %s (is mpsd running? --socket or $%s names another socket)",
		ErrUnreachable, e.socket, e.reason, api.EnvSocket)
}

func (e *unreachableError) Is(target error) bool { return target == ErrUnreachable }
func (e *unreachableError) Unwrap() error        { return e.err }

// socketAbsent reports whether err, from a request, found no socket to
// connect to (as opposed to a socket with no mpsd answering).
func socketAbsent(err error) bool {
	var ue *unreachableError
	return errors.As(err, &ue) && ue.absent
}

// requestError turns an HTTP client error into ErrUnreachable when mpsd
// could not be connected to or ended the connection before its answer
// (what a restart does to a request in flight), or wraps it otherwise.
// ctx is the request's: its cancellation is never mpsd's doing, while its
// deadline passing means mpsd did not answer in time.
func (c *Client) requestError(ctx context.Context, what string, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("launcher: %s via %s: %w", what, c.socket, ctx.Err())
	}
	ue := &unreachableError{socket: c.socket, err: err}
	var (
		de    *dialError
		errno syscall.Errno
		ne    net.Error
	)
	switch {
	case errors.As(err, &de):
		ue.reason = de.err.Error()
		if errors.As(de.err, &errno) {
			ue.reason = errno.Error()
			ue.absent = errno == syscall.ENOENT || errno == syscall.ENOTDIR || errno == syscall.EACCES ||
				errno == syscall.EPERM || errno == syscall.ENOTSOCK || errno == syscall.EPROTOTYPE
		}
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED):
		ue.reason = "connection reset before mpsd answered"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.EPIPE):
		ue.reason = "mpsd closed the connection before answering"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		ue.reason = "mpsd accepted the connection but did not answer in time"
	default:
		return fmt.Errorf("launcher: %s via %s: %w", what, c.socket, err)
	}
	return ue
}

func (c *Client) post(ctx context.Context, path string, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("launcher: encode request for %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mpsd"+path, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("launcher: request %s: %w", path, err)
	}
	req.Header.Set("Content-Type", api.ContentTypeJSON)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.requestError(ctx, "POST "+path, err)
	}
	return resp, nil
}

// Lease posts req and returns its event stream. The lease (or the place
// in the queue) is held until the stream is closed, or ctx is done. A
// refusal before the stream starts is returned as an *api.Error.
func (c *Client) Lease(ctx context.Context, req api.LeaseRequest) (*Stream, error) {
	// The stream's own context lets Close abort a Next blocked in another
	// goroutine, whatever the transport does with a closed body.
	ctx, cancel := context.WithCancel(ctx)
	resp, err := c.post(ctx, api.PathLeases, req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		return nil, api.DecodeError(resp.StatusCode, resp.Body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, api.ContentTypeNDJSON) {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%w: lease stream has content type %q, want %s", ErrProtocol, ct, api.ContentTypeNDJSON)
	}
	return &Stream{body: resp.Body, cancel: cancel, dec: api.NewEventDecoder(resp.Body)}, nil
}

// Attach asks mpsd to move pid, a child of this process, into the cgroup
// of lease id. A refusal is returned as an *api.Error.
func (c *Client) Attach(ctx context.Context, id string, pid int) error {
	resp, err := c.post(ctx, api.AttachPath(id), api.AttachRequest{PID: pid})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return api.DecodeError(resp.StatusCode, resp.Body)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, api.MaxEventBytes))
	return nil
}

// Release asks mpsd to release lease id, whose command has ended, and
// waits for its answer: the lease is gone once it returns nil. A refusal
// is returned as an *api.Error.
func (c *Client) Release(ctx context.Context, id string) error {
	resp, err := c.post(ctx, api.ReleasePath(id), api.ShutdownRequest{})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return api.DecodeError(resp.StatusCode, resp.Body)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, api.MaxEventBytes))
	return nil
}

// Stream is one lease's event stream; closing it releases the lease.
type Stream struct {
	body   io.ReadCloser
	cancel context.CancelFunc
	dec    *api.EventDecoder
}

// Next returns the next event; see api.EventDecoder.Next for the
// results. Errors other than io.EOF wrap ErrProtocol when mpsd sent a bad
// line.
func (s *Stream) Next() (api.Event, error) {
	ev, err := s.dec.Next()
	if errors.Is(err, api.ErrInvalid) || errors.Is(err, api.ErrTooLarge) {
		return api.Event{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return ev, err
}

// Close ends the stream and so releases the lease. It unblocks a Next in
// another goroutine.
func (s *Stream) Close() error {
	s.cancel()
	return s.body.Close()
}
