package mpsctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/api"
)

// DefaultTimeout bounds one request to mpsd when Config.Timeout is 0.
const DefaultTimeout = 30 * time.Second

// MaxResponseBytes bounds the body of one answer from mpsd (a status
// document of a large host stays far below it).
const MaxResponseBytes = 32 << 20

// ErrUnreachable is wrapped when mpsd's socket cannot be connected to;
// the message names the socket.
var ErrUnreachable = errors.New("cannot reach mpsd")

// ErrBadAnswer is wrapped when mpsd answered 2xx with a body that is not
// the document the request expects.
var ErrBadAnswer = errors.New("bad answer from mpsd")

// Client makes mpsctl's requests to mpsd over its unix socket. Every
// request gets its own connection; nothing is pooled or retried.
type Client struct {
	socket  string
	timeout time.Duration
	hc      *http.Client
}

// NewClient talks to mpsd at the unix socket path; timeout bounds each
// request (0 means DefaultTimeout).
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
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
	}
	return &Client{socket: socket, timeout: timeout, hc: &http.Client{Transport: tr, Timeout: timeout}}
}

// Socket is the path the client connects to.
func (c *Client) Socket() string { return c.socket }

// dialError marks a failure to connect, as opposed to one after mpsd
// accepted the connection.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// Get sends GET path and decodes the 2xx answer into out (when not nil),
// ignoring fields this version does not know. It returns the body as
// received. A non-2xx answer is returned as an *api.Error.
func (c *Client) Get(ctx context.Context, path string, out any) ([]byte, error) {
	return c.do(ctx, http.MethodGet, path, nil, out)
}

// Post sends body as JSON to path and decodes the 2xx answer into out
// (when not nil) like Get.
func (c *Client) Post(ctx context.Context, path string, body, out any) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode request for %s: %w", path, err)
	}
	return c.do(ctx, http.MethodPost, path, b, out)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) ([]byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://mpsd"+path, r)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", api.ContentTypeJSON)
	}
	req.Header.Set("Accept", api.ContentTypeJSON)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.requestError(ctx, method+" "+path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, api.DecodeError(resp.StatusCode, resp.Body)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return nil, c.requestError(ctx, method+" "+path, err)
	}
	if len(raw) > MaxResponseBytes {
		return nil, fmt.Errorf("%w at %s: %s %s: answer larger than %d bytes", ErrBadAnswer, c.socket, method, path, MaxResponseBytes)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%w at %s: %s %s: %v", ErrBadAnswer, c.socket, method, path, err)
		}
	}
	return raw, nil
}

// requestError names the socket plainly when the connection could not be
// made, says so when the request was interrupted (ctx canceled: SIGINT)
// or timed out, and wraps the error otherwise.
func (c *Client) requestError(ctx context.Context, what string, err error) error {
	var de *dialError
	if errors.As(err, &de) {
		reason := de.err.Error()
		var errno syscall.Errno
		if errors.As(de.err, &errno) {
			reason = errno.Error()
		}
		return fmt.Errorf("%w at %s: %s; is it running?", ErrUnreachable, c.socket, reason)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("%s via %s: interrupted", what, c.socket)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return fmt.Errorf("%s via %s: no answer within %v", what, c.socket, c.timeout)
		}
		err = ue.Err // its text repeats the method and a made-up URL
	}
	return fmt.Errorf("%s via %s: %w", what, c.socket, err)
}

// Status fetches the status document; raw is the body as mpsd sent it.
func (c *Client) Status(ctx context.Context) (st api.Status, raw []byte, err error) {
	raw, err = c.Get(ctx, api.PathStatus, &st)
	if err != nil {
		return api.Status{}, nil, err
	}
	return st, raw, nil
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

// Shutdown asks mpsd to shut the host's MPS service down (api.PathShutdown)
// and returns what it did; mpsd exits after answering. The request waits
// for the leases to end and the daemons to quit, so it is not bounded by
// the client's timeout alone: ShutdownTimeout is its bound.
func (c *Client) Shutdown(ctx context.Context) (api.ShutdownResult, error) {
	var res api.ShutdownResult
	sc := *c
	sc.timeout = max(c.timeout, ShutdownTimeout)
	hc := *c.hc
	hc.Timeout = sc.timeout
	sc.hc = &hc
	if _, err := sc.Post(ctx, api.PathShutdown, api.ShutdownRequest{}, &res); err != nil {
		return api.ShutdownResult{}, err
	}
	return res, nil
}

// ShutdownTimeout bounds mpsctl shutdown's request: the leases' kills and
// the daemons' quits (about 30 s each at most) and mpsd's wait for leases
// already ending (a minute) fit in it.
const ShutdownTimeout = 3 * time.Minute
