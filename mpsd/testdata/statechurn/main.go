// Command statechurn is a test helper of package mpsd: it plays a group
// member who makes mpsd persist as much as it can, as whichever uid runs
// it.
//
//	statechurn -socket S -group G -hold N -cycles K [-sm P] [-cmd-bytes B]
//
// It takes one lease of -sm percent and holds it (the group's room),
// then queues N requests whose command is B bytes of '<' (which JSON
// spells in six), holding each, and prints "held N". Then it makes K
// more such requests one after the other, closing each as soon as mpsd
// answers it (queued), and prints "churned K". It holds what it held
// until its stdin ends.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/leasetest"
)

func main() {
	socket := flag.String("socket", "", "mpsd's API socket")
	group := flag.String("group", "", "the group to ask in")
	hold := flag.Int("hold", 0, "requests to queue and hold")
	cycles := flag.Int("cycles", 0, "requests to make and close")
	sm := flag.Int("sm", 100, "the held lease's sm, the group's room")
	cmdBytes := flag.Int("cmd-bytes", api.MaxCommandBytes, "bytes of each request's command")
	flag.Parse()
	c := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", *socket)
		},
	}}
	prog := "/bin/true"
	long := []string{prog, strings.Repeat("<", max(0, *cmdBytes-len(prog)))}
	var held []io.Closer
	h, err := ask(c, api.LeaseRequest{Group: *group, SM: *sm, MemBytes: 1 << 30, Command: []string{prog}}, api.EventGranted)
	if err != nil {
		fail("the lease that takes the room: %v", err)
	}
	held = append(held, h)
	for i := range *hold {
		h, err := ask(c, api.LeaseRequest{Group: *group, SM: *sm, MemBytes: 1 << 30, Command: long}, api.EventQueued)
		if err != nil {
			fail("queued request %d: %v", i, err)
		}
		held = append(held, h)
	}
	fmt.Printf("held %d\n", *hold)
	for i := range *cycles {
		h, err := ask(c, api.LeaseRequest{Group: *group, SM: *sm, MemBytes: 1 << 30, Command: long}, api.EventQueued)
		if err != nil {
			fail("request %d of the churn: %v", i, err)
		}
		_ = h.Close()
	}
	fmt.Printf("churned %d\n", *cycles)
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, h := range held {
		_ = h.Close()
	}
}

// ask sends a lease request and reads its stream up to an event of type
// want, returning the stream to hold.
func ask(c *http.Client, req api.LeaseRequest, want api.EventType) (io.Closer, error) {
	body, err := leasetest.Body(req)
	if err != nil {
		return nil, err
	}
	h, _, err := leasetest.Ask(c, body, want)
	return h, err
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "statechurn: "+format+"\n", args...)
	os.Exit(1)
}
