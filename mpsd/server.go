package mpsd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apihttp"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/internal/units"
	"github.com/mpsd/mpsd/policy"
)

func fmtSize(b int64) string { return units.FormatSize(b) }

type peerKey struct{}

func (d *Daemon) newHTTPServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+api.PathLeases, d.serveLease)
	mux.HandleFunc("POST "+api.PathLeases+"/{id}/attach", d.serveAttach)
	mux.HandleFunc("GET "+api.PathStatus, d.serveStatus)
	mux.HandleFunc("GET "+api.PathVersion, d.serveVersion)
	mux.HandleFunc("POST "+api.PathDrain, func(w http.ResponseWriter, r *http.Request) { d.serveAdmin(w, r, true) })
	mux.HandleFunc("POST "+api.PathResume, func(w http.ResponseWriter, r *http.Request) { d.serveAdmin(w, r, false) })
	mux.HandleFunc("POST "+api.PathRestart, d.serveRestart)
	mux.HandleFunc("POST "+api.PathRequeue, d.serveRequeue)
	mux.HandleFunc("POST "+api.PathCancel, d.serveCancel)
	mux.HandleFunc("POST "+api.PathInjectXid, d.serveInjectXid)
	mux.HandleFunc("POST "+api.PathShutdown, d.serveShutdown)
	mux.HandleFunc("POST "+api.PathLeases+"/{id}/release", d.serveRelease)
	mux.HandleFunc("GET "+api.PathHistory, d.serveHistory)
	mux.HandleFunc("POST "+api.PathLeases+"/{id}/pod", d.serveBindPod)
	return &http.Server{
		Handler:           d.track(mux),
		ReadHeaderTimeout: d.opts.RequestTimeout,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			p, ok := peerOf(c)
			if !ok {
				return ctx
			}
			return context.WithValue(ctx, peerKey{}, p)
		},
	}
}

// track counts handlers in the daemon's goroutines, so Run waits for them.
//
// A request that declares a body has RequestTimeout to send it, from
// before its handler runs: net/http drains a body the handler did not read
// (status, a refused admin request, a path it does not know) before it
// writes the answer's headers, which a large answer does while its
// handler still writes, and without a deadline a client that declares a
// body and never sends it would hold the connection, and the handler, for
// ever. A handler that reads its body (readBody) lifts the deadline once
// it has it: a lease stream lives long.
//
// Every answer carries mpsd's version and API level (setVersionHeaders).
func (d *Daemon) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setVersionHeaders(w.Header())
		if r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d.opts.RequestTimeout))
		}
		if !d.enter() {
			apihttp.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "mpsd is stopping")
			return
		}
		defer d.leave()
		h.ServeHTTP(w, r)
	})
}

// credentials are the caller's uid and groups, all from the socket as the
// kernel recorded them when the caller connected (SO_PEERCRED,
// SO_PEERGROUPS): never from /proc, whose pid may since name another
// process. A group change applies to the next connection.
func (d *Daemon) credentials(r *http.Request) (peer, policy.Credentials, bool) {
	p, ok := r.Context().Value(peerKey{}).(peer)
	if !ok {
		return peer{}, policy.Credentials{}, false
	}
	return p, credentialsOf(p), true
}

// credentialsOf is p's uid with its primary and supplementary groups.
func credentialsOf(p peer) policy.Credentials {
	c := policy.Credentials{UID: p.uid, GIDs: []uint32{p.gid}}
	for _, g := range p.groups {
		if !slices.Contains(c.GIDs, g) {
			c.GIDs = append(c.GIDs, g)
		}
	}
	return c
}

// openRequest opens a handler: it identifies the caller by its peer
// credentials (403 when it cannot) and reads the request body with
// decode (readBody). ok false: the answer has been written.
func openRequest[T any](d *Daemon, w http.ResponseWriter, r *http.Request, decode func(io.Reader) (T, error)) (p peer, c policy.Credentials, req T, ok bool) {
	p, c, ok = d.credentials(r)
	if !ok {
		apihttp.WriteError(w, http.StatusForbidden, api.CodeForbidden, "cannot identify the caller (no peer credentials)")
		return p, c, req, false
	}
	req, ok = readBody(w, r, d.opts.RequestTimeout, decode)
	return p, c, req, ok
}

