package mpsctl

import (
	"time"

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
	c.Timeout = timeout
	c.Hint = "; is it running?"
	return &Client{Client: c}
}
