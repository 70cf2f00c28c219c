// Package leasetest is the lease API as tests and their helper programs
// speak it raw: a request body encoded as a tenant may send it, and a
// stream read up to the event the caller waits for.
package leasetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mpsd/mpsd/api"
)

// Body is req as a tenant may send it: '<', '>' and '&' as themselves,
// not escaped to six bytes (the request's bound is on its bytes).
func Body(req api.LeaseRequest) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// Ask posts a lease request and reads its stream up to an event of type
// want (api.EventQueued or api.EventGranted), returning the stream, which
// holds the request or lease until closed, and the lease a grant named.
// An error event, a grant when a queued one was wanted, or the stream's
// end is an error, and the stream is closed.
func Ask(c *http.Client, body string, want api.EventType) (io.Closer, *api.Lease, error) {
	resp, err := c.Post("http://mpsd"+api.PathLeases, api.ContentTypeJSON, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		e := api.DecodeError(resp.StatusCode, resp.Body)
		_ = resp.Body.Close()
		return nil, nil, e
	}
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err != nil {
			_ = resp.Body.Close()
			return nil, nil, fmt.Errorf("the request's stream ended before a %s event: %w", want, err)
		}
		switch ev.Type {
		case want:
			return resp.Body, ev.Lease, nil
		case api.EventError:
			_ = resp.Body.Close()
			return nil, nil, fmt.Errorf("%s: %s", ev.Code, ev.Message)
		case api.EventGranted:
			_ = resp.Body.Close()
			return nil, nil, fmt.Errorf("granted, not %s: the room was free", want)
		}
	}
}