// readBody gives the client timeout to send its body, then lifts the
// deadline again: a lease stream's connection lives long.
func readBody[T any](w http.ResponseWriter, r *http.Request, timeout time.Duration, decode func(io.Reader) (T, error)) (T, bool) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(timeout))
	v, err := decode(r.Body)
	if err != nil {
		// The deadline stays: the server drains an unread body after the
		// handler, and a client that never sends it must not hold the
		// connection open.
		status, code, msg := http.StatusBadRequest, api.CodeBadRequest, err.Error()
		switch {
		case errors.Is(err, api.ErrTooLarge):
			status, code = http.StatusRequestEntityTooLarge, api.CodeTooLarge
		case errors.Is(err, os.ErrDeadlineExceeded):
			// A client that stalls is not waited for again.
			w.Header().Set("Connection", "close")
			status, msg = http.StatusRequestTimeout, fmt.Sprintf("request body not received within %s", timeout)
		}
		apihttp.WriteError(w, status, code, msg)
		return v, false
	}
	_ = rc.SetReadDeadline(time.Time{})
	return v, true
}

func (d *Daemon) serveLease(w http.ResponseWriter, r *http.Request) {
	p, c, req, ok := openRequest(d, w, r, api.DecodeLeaseRequest)
	if !ok {
		return
	}
	d.users.resolve(c.UID) // before Daemon.mu: admit and resume read the cache
	var l *lease
	if req.ResumeLeaseID != "" {
		var err error
		if l, err = d.resume(c, req); err != nil {
			var rf *refusal
			errors.As(err, &rf)
			apihttp.WriteError(w, rf.status, rf.code, rf.msg)
			return
		}
	} else {
		if rf := d.reserveQueued(c.UID); rf != nil {
			d.log.Info("lease refused", "uid", c.UID, "pid", p.pid, "group", req.Group, "reason", rf.msg)
			apihttp.WriteError(w, rf.status, rf.code, rf.msg)
			return
		}
		var err error
		l, err = d.admit(c, req)
		d.unreserveQueued(c.UID)
		if err != nil {
			var rf *refusal
			errors.As(err, &rf)
			d.log.Info("lease refused", "uid", c.UID, "pid", p.pid, "group", req.Group, "reason", rf.msg)
			if l != nil {
				d.awaitRecorded(r.Context(), l) // withdrawn (--no-wait): told once the history has it
			}
			apihttp.WriteError(w, rf.status, rf.code, rf.msg)
			return
		}
	}
	d.streamLease(w, r, l, req, p)
}

// streamLease writes the lease's events until it ends with an error, its
// launcher goes away (the lease is released) or mpsd stops (it is kept
// for the launcher to resume).
//
// The first grant of a new request attaches its attach_pid, if any,
// before the event is written: the launcher then has no attach to send.
func (d *Daemon) streamLease(w http.ResponseWriter, r *http.Request, l *lease, req api.LeaseRequest, p peer) {
	d.mu.Lock()
	l.launcherPID = p.pid
	d.mu.Unlock()
	w.Header().Set("Content-Type", api.ContentTypeNDJSON)
	w.Header().Set(api.HeaderLeaseID, l.id)
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	var waitC <-chan time.Time
	if req.WaitMillis > 0 {
		t := d.clock.NewTimer(time.Duration(req.WaitMillis) * time.Millisecond)
		defer t.Stop()
		waitC = t.C()
	}
	ctx := r.Context()
	attachPID := req.AttachPID
	if req.ResumeLeaseID != "" {
		attachPID = 0
	}
	for {
		for _, ev := range l.box.take() {
			if ev.Type == api.EventGranted {
				d.mu.Lock()
				durable := l.durable
				d.mu.Unlock()
				if durable != nil && !d.awaitDurable(ctx, w, l, durable, req, waitC) {
					d.endStream(l)
					return
				}
				waitC = nil
				if pid := attachPID; pid != 0 && ev.Lease != nil {
					attachPID = 0
					ev = d.attachAtGrant(l, p, ev, pid)
				}
			}
			if ev.Type == api.EventError {
				d.awaitRecorded(ctx, l) // its end is told once the history has it
			}
			if err := api.WriteEvent(w, ev); err != nil {
				d.endStream(l)
				return
			}
			if ev.Type == api.EventError {
				return
			}
		}
		select {
		case <-l.box.sig:
		case <-waitC:
			d.mu.Lock()
			d.timeoutLocked(l, time.Duration(req.WaitMillis)*time.Millisecond)
			d.mu.Unlock()
		case <-ctx.Done():
			d.endStream(l)
			return
		}
	}
}

