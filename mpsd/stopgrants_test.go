package mpsd

import (
	"context"
	"testing"
)

// Grants are held once mpsd begins to stop (its stopping channel closed,
// or its context ended): a request that room frees for then stays queued
// in the state file for the next mpsd, which places it, rather than being
// granted on an instance whose recovery the stop cut short (the chaos soak
// met three leases granted so, 10 ms into a stop, on an instance whose
// server the interrupted recovery was restarting; the next mpsd found the
// server gone and revoked them for it).
func TestGrantsHeldWhileStopping(t *testing.T) {
	for _, how := range []string{"stopping", "context"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			d := &Daemon{ctx: ctx, stopping: make(chan struct{})}
			if d.grantsHeldLocked() || d.heldReasonLocked() != "" {
				t.Fatalf("a running mpsd holds grants: %q", d.heldReasonLocked())
			}
			if how == "stopping" {
				close(d.stopping)
			} else {
				cancel()
			}
			if !d.grantsHeldLocked() || d.heldReasonLocked() != "mpsd is stopping" {
				t.Fatalf("a stopping mpsd: grants held %v, reason %q; want held, \"mpsd is stopping\"", d.grantsHeldLocked(), d.heldReasonLocked())
			}
		})
	}
}
