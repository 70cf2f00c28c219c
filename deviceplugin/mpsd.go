package deviceplugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
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

// Client is the plugin's view of package client's Client: every request
// on its own connection, a lease stream's connection being the lease.
type Client struct {
	c *client.Client
}

// NewClient talks to mpsd at the unix socket path.
func NewClient(socket string) *Client {
	return &Client{c: client.New(socket)}
}

// Status fetches GET /v1/status.
func (c *Client) Status(ctx context.Context) (api.Status, error) {
	st, _, err := c.c.Status(ctx)
	if err != nil {
		return api.Status{}, fmt.Errorf("deviceplugin: mpsd status: %w", err)
	}
	return st, nil
}

// Lease posts req to POST /v1/leases. ctx bounds the stream's whole life.
// A refusal before the stream starts is an *api.Error, as it is.
func (c *Client) Lease(ctx context.Context, lr api.LeaseRequest) (LeaseStream, error) {
	st, err := c.c.Lease(ctx, lr)
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) {
			return nil, err
		}
		return nil, fmt.Errorf("deviceplugin: lease: %w", err)
	}
	return st, nil
}