// attachAtGrant moves pid into the lease that ev grants, as an attach of
// its attempt, and returns ev naming it; if the attach is refused, ev as
// it was (the launcher's own attach then meets the refusal and says it).
func (d *Daemon) attachAtGrant(l *lease, p peer, ev api.Event, pid int) api.Event {
	// Running at that attempt still, as an attach request is checked: a
	// revocation that began since the grant was queued (it waits for a
	// state write, then asks MPS to end the clients) must not have a
	// client started under it.
	d.mu.Lock()
	current := l.state == leaseRunning && l.attempt == ev.Lease.Attempt
	d.mu.Unlock()
	if !current {
		return ev
	}
	if rf := d.attachChild(l, p, ev.Lease.Attempt, ev.Lease.Attempt, pid); rf != nil {
		d.log.Debug("attach with the grant refused", "lease", l.id, "group", l.group, "pid", pid, "attempt", ev.Lease.Attempt, "reason", rf.msg)
		return ev
	}
	al := *ev.Lease
	al.AttachedPID = pid
	ev.Lease = &al
	return ev
}

// endStream: the stream is over without an error event. If mpsd is
// stopping the lease stays for its launcher to resume; otherwise the
// launcher went away and the lease is released.
func (d *Daemon) endStream(l *lease) {
	select {
	case <-d.stopping:
		d.mu.Lock()
		l.bound, l.launcherPID = false, 0
		d.mu.Unlock()
		return
	default:
	}
	d.release(l, "launcher disconnected")
}

// resume re-binds a launcher to its lease after mpsd restarted. A lease
// still running the launcher's attempt is confirmed with granted; one a
// fault revoked meanwhile is told so (revoked, requeued to the current
// attempt, then granted or its place in the queue), so the launcher
// follows as if it had never been away.
func (d *Daemon) resume(c policy.Credentials, req api.LeaseRequest) (*lease, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shuttingDown {
		return nil, &refusal{503, api.CodeUnavailable, "mpsd is shutting down (mpsctl shutdown)"}
	}
	l, ok := d.leases[req.ResumeLeaseID]
	if !ok {
		if r := d.takeAwayEndLocked(req.ResumeLeaseID, c.UID); r != nil {
			return nil, r
		}
	}
	if !ok || l.state == leaseReleasing {
		return nil, &refusal{404, api.CodeNotFound, fmt.Sprintf("lease %s is not known to mpsd (it ended or was lost)", req.ResumeLeaseID)}
	}
	if l.uid != c.UID {
		return nil, &refusal{403, api.CodeForbidden, fmt.Sprintf("lease %s belongs to another user", req.ResumeLeaseID)}
	}
	if l.bound {
		return nil, &refusal{409, api.CodeConflict, fmt.Sprintf("lease %s is held by another connection", req.ResumeLeaseID)}
	}
	if _, err := d.cfg.Access.Choose(c, l.group); err != nil {
		// The config in force no longer lets the caller use the group
		// (membership.go): a queued lease is withdrawn, a running one is
		// left to its reconnect grace, which releases it.
		msg := fmt.Sprintf("lease %s is not resumed: uid %d is no longer a member of group %s (the config was changed)", l.id, c.UID, l.group)
		if l.state == leaseQueued && !l.running() {
			d.dequeueLocked(l, "uid no longer a member of its group")
			d.store.request()
		}
		d.log.Info("resume refused: its uid is no longer a member of its group", l.logAttrs("group", l.group)...)
		return nil, &refusal{403, api.CodeRefused, msg}
	}
	l.willAttach = req.WillAttach
	d.resumeOrphanLocked(l, req)
	if req.Attempt > l.attempt {
		return nil, &refusal{404, api.CodeNotFound, fmt.Sprintf("lease %s is at attempt %d, not %d", l.id, l.attempt, req.Attempt)}
	}
	if l.grace != nil {
		l.grace.Stop()
		l.grace = nil
	}
	// A revocation under way may have marked it abandoned (the grace
	// ran out first): its launcher is back, so it is requeued after all.
	l.bound, l.awaySince, l.abandoned = true, time.Time{}, false
	l.user = d.users.cached(l.uid)
	// The launcher is told where the lease stands now, not every event
	// since it left: a history replayed across restarts could grant it an
	// attempt that was revoked long ago.
	l.box.reset()
	revokedFor := l.revokedFor
	if revokedFor == "" {
		revokedFor = "a fault while mps-launch was reconnecting"
	}
	if req.Attempt < l.attempt || l.state == leaseRevoking {
		l.box.push(api.Event{Type: api.EventRevoked, Reason: revokedFor})
	}
	if req.Attempt < l.attempt {
		l.box.push(api.Event{Type: api.EventRequeued, Attempt: l.attempt})
	}
	switch {
	case l.state == leaseRunning && (l.inst.life == instRecovering || len(l.inst.pending) > 0):
		// A fault was found on its instance (one logged while mpsd was
		// away, say) and its recovery has yet to take the lease: the
		// revocation is on its way, a confirmation now would be false.
	case l.state == leaseRunning:
		l.box.push(api.Event{Type: api.EventGranted, Lease: l.apiLeaseLocked()})
	case !l.running():
		l.position, l.waitReason = 0, ""
		d.positionsLocked(l.group)
	}
	d.log.Info("launcher resumed its lease", "lease", l.id, "attempt", l.attempt, "running", l.running())
	return l, nil
}

