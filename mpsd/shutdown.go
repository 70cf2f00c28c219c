package mpsd

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apihttp"
)

// shutdownDrainMax bounds how long a shutdown waits for the leases that
// were already ending (a recovery's revocation, a release) and for
// recoveries under way before it stops the daemons anyway.
const shutdownDrainMax = time.Minute

// errShutdownBusy: a shutdown is under way already.
var errShutdownBusy = errors.New("a shutdown is already under way")

// serveShutdown is mpsctl shutdown (api.PathShutdown): the whole MPS
// service of the host ends, and then mpsd does, removing its socket
// (unless systemd holds it) and the socket's live marker. SIGTERM, by
// contrast, stops mpsd only and leaves both for the next mpsd.
func (d *Daemon) serveShutdown(w http.ResponseWriter, r *http.Request) {
	if !d.requireAdmin(w, r) {
		return
	}
	if _, ok := readBody(w, r, d.opts.RequestTimeout, api.DecodeShutdownRequest); !ok {
		return
	}
	_, c, _ := d.credentials(r)
	res, err := d.shutdown(c.UID)
	if err != nil {
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, err.Error())
		return
	}
	// No mpsd is coming back: the socket (when mpsd listens itself) and
	// its live marker go before the answer, so a launcher started once
	// mpsctl shutdown returned fails at once instead of waiting for one.
	d.withdrawSocket()
	// The whole answer, its length known, is sent before Run is told to
	// stop (which closes the connections): the client never sees it cut.
	var body bytes.Buffer
	if err := jsonEncode(&body, res); err != nil {
		apihttp.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
	} else {
		w.Header().Set("Content-Type", api.ContentTypeJSON)
		w.Header().Set("Content-Length", strconv.Itoa(body.Len()))
		_, _ = w.Write(body.Bytes())
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	d.shutOnce.Do(func() { close(d.shutdownDone) })
}

// shutdown ends the host's MPS service, in the order the leases and MPS
// need:
//
//  1. no lease is granted or admitted any more (shuttingDown);
//  2. every queued request ends with CodeUnavailable;
//  3. every running lease is revoked through revoke (its launcher told,
//     terminate_client, its cgroup killed) and ends with CodeUnavailable
//     instead of being requeued;
//  4. leases already ending, and recoveries under way, are waited for
//     (at most shutdownDrainMax);
//  5. every control daemon quits (mps.Daemon.Stop);
//  6. the GPUs' compute modes are put back.
//
// The state file is written as Run stops, with no leases left.
func (d *Daemon) shutdown(uid uint32) (api.ShutdownResult, error) {
	d.mu.Lock()
	if d.shuttingDown {
		d.mu.Unlock()
		return api.ShutdownResult{}, errShutdownBusy
	}
	d.shuttingDown = true
	reason := fmt.Sprintf("mpsd is shutting down (mpsctl shutdown by uid %d)", uid)
	res := api.ShutdownResult{}
	res.Withdrawn = d.failQueuedLocked(reason)
	type batch struct {
		victims []*lease
		how     revokeHow
	}
	var batches []batch
	running := 0
	for _, in := range d.instanceList() {
		var victims []*lease
		for _, l := range in.leases {
			if l.state == leaseRunning {
				victims = append(victims, l)
			}
		}
		if len(victims) == 0 {
			continue
		}
		running += len(victims)
		slices.SortFunc(victims, func(a, b *lease) int { return int(a.req.Seq - b.req.Seq) })
		batches = append(batches, batch{victims, revokeHow{dm: in.daemon, servers: in.mps.pids(),
			end: &api.Error{Code: api.CodeUnavailable, Message: reason + "; the lease was revoked and its command stopped"}}})
	}
	d.mu.Unlock()
	d.log.Info("mpsd shutting down: ending the leases, then the MPS daemons", "by_uid", uid, "running", running, "queued", res.Withdrawn)

	var revoked atomic.Int64
	var wg sync.WaitGroup
	for _, b := range batches {
		wg.Go(func() { revoked.Add(int64(d.revoke(b.victims, reason, b.how))) })
	}
	wg.Wait()
	res.Revoked = int(revoked.Load())

	if left := d.awaitQuiet(reason); left != "" {
		res.Problems = append(res.Problems, left)
		d.log.Warn("shutdown goes on without waiting longer", "left", left)
	}

	// Each daemon is stopped by its instance's supervisor, the one owner
	// of its life cycle; they stop in parallel.
	d.mu.Lock()
	var stops []*instance
	var reqs []*stopRequest
	var skipped []string
	for _, in := range d.instanceList() {
		switch {
		case in.life == instUp && in.daemon != nil:
		case in.daemon != nil || in.bringing || in.handling != nil:
			// Still starting or recovering after the wait: its daemon,
			// there or to come, is not stopped here. Said, not counted.
			skipped = append(skipped, fmt.Sprintf("GPU %s group %s: %s; its control daemon was not stopped", gpuList(in), in.group, in.life))
			continue
		default:
			continue // no daemon runs
		}
		req := &stopRequest{dm: in.daemon, why: "mpsctl shutdown", done: make(chan stopResult, 1)}
		if !in.askStopLocked(req) {
			skipped = append(skipped, fmt.Sprintf("GPU %s group %s: %s; its control daemon was not stopped", gpuList(in), in.group, in.life))
			continue
		}
		stops = append(stops, in)
		reqs = append(reqs, req)
		in.daemon = nil
		in.mps.daemonGone()
		in.seen = clientUsage{}
	}
	late, lateProblems := d.lateStops, slices.Clone(d.lateProblems)
	d.mu.Unlock()
	problems := make([]string, len(stops))
	for i, in := range stops {
		var r stopResult
		select {
		case r = <-reqs[i].done:
		case <-in.done:
			// Its supervisor ended before it took the request (mpsd is
			// stopping): the daemon is stopped here.
			select {
			case r = <-reqs[i].done:
			default:
				r = d.stopDaemon(in, reqs[i])
			}
		}
		switch {
		case r.err != nil:
			problems[i] = fmt.Sprintf("GPU %s group %s: control daemon: %v", gpuList(in), in.group, r.err)
		case !r.rep.Graceful && !r.rep.AlreadyExited:
			problems[i] = fmt.Sprintf("GPU %s group %s: control daemon did not quit in time and was killed", gpuList(in), in.group)
		}
	}
	res.Daemons = len(stops) + late
	res.Problems = append(res.Problems, lateProblems...)
	for _, p := range problems {
		if p != "" {
			res.Problems = append(res.Problems, p)
		}
	}
	res.Problems = append(res.Problems, skipped...)
	if err := d.host.RestoreComputeModes(); err != nil {
		res.Problems = append(res.Problems, err.Error())
		d.log.Error("shutdown: compute modes not restored", "err", err)
	}
	d.log.Info("MPS service shut down; mpsd exits", "revoked", res.Revoked, "withdrawn", res.Withdrawn, "daemons", res.Daemons, "problems", len(res.Problems))
	return res, nil
}

