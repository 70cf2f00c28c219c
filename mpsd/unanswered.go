package mpsd

import (
	"context"
	"time"
)

// A release while the daemon does not answer. A control daemon that stops
// answering (stopped, or stuck) stops passing on its servers' log records
// too: NVIDIA's logger is a thread of the same process, and the emulator's
// as well. A client that a fault killed meanwhile dies at once (its server
// tells it), so its launcher asks for the release of a command that seems
// to have ended by itself, and mpsd, which has not seen the fault's record,
// would release the lease: the job would end with its command's failure,
// never requeued. So a release of a lease whose instance's daemon failed
// its last probe waits until the daemon answers a probe again (its log
// flows again, and a fault's record takes the lease as usual: the claim
// wait before it in serveRelease) or is found hung, whose recovery revokes
// and requeues the lease (the release is then refused: the launcher waits
// for its revoked event). It waits at most until the hung verdict is due,
// with a margin, and never past maxUnansweredWait, within the launcher's
// release timeout.

// maxUnansweredWait bounds the wait of one release (mps-launch gives its
// release request 5 s).
const maxUnansweredWait = 4 * time.Second

// unansweredWait is how long a release may wait for the daemon whose
// probes have failed fails times in a row: the remaining probes until the
// hung verdict, each an interval apart and timeout long, and one interval
// more, at most maxUnansweredWait.
func unansweredWait(interval, timeout time.Duration, failures, fails int) time.Duration {
	left := max(failures-fails, 1)
	return min(time.Duration(left)*(interval+timeout)+interval, maxUnansweredWait)
}

// waitWhileUnanswered returns once l's instance's daemon answers its
// probes (or never failed one), a fault is coming for l, l is no longer
// running there, ctx ends, or the wait's bound passes.
func (d *Daemon) waitWhileUnanswered(ctx context.Context, l *lease) {
	unanswered := func(in *instance) bool { return in.life == instUp && in.probeFails > 0 }
	d.mu.Lock()
	in := l.inst
	if in == nil || l.state != leaseRunning || !unanswered(in) || l.revocationComingLocked(0) {
		d.mu.Unlock()
		return
	}
	wd := d.cfg.Watchdog
	wait := unansweredWait(wd.ProbeInterval, wd.ProbeTimeout, wd.ProbeFailures, in.probeFails)
	l.logger().Info("release waits: the instance's daemon does not answer, and a fault it has not passed on may have ended the command", l.logAttrs("failed_probes", in.probeFails, "wait", wait)...)
	d.mu.Unlock()
	deadline := d.clock.NewTimer(wait)
	defer deadline.Stop()
	d.waitOnBell(ctx, l, deadline, unanswered)
}