func (d *Daemon) serveAttach(w http.ResponseWriter, r *http.Request) {
	p, _, req, ok := openRequest(d, w, r, api.DecodeAttachRequest)
	if !ok {
		return
	}
	id := r.PathValue("id")
	d.mu.Lock()
	l, found := d.leases[id]
	var running bool
	var attempt int
	if found {
		running = l.state == leaseRunning
		attempt = l.attempt
	}
	d.mu.Unlock()
	switch {
	case !callersLease(w, l, found, p.uid, id):
		return
	case !running:
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is not running", id))
		return
	}
	if rf := d.attachChild(l, p, attempt, req.Attempt, req.PID); rf != nil {
		apihttp.WriteError(w, rf.status, rf.code, rf.msg)
		return
	}
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	_, _ = w.Write([]byte("{}\n"))
}

// attachChild moves pid, which must be a living child of the caller p of
// p's uid, into lease l for attempt want (0: the lease's current),
// as an attach request or a lease request's attach_pid asks; attempt is
// the lease's attempt as the caller last read it. It refuses with what to
// answer.
func (d *Daemon) attachChild(l *lease, p peer, attempt, want, pid int) *refusal {
	id := l.id
	// Only the caller's own child: a user must never move someone else's
	// process (or its own unrelated one) into a lease. The pidfd comes
	// first: what /proc says of the pid is the pidfd's process's only if
	// that process is still alive after the reading.
	notChild := fmt.Sprintf("pid %d is not a child of the calling process %d", pid, p.pid)
	h, err := openPid(d.proc, pid)
	switch {
	case errors.Is(err, unix.ESRCH) || errors.Is(err, os.ErrNotExist):
		return &refusal{http.StatusForbidden, api.CodeForbidden, notChild}
	case err != nil:
		d.log.Error("attach: cannot hold the pid", "lease", id, "pid", pid, "err", err)
		return &refusal{http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("pid %d: %v", pid, err)}
	}
	defer h.close()
	st, err := readProcStatus(d.proc, pid)
	if err != nil || st.ppid != p.pid || st.uid != p.uid {
		return &refusal{http.StatusForbidden, api.CodeForbidden, notChild}
	}
	if !h.alive() {
		return &refusal{http.StatusConflict, api.CodeConflict, fmt.Sprintf("pid %d has exited; nothing was attached", pid)}
	}
	if d.opts.attachSwap != nil {
		pid = d.opts.attachSwap(pid)
	}
	// The check that the process moved is the one checked runs under the
	// lease's cgMu with the move: a kill of the lease (a release on
	// another connection, the stream's end) waits for it, so a process
	// that took a reused pid is moved back before any kill could hit it.
	same := func() error { return d.attachedSameLocked(l, h, pid, p.pid) }
	if err := d.attach(l, want, pid, same); err != nil {
		if errors.Is(err, errNotAttached) || errors.Is(err, errStaleAttempt) {
			return &refusal{http.StatusConflict, api.CodeConflict, err.Error()}
		}
		if errors.Is(err, errLeaseEnding) {
			// Revoked or released since the caller's look.
			return &refusal{http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is not running", id)}
		}
		d.log.Error("attach failed", "lease", id, "pid", pid, "err", err)
		return &refusal{http.StatusInternalServerError, api.CodeInternal, err.Error()}
	}
	d.mu.Lock()
	l.ranAttempt = attempt
	d.mu.Unlock()
	return nil
}

// callersLease reports whether lease id was found and is uid's; if not,
// it answers the request (404 or 403).
func callersLease(w http.ResponseWriter, l *lease, found bool, uid uint32, id string) bool {
	switch {
	case !found:
		apihttp.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no lease %s", id))
		return false
	case l.uid != uid:
		apihttp.WriteError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("lease %s is not yours", id))
		return false
	}
	return true
}

