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

// requestError turns an HTTP client error into ErrUnreachable naming the
// socket when the connection could not be made, or wraps it otherwise.
func (c *Client) requestError(what string, err error) error {
	var de *dialError
	if errors.As(err, &de) {
		reason := de.err.Error()
		var errno syscall.Errno
		if errors.As(de.err, &errno) {
			reason = errno.Error()
		}
		return fmt.Errorf("%w at %s: %s (is mpsd running? --socket or $%s names another socket)",
			ErrUnreachable, c.socket, reason, api.EnvSocket)
	}
	return fmt.Errorf("launcher: %s via %s: %w", what, c.socket, err)
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
		return nil, c.requestError("POST "+path, err)
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
