package deviceplugin

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
	"time"

	"github.com/mpsd/mpsd/api"
)

// MPSD is what the plugin needs of mpsd: its status and lease streams.
// Client is the implementation over mpsd's API socket.
type MPSD interface {
	// Status returns mpsd's status document.
	Status(ctx context.Context) (api.Status, error)
	// Lease posts req and returns its event stream; the lease is held
	// until the stream is closed. A refusal before the stream starts is
	// an *api.Error.
	Lease(ctx context.Context, req api.LeaseRequest) (LeaseStream, error)
}

// LeaseStream is one lease's event stream (package api's grammar).
type LeaseStream interface {
	// Next returns the next event, io.EOF when mpsd ended the stream
	// without an error event (it stopped), or another error.
	Next() (api.Event, error)
	// Close ends the stream, which releases the lease unless mpsd is
	// stopping; it unblocks a Next in another goroutine.
	Close() error
}

var _ MPSD = (*Client)(nil)

// maxStatusBytes bounds a status document (mpsctl's bound).
const maxStatusBytes = 32 << 20

// Client speaks mpsd's HTTP API over its unix socket. Every request gets
// its own connection: a lease stream's connection is the lease.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient talks to mpsd at the unix socket path.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
		// mpsd answers the headers at once, before queueing.
		ResponseHeaderTimeout: 10 * time.Second,
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr}}
}

// Status fetches GET /v1/status.
func (c *Client) Status(ctx context.Context) (api.Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://mpsd"+api.PathStatus, nil)
	if err != nil {
		return api.Status{}, fmt.Errorf("deviceplugin: status request: %w", err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return api.Status{}, fmt.Errorf("deviceplugin: mpsd status via %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.Status{}, api.DecodeError(resp.StatusCode, resp.Body)
	}
	var st api.Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBytes)).Decode(&st); err != nil {
		return api.Status{}, fmt.Errorf("deviceplugin: mpsd status via %s: %w", c.socket, err)
	}
	return st, nil
}

// Lease posts req to POST /v1/leases. ctx bounds the stream's whole life.
func (c *Client) Lease(ctx context.Context, lr api.LeaseRequest) (LeaseStream, error) {
	body, err := json.Marshal(lr)
	if err != nil {
		return nil, fmt.Errorf("deviceplugin: encode lease request: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mpsd"+api.PathLeases, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("deviceplugin: lease request: %w", err)
	}
	req.Header.Set("Content-Type", api.ContentTypeJSON)
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("deviceplugin: lease via %s: %w", c.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		return nil, api.DecodeError(resp.StatusCode, resp.Body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, api.ContentTypeNDJSON) {
		_ = resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("deviceplugin: lease stream has content type %q, want %s", ct, api.ContentTypeNDJSON)
	}
	return &stream{body: resp.Body, cancel: cancel, dec: api.NewEventDecoder(resp.Body)}, nil
}

type stream struct {
	body   io.ReadCloser
	cancel context.CancelFunc
	dec    *api.EventDecoder
}

func (s *stream) Next() (api.Event, error) {
	ev, err := s.dec.Next()
	if err != nil && !errors.Is(err, io.EOF) {
		return api.Event{}, fmt.Errorf("deviceplugin: lease stream: %w", err)
	}
	return ev, err
}

func (s *stream) Close() error {
	s.cancel()
	return s.body.Close()
}