// serveRelease releases the caller's lease at once for a launcher whose
// command has ended (api.ReleasePath), and answers once the lease is gone:
// status no longer shows it by the time the launcher exits. Closing the
// stream does the same, a moment after the launcher is gone.
func (d *Daemon) serveRelease(w http.ResponseWriter, r *http.Request) {
	p, _, q, ok := openRequest(d, w, r, api.DecodeReleaseRequest)
	if !ok {
		return
	}
	id := r.PathValue("id")
	var l *lease
	for waited := false; ; waited = true {
		d.mu.Lock()
		var found bool
		l, found = d.leases[id]
		var at int
		var claim <-chan struct{}
		if found {
			at = l.attempt
			if !waited {
				claim = l.claimNamingLocked()
			}
		}
		d.mu.Unlock()
		switch {
		case !callersLease(w, l, found, p.uid, id):
			return
		case q.Attempt > at:
			apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is at attempt %d, not %d", id, at, q.Attempt))
			return
		}
		if claim == nil {
			break
		}
		// A fault record that would take the lease waits for the Xid that
		// would confirm it: the command may have died of that fault, so
		// the answer waits for the record's fate.
		t := d.clock.NewTimer(faultClaimWait + time.Second)
		select {
		case <-claim:
		case <-t.C():
		case <-r.Context().Done():
			t.Stop()
			return
		}
		t.Stop()
	}
	// Without the instance's log, a fault that ended the command can be
	// seen only in its Xid (loglost.go); while its daemon does not
	// answer, only once it does again or is found hung (unanswered.go).
	d.waitXidIfLogLost(r.Context(), l)
	d.waitWhileUnanswered(r.Context(), l)
	if r.Context().Err() != nil {
		// The wait ended with the request: mpsd is stopping (its own stop
		// releases nothing: the next mpsd, which the launcher asks again,
		// learns what ended the command), or the launcher has gone (its
		// stream's end releases the lease). Released now, a command a
		// fault killed would pass for one that ended by itself (the chaos
		// soak met it: mpsd stopped while releases waited for a daemon
		// that did not answer, and four jobs ended with their commands'
		// CUDA error, unrequeued).
		return
	}
	revoking := false
	var cancelled *api.Error
	d.releaseUnless(l, releaseCommandEnded, func(l *lease) bool {
		revoking = l.revocationComingLocked(q.Attempt)
		if revoking && l.endWith != nil && l.endWith.Code == api.CodeCancelled {
			e := *l.endWith
			cancelled = &e
		}
		if revoking {
			l.logger().Info("release refused: the lease is being revoked; its launcher waits for the revocation", l.logAttrs("attempt", q.Attempt)...)
		} else {
			l.exitStatus, l.exitSignal = q.ExitStatus, q.Signal
		}
		return revoking
	})
	if cancelled != nil {
		// A cancel's revocation has it (its signal may have ended the
		// command, even with status 0, before its launcher read the
		// revoked event): the launcher ends as cancelled, not with the
		// command's status.
		apihttp.WriteError(w, http.StatusConflict, cancelled.Code, cancelled.Message)
		return
	}
	if revoking {
		// Its launcher's command failed because of the fault: the revoked
		// event is on its way (perhaps behind the revocation's state
		// write), or came already, and the launcher waits for it instead
		// of taking the failure as the command's own.
		apihttp.WriteError(w, http.StatusConflict, api.CodeRevoking, fmt.Sprintf("lease %s is being revoked", id))
		return
	}
	d.mu.Lock()
	left := d.leases[id] == l
	d.mu.Unlock()
	if left {
		apihttp.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("lease %s is still ending (its processes have not died yet)", id))
		return
	}
	d.awaitRecorded(r.Context(), l)
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	_, _ = w.Write([]byte("{}\n"))
}

