package mpsctl

import (
	"context"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
)

// DefaultTimeout bounds one request to mpsd when Config.Timeout is 0.
const DefaultTimeout = 30 * time.Second

// MaxResponseBytes bounds the body of one answer from mpsd (a status
// document of a large host stays far below it).
const MaxResponseBytes = client.MaxResponseBytes

// ErrUnreachable (package client's) is wrapped when mpsd's socket cannot
// be connected to, or mpsd did not answer; the message names the socket.
var ErrUnreachable = client.ErrUnreachable

// ErrBadAnswer (package client's) is wrapped when mpsd answered 2xx with
// a body that is not the document the request expects.
var ErrBadAnswer = client.ErrBadAnswer

// Client makes mpsctl's requests to mpsd: package client's, every
// request on its own connection, nothing pooled or retried.
type Client struct {
	*client.Client
}

// NewClient talks to mpsd at the unix socket path; timeout bounds each
// request (0 means DefaultTimeout).
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	c := client.New(socket)
	// Timeout bounds the whole request, the wait for the answer's
	// headers included (an admin request answers once it is done).
	c.Timeout, c.HeaderTimeout = timeout, timeout
	c.Hint = "; is it running?"
	return &Client{Client: c}
}

// Shutdown asks mpsd to shut the host's MPS service down (api.PathShutdown)
// and returns what it did; mpsd exits after answering. The request waits
// for the leases to end and the daemons to quit, so it is not bounded by
// the client's timeout alone: ShutdownTimeout is its bound.
func (c *Client) Shutdown(ctx context.Context) (api.ShutdownResult, error) {
	sc := *c.Client
	sc.Timeout = max(c.Timeout, ShutdownTimeout)
	sc.HeaderTimeout = sc.Timeout
	return sc.Shutdown(ctx)
}

// ShutdownTimeout bounds mpsctl shutdown's request: the leases' kills and
// the daemons' quits (about 30 s each at most) and mpsd's wait for leases
// already ending (a minute) fit in it.
const ShutdownTimeout = 3 * time.Minute