// failQueuedLocked ends every queued request with CodeUnavailable and
// returns how many there were.
func (d *Daemon) failQueuedLocked(reason string) int {
	n := 0
	for g, q := range d.queues {
		d.queues[g] = nil
		for _, l := range q {
			l.logger().Info("lease request withdrawn", l.logAttrs("reason", reason)...)
			d.failLocked(l, api.EndedShutdown, api.CodeUnavailable, reason+"; the request was not granted")
			n++
		}
	}
	return n
}

// awaitQuiet waits until no lease is left and no recovery or bring-up
// of a daemon is under way, failing whatever a recovery requeues
// meanwhile; it returns what is left after shutdownDrainMax, "" when
// nothing is.
func (d *Daemon) awaitQuiet(reason string) string {
	deadline := d.clock.NewTimer(shutdownDrainMax)
	defer deadline.Stop()
	tick := d.clock.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		d.mu.Lock()
		d.failQueuedLocked(reason)
		busy := 0
		for _, in := range d.instanceList() {
			// A recovery, a stop (a restart for a changed start option;
			// a retired instance has left the list, its supervisor ends
			// its stop), an adoption waiting for its barrier, a start
			// under way: each ends with a daemon the stops below see, or
			// none.
			// (A recovery that has given up a restart, after the shutdown
			// began, waits for nothing: its instance has no daemon.)
			recovering := in.life == instRecovering && (in.handling != nil || len(in.pending) > 0 || in.daemon != nil)
			if recovering || in.life == instStopping || (in.life == instStarting && (in.daemon != nil || in.bringing)) {
				busy++
			}
		}
		leases := len(d.leases)
		d.mu.Unlock()
		if leases == 0 && busy == 0 {
			return ""
		}
		select {
		case <-tick.C():
		case <-deadline.C():
			return fmt.Sprintf("%d lease(s) still ending and %d instance(s) still starting, stopping or recovering after %s", leases, busy, shutdownDrainMax)
		}
	}
}