// reserveQueued admits one more request of uid towards its
// limits.queued_per_user, or refuses it; unreserveQueued ends the
// reservation once the request is queued (or refused).
func (d *Daemon) reserveQueued(uid uint32) *refusal {
	if uid == 0 {
		// Root is trusted with mpsd itself; the cap is for local users.
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.res.admitting[uid]
	for _, l := range d.leases {
		if l.uid == uid && !l.running() {
			n++
		}
	}
	if most := d.cfg.Limits.QueuedPerUser; n >= most {
		d.metrics.queueRefused.Inc()
		return &refusal{http.StatusTooManyRequests, api.CodeOverLimit,
			fmt.Sprintf("uid %d has %d lease requests queued, the most limits.queued_per_user (%d) allows; try again once some are granted or withdrawn", uid, n, most)}
	}
	d.res.admitting[uid]++
	return nil
}

func (d *Daemon) unreserveQueued(uid uint32) {
	if uid == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.res.admitting[uid]--; d.res.admitting[uid] <= 0 {
		delete(d.res.admitting, uid)
	}
}

// serveStatus answers the whole status to admins and the caller's own
// view to everyone else (api/doc.go has the rule).
func (d *Daemon) serveStatus(w http.ResponseWriter, r *http.Request) {
	_, c, ok := d.credentials(r)
	d.mu.Lock()
	admin := ok && d.cfg.Access.Admin(c)
	d.mu.Unlock()
	st := d.Status()
	if !admin {
		uid := c.UID
		if !ok {
			uid = math.MaxUint32 // nobody's leases
		}
		st = ownView(st, uid)
	}
	v := builtVersion()
	st.Mpsd = &v
	writeJSON(w, st)
}

// ownView is st as a non-admin uid may see it: its own leases in full,
// every group's running and queued counts, the instances without pids.
func ownView(st api.Status, uid uint32) api.Status {
	out := api.Status{Instances: make([]api.InstanceStatus, 0, len(st.Instances)), Leases: []api.LeaseStatus{},
		Queue: st.Queue, Running: map[string]int{}, OwnOnly: true, SchemaVersion: st.SchemaVersion, At: st.At}
	for g := range st.Queue {
		out.Running[g] = 0
	}
	for _, l := range st.Leases {
		if l.State == api.LeaseRunning {
			out.Running[l.Group]++
		}
		if l.UID == uid {
			out.Leases = append(out.Leases, l)
		}
	}
	for _, in := range st.Instances {
		in.DaemonPID, in.ServerPIDs, in.Servers = 0, []int{}, nil
		// What MPS serves beside the leases names other users' processes
		// and uids.
		in.Unleased, in.UnleasedMemBytes, in.MemUsedBytes, in.ServingUID = nil, 0, nil, nil
		// The last failure's reason names processes (a server's pid,
		// another tenant's); the count and window are everyone's.
		if before, _, found := strings.Cut(in.QuarantineReason, lastFailure); found {
			in.QuarantineReason = before + " (an admin's status names the last)"
		}
		// A start error may name processes and paths: that there is one
		// is everyone's.
		if in.LastStartError != "" {
			in.LastStartError = hiddenStartError
		}
		out.Instances = append(out.Instances, in)
	}
	return out
}

// lastFailure joins, in a quarantine's reason, the failures' count and
// window to the last one's reason, which only admins see.
const lastFailure = "; the last: "

// hiddenStartError is a non-admin's LastStartError.
const hiddenStartError = "the control daemon does not start (an admin's status names why)"

// Status is the document of GET /v1/status.
func (d *Daemon) Status() api.Status {
	d.mu.Lock()
	st := api.Status{Instances: []api.InstanceStatus{}, Leases: []api.LeaseStatus{}, Queue: map[string]int{},
		SchemaVersion: api.StatusSchemaVersion, At: d.clock.Now()}
	for _, in := range d.instanceList() {
		st.Instances = append(st.Instances, in.statusLocked())
	}
	var ls []*lease
	for _, l := range d.leases {
		ls = append(ls, l)
		st.Leases = append(st.Leases, l.statusLocked())
	}
	for _, g := range d.cfg.Groups {
		st.Queue[g.Name] = len(d.queues[g.Name])
	}
	d.mu.Unlock()
	for i, l := range ls {
		if st.Leases[i].State == api.LeaseRunning {
			st.Leases[i].PIDs = d.leasePids(l)
			st.Leases[i].Pod = d.podRef(l.id)
			if st.Leases[i].Pod != nil {
				st.Leases[i].LauncherPID = 0 // the device plugin's stream
			}
		}
	}
	slices.SortFunc(st.Leases, func(a, b api.LeaseStatus) int { return strings.Compare(a.ID, b.ID) })
	return st
}

// requireAdmin answers 403 unless the caller is an admin of the config in
// force.
func (d *Daemon) requireAdmin(w http.ResponseWriter, r *http.Request) bool {
	_, c, ok := d.credentials(r)
	d.mu.Lock()
	admin := ok && d.cfg.Access.Admin(c)
	d.mu.Unlock()
	if !admin {
		apihttp.WriteError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("uid %d is not an mpsd admin (admins in the config)", c.UID))
	}
	return admin
}

