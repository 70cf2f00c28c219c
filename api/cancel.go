package api

import (
	"fmt"
	"io"
	"time"
)

// PathCancel ends a lease for good (CancelRequest): a queued one leaves
// its queue, a running one is revoked and not requeued. Its owner or an
// admin.
const PathCancel = "/v1/cancel"

// Bounds of CancelRequest.
const (
	// DefaultCancelGrace is how long a cancel with a signal waits for the
	// workload to end before it kills what is left.
	DefaultCancelGrace = 10 * time.Second
	// MaxCancelGrace bounds CancelRequest.GraceMs.
	MaxCancelGrace = time.Hour
)

// CancelRequest is the body of PathCancel.
type CancelRequest struct {
	Lease string `json:"lease"`
	// Signal (a running lease), when not 0, is sent to the workload's
	// processes first (SIGTERM is 15); they are killed once they have not
	// ended within GraceMs (0: DefaultCancelGrace). Without it they are
	// killed at once.
	Signal  int   `json:"signal,omitempty"`
	GraceMs int64 `json:"grace_ms,omitempty"`
}

// Grace is the request's grace, DefaultCancelGrace when it names none.
func (r CancelRequest) Grace() time.Duration {
	if r.GraceMs == 0 {
		return DefaultCancelGrace
	}
	return time.Duration(r.GraceMs) * time.Millisecond
}

// Validate checks the lease id, the signal and the grace.
func (r CancelRequest) Validate() error {
	if err := ValidLeaseID(r.Lease); err != nil {
		return fmt.Errorf("%w: lease: %w", ErrInvalid, err)
	}
	if r.Signal < 0 || r.Signal > 64 {
		return fmt.Errorf("%w: signal %d is not a signal number (1-64)", ErrInvalid, r.Signal)
	}
	if r.GraceMs < 0 || r.GraceMs > MaxCancelGrace.Milliseconds() {
		return fmt.Errorf("%w: grace_ms %d is out of range 0-%d", ErrInvalid, r.GraceMs, MaxCancelGrace.Milliseconds())
	}
	return nil
}

// CancelResult answers PathCancel once the lease has ended.
type CancelResult struct {
	Lease string `json:"lease"`
	// Was is the state the cancel found it in: LeaseQueued, LeaseRunning,
	// or LeaseRevoking (a revocation had it: it ends when that is done,
	// instead of being requeued; the answer does not wait for it).
	Was string `json:"was"`
	// Signalled is how many of its processes the signal reached;
	// Killed says some were still there when the grace ran out (or no
	// signal was asked for) and were killed.
	Signalled int  `json:"signalled,omitempty"`
	Killed    bool `json:"killed,omitempty"`
}

// DecodeCancelRequest reads and validates a CancelRequest.
func DecodeCancelRequest(r io.Reader) (CancelRequest, error) {
	var q CancelRequest
	if err := decodeStrict(r, MaxRequestBytes, "cancel request", &q); err != nil {
		return CancelRequest{}, err
	}
	if err := q.Validate(); err != nil {
		return CancelRequest{}, err
	}
	return q, nil
}