func (d *Daemon) serveAdmin(w http.ResponseWriter, r *http.Request, drain bool) {
	if !d.requireAdmin(w, r) {
		return
	}
	t, ok := readBody(w, r, d.opts.RequestTimeout, api.DecodeAdminTarget)
	if !ok {
		return
	}
	var rec drainRecord
	if drain {
		p, _, _ := d.credentials(r)
		rec = drainRecord{reason: t.Reason, by: d.users.who(p.uid, true), at: d.clock.Now()}
		if rec.reason == "" {
			rec.reason = noDrainReason
		}
	}
	res, err := d.setDrained(t, drain, rec)
	if err != nil {
		adminError(w, err)
		return
	}
	// Saved before the answer: a drain (or resume) mpsctl reports holds
	// across any restart of mpsd.
	if err := d.persistIntent(r.Context()); err != nil {
		apihttp.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
		return
	}
	writeJSON(w, res)
}

// matchInstances returns the instances t names, in key order.
func (d *Daemon) matchInstances(t api.AdminTarget) ([]*instance, error) {
	var idx []int
	if t.GPU != "" {
		sel, err := d.host.Select([]string{t.GPU})
		if err != nil {
			return nil, fmt.Errorf("gpu %q: %w", t.GPU, err)
		}
		for _, g := range sel {
			idx = append(idx, g.Index)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.cfg.Group(t.Group); t.Group != "" && !ok {
		return nil, fmt.Errorf("unknown group %q", t.Group)
	}
	var out []*instance
	for _, in := range d.instanceList() {
		if t.Group != "" && in.group != t.Group {
			continue
		}
		if idx != nil && !slices.ContainsFunc(in.p.GPUs, func(x int) bool { return slices.Contains(idx, x) }) {
			continue
		}
		out = append(out, in)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no instance matches gpu %q group %q", t.GPU, t.Group)
	}
	return out, nil
}

// setDrained drains (with rec, its record) or resumes the instances t
// names. Resume also lifts a quarantine. A drain of a drained instance
// changes nothing but its reason (when rec gives another one) and says it
// was drained already; a resume of one neither drained nor quarantined
// lifts nothing and says so.
func (d *Daemon) setDrained(t api.AdminTarget, drain bool, rec drainRecord) (api.AdminResult, error) {
	insts, err := d.matchInstances(t)
	if err != nil {
		return api.AdminResult{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	res := api.AdminResult{Instances: []api.InstanceStatus{}}
	groups := map[string]bool{}
	if !drain {
		res.Lifted = []api.Lifted{}
	}
	for _, in := range insts {
		var lifted api.Lifted
		already := drain && in.holds.drained
		switch {
		case !drain:
			lifted.Drain = in.holds.drained
			in.drain = drainRecord{}
		case already && rec.reason != noDrainReason && rec.reason != in.drain.reason:
			in.log.Info("drain reason changed by admin", "reason", rec.reason, "was", in.drain.reason, "user", rec.by)
			in.drain.reason = rec.reason
		case !already:
			in.drain = rec
		}
		in.holds.drained = drain
		if !drain && in.holds.quarantined {
			lifted.Quarantine, lifted.QuarantineReason = true, in.statusLocked().QuarantineReason
			in.holds.quarantined = false
			in.failures = nil
			in.quarantinedFor = ""
			d.store.request()
			in.log.Info("quarantine lifted by admin", "was", lifted.QuarantineReason)
		}
		if !drain && len(in.barred) > 0 {
			in.log.Info("uid bars lifted by admin", "uids", in.barredUIDs(d.clock.Now()))
			in.liftBarsLocked()
			d.store.request()
		}
		groups[in.group] = true
		res.Instances = append(res.Instances, in.statusLocked())
		if !drain {
			res.Lifted = append(res.Lifted, lifted)
		} else {
			res.Already = append(res.Already, already)
		}
		switch {
		case !drain:
			in.log.Info("instance resumed by admin", "state", in.shownState(), "lifted_drain", lifted.Drain, "lifted_quarantine", lifted.Quarantine)
		case !already:
			in.log.Info("instance drained by admin", "state", in.shownState(), "reason", rec.reason, "user", rec.by)
		}
	}
	for g := range groups {
		if drain {
			// Nothing more fits, but the queued leases' reason changed.
			d.positionsLocked(g)
		} else {
			d.scheduleLocked(g)
		}
	}
	return res, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	if err := jsonEncode(w, v); err != nil {
		apihttp.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
	}
}

// errNotAttached is wrapped by an attach whose move did not take the
// process checked (it ended, its pid perhaps reused) or did not put it in
// the lease's cgroup: nothing was attached.
var errNotAttached = errors.New("not attached")

// attachedSameLocked checks, after pid was written into l's cgroup, that
// the process moved is h's: h has not exited, so pid still names it, and
// it is in the lease's cgroup. If h exited meanwhile, pid may have been
// reused: whatever process pid names now is moved back to where its
// parent is, and the attach is refused (errNotAttached). l.cgMu is held,
// so no kill of the lease runs before the move back.
func (d *Daemon) attachedSameLocked(l *lease, h *pidHandle, pid, caller int) error {
	want := d.leaseUnifiedCgroupLocked(l)
	if h.alive() && pid == h.pid {
		if want == "" {
			return nil
		}
		got, err := unifiedCgroup(d.proc, pid)
		if err == nil && got == want {
			return nil
		}
		if h.alive() {
			d.log.Error("attached process is not in its lease cgroup", "lease", l.id, "pid", pid, "cgroup", got, "want", want, "err", err)
			return fmt.Errorf("pid %d did not arrive in the cgroup of lease %s: %w", pid, l.id, errNotAttached)
		}
	}
	// h's process has exited. If pid names another process now (another
	// start time) and that process is in the lease's cgroup, it was moved
	// there in h's place.
	_, realCgroups := d.cg.(*cgroup.Cgroups)
	start, err := procStartTime(d.proc, pid)
	if err == nil && realCgroups && (start != h.start || pid != h.pid) {
		in := want == ""
		if !in {
			got, _ := unifiedCgroup(d.proc, pid)
			in = got == want
		}
		if in {
			parent := 1
			if st, err := readProcStatus(d.proc, pid); err == nil && st.ppid > 0 {
				parent = st.ppid
			}
			rerr := restoreCgroups(d.proc, pid, parent)
			d.log.Error("attach moved a process that was not the checked one (its pid was reused); moved it back",
				"lease", l.id, "pid", pid, "caller", caller, "parent", parent, "err", rerr)
		}
	}
	l.pids = slices.DeleteFunc(l.pids, func(x int) bool { return x == pid })
	return fmt.Errorf("pid %d exited while it was attached to lease %s; nothing was attached: %w", h.pid, l.id, errNotAttached)
}

// leaseUnifiedCgroup is the cgroup v2 path /proc/PID/cgroup shows for a
// process of l; "" without a unified hierarchy (pure v1, no cgroups).
func (d *Daemon) leaseUnifiedCgroup(l *lease) string {
	l.cgMu.Lock()
	defer l.cgMu.Unlock()
	return d.leaseUnifiedCgroupLocked(l)
}

// leaseUnifiedCgroupLocked is leaseUnifiedCgroup with l.cgMu held.
func (d *Daemon) leaseUnifiedCgroupLocked(l *lease) string {
	m, ok := d.cg.(*cgroup.Cgroups)
	if !ok || m.Mode() == cgroup.ModeV1 {
		return ""
	}
	if l.cg == nil {
		return ""
	}
	// The lease's own cgroup, wherever the manager put it (under this
	// mpsd's instance id).
	return "/" + strings.TrimPrefix(l.cg.Path(), "/")
}

// procStatus is what mpsd reads of /proc/PID/status.
type procStatus struct {
	ppid   int
	uid    uint32
	groups []uint32
}

func readProcStatus(root string, pid int) (procStatus, error) {
	f, err := os.Open(filepath.Join(root, strconv.Itoa(pid), "status"))
	if err != nil {
		return procStatus{}, err
	}
	defer func() { _ = f.Close() }()
	st, err := parseProcStatus(f)
	if err != nil {
		return procStatus{}, fmt.Errorf("%s/%d/status: %w", root, pid, err)
	}
	return st, nil
}

// parseProcStatus reads the PPid, Uid and Groups lines of a
// /proc/PID/status file.
func parseProcStatus(r io.Reader) (procStatus, error) {
	var st procStatus
	var havePPid, haveUID bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		switch k {
		case "PPid":
			if len(fields) > 0 {
				n, err := strconv.Atoi(fields[0])
				if err != nil || n < 0 {
					return procStatus{}, fmt.Errorf("bad PPid line %q", v)
				}
				st.ppid, havePPid = n, true
			}
		case "Uid":
			// Real, effective, saved, filesystem: the real uid owns it.
			if len(fields) > 0 {
				u, err := strconv.ParseUint(fields[0], 10, 32)
				if err != nil {
					return procStatus{}, fmt.Errorf("bad Uid line %q", v)
				}
				st.uid, haveUID = uint32(u), true
			}
		case "Groups":
			for _, g := range fields {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil {
					st.groups = append(st.groups, uint32(n))
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return procStatus{}, err
	}
	if !havePPid || !haveUID {
		return procStatus{}, errors.New("no PPid or Uid line")
	}
	return st, nil
}
