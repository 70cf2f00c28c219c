package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
)

// Defaults of the Config timeouts.
const (
	DefaultReconnectTimeout = 60 * time.Second
	DefaultRevokeGrace      = time.Second
	DefaultAttachTimeout    = 30 * time.Second
)

// Config is everything Run needs; Main builds it from the process.
type Config struct {
	Options
	// Stdin, Stdout and Stderr are handed to the command as they are (it
	// inherits the fds); nil means /dev/null. mps-launch's own lines go
	// to Stderr.
	Stdin, Stdout, Stderr *os.File
	// Environ is the caller's environment: the command's, plus the lease's.
	Environ []string
	// Signals delivers the signals to forward to the command; while no
	// command runs, SIGINT, SIGTERM, SIGHUP and SIGQUIT abandon the request.
	Signals <-chan os.Signal
	// Self is the binary started as the trampoline; "" means
	// /proc/self/exe. Its main must call Main (or a test's TestMain must),
	// which serves trampoline mode.
	Self string
	// Terminal turns on the live queue status line on Stderr (Main sets it
	// when Stderr is a terminal); Quiet turns it off again.
	Terminal bool
	// ReconnectTimeout is how long mps-launch waits for mpsd to come back
	// once it went away (restarting): a closed stream, a request or an
	// attach that found the socket refusing, reset or closed before mpsd
	// answered. It counts from the first failure until mpsd sends an
	// event again (a stream that ends before its first event does not
	// renew it); past it mps-launch gives up with ErrLost
	// (ExitTempFail). 0 means DefaultReconnectTimeout.
	ReconnectTimeout time.Duration
	// RevokeGrace is how long a command that failed waits for a
	// revoked event that may be on its way, to tell mpsd's kill from
	// another; 0 means DefaultRevokeGrace.
	RevokeGrace time.Duration
	// AttachTimeout bounds the attach request; 0 means
	// DefaultAttachTimeout.
	AttachTimeout time.Duration
}

// Main is mps-launch: it serves trampoline mode when environ selects it,
// otherwise parses args (without the program name), forwards the
// process's signals and runs the command under a lease. It returns the
// exit status; every failure has printed one line on stderr.
func Main(ctx context.Context, args []string, stdin, stdout, stderr *os.File, environ []string) int {
	if isTrampoline(environ) {
		return trampoline(args, environ, stderr)
	}
	opts, err := ParseArgs(args, func(k string) string { return getenv(environ, k) })
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, Usage)
		return 0
	}
	if err == nil {
		err = opts.CheckUID(os.Getuid())
	}
	if err != nil {
		fmt.Fprintf(stderr, "mps-launch: %s\n", message(err))
		return ExitFailure
	}
	sigs := make(chan os.Signal, 8)
	notifyForwarded(sigs)
	defer signal.Stop(sigs)
	return Run(ctx, Config{
		Options:  opts,
		Stdin:    stdin,
		Stdout:   stdout,
		Stderr:   stderr,
		Environ:  environ,
		Signals:  sigs,
		Terminal: isTerminal(stderr),
	})
}

// Run resolves the command, asks mpsd for a lease, runs the command under
// it (again after each requeue) and returns mps-launch's exit status: the
// command's own, 128+N for signal N, or ExitFailure, ExitNotExecutable,
// ExitNotFound or ExitTempFail with one line on Stderr saying why. mpsd
// going away (restarting) is waited out for ReconnectTimeout, resuming the
// lease, or the queued request, by id; then ExitTempFail. With a
// JobID, each line mps-launch prints names the job ("mps-launch: job 42:
// ..."), so a batch job's log says which job a requeue or a failure hit.
// Cancelling ctx kills the command and returns ExitFailure.
func Run(ctx context.Context, cfg Config) int {
	if cfg.Self == "" {
		cfg.Self = "/proc/self/exe"
	}
	if cfg.ReconnectTimeout <= 0 {
		cfg.ReconnectTimeout = DefaultReconnectTimeout
	}
	if cfg.RevokeGrace <= 0 {
		cfg.RevokeGrace = DefaultRevokeGrace
	}
	if cfg.AttachTimeout <= 0 {
		cfg.AttachTimeout = DefaultAttachTimeout
	}
	var errw io.Writer = io.Discard
	if cfg.Stderr != nil {
		errw = cfg.Stderr
	}
	s := &session{
		cfg:    cfg,
		errw:   errw,
		client: NewClient(cfg.Socket),
		req:    cfg.LeaseRequest(),
		status: statusLine{w: errw, on: cfg.Terminal && !cfg.Quiet},
	}
	code, err := s.run(ctx)
	if err != nil {
		fmt.Fprintf(errw, "%s%s\n", s.prefix(), message(err))
		return ExitCode(err)
	}
	return code
}

// prefix starts every line mps-launch prints: "mps-launch: ", and the
// batch job the lease is tagged with.
func (s *session) prefix() string {
	if s.cfg.JobID == "" {
		return "mps-launch: "
	}
	return "mps-launch: job " + s.cfg.JobID + ": "
}

// session is one run of mps-launch. All its fields belong to the goroutine
// in run; the goroutines it starts (stream reader, reconnect, child wait)
// only send on channels, and run stops and waits for each before it
// returns.
type session struct {
	cfg    Config
	errw   io.Writer
	client *Client
	path   string
	req    api.LeaseRequest
	status statusLine

	stream *Stream
	events chan streamMsg
	stopRd chan struct{}
	rdDone chan struct{}

	reconnected chan reconnectResult
	stopRc      chan struct{}
	rcDone      chan struct{}

	ticker      *time.Ticker
	queuedSince time.Time
	position    int
	group       string
	reason      string // what the queued lease waits for, when mpsd says

	// lease is the last granted lease, kept after a revocation.
	lease *api.Lease
	// leaseID and attempt are what a reconnect resumes: the lease the
	// session waits as (a queued event's lease id) or holds (the granted
	// lease's), and its run (the grant's, then a requeued event's). ""
	// while mpsd has named no lease.
	leaseID string
	attempt int
	// requestedAt is when mpsd first answered (--wait counts from it until
	// the first grant, granted says there was one); started, that a
	// command has been released to run under the session's lease.
	requestedAt time.Time
	granted     bool
	started     bool
	// contacted: mpsd has answered once; until then a missing socket is
	// not waited for (no mpsd at all, or another socket meant), unless
	// the socket was there on an earlier try.
	contacted bool
	// An outage: since when mpsd has been unreachable (zero while it
	// answers; only an event ends an outage), the wait before the next
	// try, and the last failure, for the line that gives up.
	awaySince time.Time
	backoff   time.Duration
	lastFail  error
	// sawEvent: the current stream has carried an event.
	sawEvent bool
	// finished: the command succeeded while mpsd was away; the session
	// ends (0) once the reconnect is over, its stream closed at once.
	finished bool
	// held is a granted lease whose attach found mpsd gone: its command
	// waits unstarted in the trampoline (the spare) until mpsd is back or
	// the outage outlasts ReconnectTimeout; holdRetry re-tries the
	// attach while the stream stays open.
	held      *api.Lease
	holdRetry *time.Timer
	child     *child
	// spare is a trampoline started ahead of the grant, so that its start
	// overlaps the wait for mpsd; nil when none is ready.
	spare *child
	// revoked is the reason of the current lease's revocation; the child
	// still running (or nil) is being killed by mpsd.
	revoked string
	// pending is a grant that came before the revoked child was gone.
	pending *api.Lease
	// final is an error that ends the session once the child is gone.
	final error
	// heldExit is the status of a failed child waiting out RevokeGrace;
	// heldErr, when set, the failed attach that waits out the grace.
	heldExit int
	heldErr  error
	// awayKill names the signal that killed the command while mpsd was
	// away; endGrace says so unless a revocation explains it.
	awayKill string
	grace    *time.Timer
}

type streamMsg struct {
	ev  api.Event
	err error
}

type reconnectResult struct {
	stream *Stream
	err    error
	// gaveUp: err is the last failure of a reconnect that ran out of
	// time. since is when its failures began (zero if none).
	gaveUp bool
	since  time.Time
}

// done is the result that ends run.
type done struct {
	code int
	err  error
}

func (s *session) run(ctx context.Context) (int, error) {
	path, err := lookPath(s.cfg.Command[0], getenv(s.cfg.Environ, "PATH"))
	if err != nil {
		return 0, err
	}
	s.path = path

	// Every stream and request of the session lives in sctx, so returning
	// aborts whatever is still in flight.
	sctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		s.cleanup()
	}()
	if err := s.spawnSpare(); err != nil {
		return 0, err
	}

	s.queuedSince = time.Now()
	s.startReconnect(sctx)

	for {
		var r *done
		select {
		case <-ctx.Done():
			r = s.cancelled(ctx.Err())
		case m := <-s.events:
			r = s.onEvent(sctx, m)
		case rc := <-s.reconnected:
			r = s.onReconnect(sctx, rc)
		case <-s.childExited():
			r = s.onChildExit(sctx)
		case <-s.spareExited():
			// A signal to the process group, say, while queued: it
			// never ran the program; another is started at the grant.
			s.spare.reap()
			s.spare = nil
		case sig := <-s.cfg.Signals:
			r = s.onSignal(sig)
		case <-s.tickC():
			s.status.update(s.position, s.group, s.reason, time.Since(s.queuedSince))
		case <-s.graceC():
			r = s.endGrace()
		case <-s.holdRetryC():
			r = s.retryHeld(sctx)
		}
		if r != nil {
			s.release(sctx)
			return r.code, r.err
		}
	}
}

// releaseTimeout bounds the release request at the end of a session.
const releaseTimeout = 2 * time.Second

// release has mpsd release the lease whose command has ended, and waits
// for the answer, so that status no longer shows the lease once
// mps-launch has exited. Closing the stream (cleanup) releases it anyway;
// a failure here only leaves that to do it.
func (s *session) release(ctx context.Context) {
	if s.stream == nil || s.lease == nil || s.child != nil || s.revoked != "" {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	_ = s.client.Release(rctx, s.lease.ID)
	cancel()
}

func (s *session) childExited() <-chan struct{} {
	if s.child == nil {
		return nil
	}
	return s.child.exited
}

func (s *session) spareExited() <-chan struct{} {
	if s.spare == nil {
		return nil
	}
	return s.spare.exited
}

func (s *session) spawnSpare() error {
	c, err := startChild(s.cfg.Self, s.path, s.cfg.Command, s.cfg.Stdin, s.cfg.Stdout, s.cfg.Stderr)
	if err != nil {
		return err
	}
	s.spare = c
	return nil
}

func (s *session) tickC() <-chan time.Time {
	if s.ticker == nil {
		return nil
	}
	return s.ticker.C
}

func (s *session) graceC() <-chan time.Time {
	if s.grace == nil {
		return nil
	}
	return s.grace.C
}

func (s *session) holdRetryC() <-chan time.Time {
	if s.holdRetry == nil {
		return nil
	}
	return s.holdRetry.C
}

func (s *session) onEvent(ctx context.Context, m streamMsg) *done {
	if m.err != nil {
		empty := !s.sawEvent
		s.closeStream()
		if errors.Is(m.err, ErrProtocol) {
			return s.fail(m.err)
		}
		// mpsd went away (restarting): the outage begins, or goes on if
		// this stream was mpsd's answer to a reconnect and ended before
		// its first event.
		why := "mpsd closed the lease stream"
		if empty {
			why = "the lease stream ended before its first event"
		}
		if !errors.Is(m.err, io.EOF) {
			why += ": " + m.err.Error()
		}
		s.away(errors.New(why))
		if empty && s.contacted && s.outageOver() {
			// mpsd keeps answering without ever saying anything: no
			// better than not answering.
			return s.giveUp(s.lost())
		}
		if s.child == nil && s.grace != nil {
			// The command failed and the stream ended before a
			// revocation came: mpsd is stopping, perhaps in the middle
			// of revoking the lease. The resumed lease says whether it
			// was; if mpsd does not know it any more, the failure was the
			// command's own (onReconnect).
			s.grace.Stop()
			s.grace = time.NewTimer(s.cfg.ReconnectTimeout + s.cfg.RevokeGrace)
		}
		s.startReconnect(ctx)
		return nil
	}
	// An event: mpsd is there (again).
	s.sawEvent, s.awaySince, s.backoff, s.lastFail = true, time.Time{}, 0, nil
	ev := m.ev
	switch ev.Type {
	case api.EventQueued:
		if ev.LeaseID != "" && s.lease == nil {
			// The queued request's own lease: a reconnect resumes it, and
			// with it the place in the queue.
			s.leaseID, s.attempt = ev.LeaseID, max(s.attempt, 1)
		}
		// While a revoked command is still dying its output may still
		// come; the status line waits until it is gone.
		if s.child == nil && s.grace == nil {
			s.position, s.group, s.reason = ev.Position, ev.Group, ev.Reason
			s.status.update(s.position, s.group, s.reason, time.Since(s.queuedSince))
			if s.status.on && s.ticker == nil {
				s.ticker = time.NewTicker(time.Second)
			}
		}
	case api.EventGranted:
		switch {
		case (s.child != nil || s.grace != nil) && s.revoked == "":
			// A resumed stream confirms the lease the command ran under.
			if ev.Lease.ID != s.lease.ID {
				return s.fail(fmt.Errorf("%w: granted lease %s while the command runs under lease %s",
					ErrProtocol, ev.Lease.ID, s.lease.ID))
			}
			s.lease, s.attempt = ev.Lease, ev.Lease.Attempt
			if s.grace != nil {
				// mpsd kept the lease: the SIGKILL was not its revocation.
				return s.endGrace()
			}
		case s.child != nil:
			s.pending = ev.Lease
			s.leaseID, s.attempt, s.granted = ev.Lease.ID, ev.Lease.Attempt, true
		default:
			return s.launch(ctx, ev.Lease)
		}
	case api.EventRevoked:
		if s.lease == nil {
			if s.leaseID == "" {
				return s.fail(fmt.Errorf("%w: revoked before any lease was granted", ErrProtocol))
			}
			// The queued lease this launcher resumed after mpsd restarted:
			// the previous mpsd granted (and saved) it without telling us,
			// and it is revoked now. Nothing of ours ran; its requeue follows.
			s.revoked = ev.Reason
			break
		}
		s.revoked, s.awayKill = ev.Reason, ""
		// A held command's lease is gone: it waits for the requeued grant.
		s.unhold()
		if s.grace != nil {
			// The SIGKILL the command died of (or the attach's failure)
			// was mpsd's revocation: not its end.
			s.grace.Stop()
			s.grace = nil
			s.heldErr = nil
		}
	case api.EventRequeued:
		if s.revoked == "" {
			return s.fail(fmt.Errorf("%w: requeued without a revocation", ErrProtocol))
		}
		if !s.cfg.Quiet {
			fmt.Fprintf(s.errw, "%slease %s revoked (%s); requeued, attempt %d\n", s.prefix(), s.leaseID, s.revoked, ev.Attempt)
		}
		s.attempt = ev.Attempt
		s.queuedSince = time.Now()
	case api.EventError:
		err := &api.Error{Code: ev.Code, Message: ev.Message}
		s.closeStream()
		switch {
		case s.child != nil && s.revoked == "":
			s.detach(err)
		case s.child != nil:
			s.final = err // once mpsd has killed the command
		default:
			return &done{err: err}
		}
	}
	return nil
}

// fail ends the session with err, unless a command runs: it is the user's
// and outlives a broken daemon.
func (s *session) fail(err error) *done {
	s.closeStream()
	if s.child != nil {
		if s.revoked != "" {
			s.final = err
		} else {
			s.detach(err)
		}
		return nil
	}
	return &done{err: err}
}

// detach lets the command run on without mpsd after err; the stream is
// already closed, so its end is the session's end.
func (s *session) detach(err error) {
	fmt.Fprintf(s.errw, "%s%s; the command keeps running without a lease\n", s.prefix(), message(err))
}

func (s *session) endGrace() *done {
	s.grace.Stop()
	s.grace = nil
	if s.awayKill != "" {
		fmt.Fprintf(s.errw, "%sthe command was killed by %s while mpsd was away (exit status %d)\n", s.prefix(), s.awayKill, s.heldExit)
		s.awayKill = ""
	}
	if err := s.heldErr; err != nil {
		s.heldErr = nil
		return &done{err: err}
	}
	return &done{code: s.heldExit}
}

// launch runs the command under lease: have mpsd attach a waiting
// trampoline to the lease's cgroup, then release it to exec the program.
func (s *session) launch(ctx context.Context, lease *api.Lease) *done {
	s.stopTicker()
	s.status.clear()
	s.unhold()
	s.lease, s.revoked, s.pending = lease, "", nil
	s.leaseID, s.attempt, s.granted = lease.ID, lease.Attempt, true
	for retried := false; ; retried = true {
		c, err := s.takeSpare()
		if err != nil {
			return &done{err: err}
		}
		actx, cancel := context.WithTimeout(ctx, s.cfg.AttachTimeout)
		err = s.client.Attach(actx, lease.ID, c.pid)
		cancel()
		if err != nil {
			err = fmt.Errorf("launcher: attach pid %d to lease %s: %w", c.pid, lease.ID, err)
			if errors.Is(err, ErrUnreachable) {
				// mpsd went away between the grant and the attach: the
				// command must neither start outside the lease's cgroup
				// nor be given up while mpsd may come back.
				return s.hold(lease, c, err)
			}
		} else if err = s.startCommand(c, lease); err == nil {
			s.child, s.started = c, true
			s.awaySince, s.backoff, s.lastFail = time.Time{}, 0, nil
			return nil
		}
		// A trampoline that died while it waited (a signal to the process
		// group, say) never ran the program: one new one may try again.
		died := errors.Is(err, errTrampolineGone)
		select {
		case <-c.exited:
			died = true
		default:
		}
		c.kill()
		var ae *api.Error
		if errors.As(err, &ae) && (ae.Code == api.CodeConflict || ae.Code == api.CodeNotFound) && s.stream != nil {
			// The lease ended between its grant and the attach: a fault
			// revoked it, and the revoked event (or the error that ends
			// the lease) is on its way. Wait for it like for a killed
			// command's; if none comes, the attach's failure stands.
			s.heldExit, s.heldErr = ExitFailure, err
			s.grace = time.NewTimer(s.cfg.RevokeGrace)
			return nil
		}
		if !died || retried {
			return &done{err: err}
		}
	}
}

// hold keeps lease, whose attach of trampoline c failed with err because
// mpsd could not be reached: c goes back to waiting, unreleased (if mpsd
// did move it before it went, it is in the lease's cgroup, the only place
// the lease's next attach puts it too), and the attach is tried again once
// mpsd is back: by the grant of the resumed stream if the stream ends (it
// shares mpsd's fate), by holdRetry while it stays open. An outage longer
// than ReconnectTimeout gives up.
func (s *session) hold(lease *api.Lease, c *child, err error) *done {
	select {
	case <-c.exited:
		c.reap()
	default:
		if s.spare == nil {
			s.spare = c
		} else {
			c.kill()
		}
	}
	s.away(err)
	if s.outageOver() {
		return s.fail(s.lost())
	}
	s.held = lease
	s.holdRetry = time.NewTimer(s.nextWait())
	return nil
}

// retryHeld tries the held lease's attach again, if its stream is still
// open; a reconnect under way brings the lease's state instead.
func (s *session) retryHeld(ctx context.Context) *done {
	s.holdRetry = nil
	lease := s.held
	if lease == nil || s.stream == nil {
		return nil
	}
	if s.outageOver() {
		return s.fail(s.lost())
	}
	return s.launch(ctx, lease)
}

// unhold drops the held lease, if any.
func (s *session) unhold() {
	s.held = nil
	if s.holdRetry != nil {
		s.holdRetry.Stop()
		s.holdRetry = nil
	}
}

// away records a failure that says mpsd is gone; the first one starts the
// outage.
func (s *session) away(err error) {
	if s.awaySince.IsZero() {
		s.awaySince = time.Now()
	}
	s.lastFail = err
}

// outageOver reports whether mpsd has been away for ReconnectTimeout.
func (s *session) outageOver() bool {
	return !s.awaySince.IsZero() && time.Since(s.awaySince) >= s.cfg.ReconnectTimeout
}

// nextWait is the backoff before the next try in this outage: 20ms,
// doubling to 1s, and never past the outage's end.
func (s *session) nextWait() time.Duration {
	s.backoff = min(max(2*s.backoff, 20*time.Millisecond), time.Second)
	return max(0, min(s.backoff, s.cfg.ReconnectTimeout-time.Since(s.awaySince)))
}

// lost is the error that gives up on mpsd after an outage.
func (s *session) lost() error {
	took := time.Since(s.awaySince)
	if took >= time.Second {
		took = took.Round(time.Second)
	} else {
		took = took.Round(time.Millisecond)
	}
	return fmt.Errorf("%w: unreachable for %s: %w", ErrLost, took, s.lastFail)
}

// takeSpare returns the waiting trampoline, or a new one if there is none
// or it has died.
func (s *session) takeSpare() (*child, error) {
	if s.spare != nil {
		select {
		case <-s.spare.exited:
			s.spare.reap()
			s.spare = nil
		default:
		}
	}
	if s.spare == nil {
		if err := s.spawnSpare(); err != nil {
			return nil, err
		}
	}
	c := s.spare
	s.spare = nil
	return c, nil
}

func (s *session) onChildExit(ctx context.Context) *done {
	ws := s.child.reap()
	s.child = nil
	code := exitStatus(ws)
	if s.revoked == "" {
		reconnecting := s.stream == nil && s.reconnected != nil
		if code == 0 && reconnecting {
			// Done, but mpsd is away and will still count the lease
			// (until its reconnect grace if it cannot tell that the
			// command ran): the launcher resumes the lease only to close
			// it, which frees its share at once, then exits 0.
			s.finished = true
			return nil
		}
		if code == 0 || (s.stream == nil && !reconnecting) {
			return &done{code: code}
		}
		if reconnecting {
			// mpsd is away (restarting): if a fault took the command's
			// server while it was, the resumed lease says so.
			s.heldExit = code
			if ws.Signaled() {
				s.awayKill = unix.SignalName(ws.Signal())
			}
			s.grace = time.NewTimer(s.cfg.ReconnectTimeout + s.cfg.RevokeGrace)
			return nil
		}
		// A command that failed may have failed because its MPS server
		// did (a CUDA client dies of the lost server as fast as mpsd sees
		// the server go), or been killed by mpsd after a revocation whose
		// event is on its way: give the event a moment before taking the
		// failure as the command's own. A command that succeeded exits at
		// once.
		s.heldExit = code
		s.grace = time.NewTimer(s.cfg.RevokeGrace)
		return nil
	}
	if s.final != nil {
		return &done{err: s.final}
	}
	if s.pending != nil {
		return s.launch(ctx, s.pending)
	}
	return nil
}

func (s *session) onSignal(sig os.Signal) *done {
	if s.child != nil {
		s.child.signal(sig)
		return nil
	}
	if s.finished {
		return &done{code: 0} // the command's status; only mpsd's release was waited for
	}
	switch sig {
	case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
		// No command to tell: the request is abandoned (closing the
		// stream gives up the place in the queue).
		s.status.clear()
		if n, ok := sig.(syscall.Signal); ok {
			return &done{code: 128 + int(n)}
		}
		return &done{code: ExitFailure}
	}
	return nil
}

func (s *session) onReconnect(ctx context.Context, rc reconnectResult) *done {
	s.reconnected, s.stopRc, s.rcDone = nil, nil, nil
	if s.awaySince.IsZero() {
		s.awaySince = rc.since
	}
	if s.finished {
		// The lease is released by the stream's close (cleanup), if mpsd
		// took it back; whatever mpsd says, the command is done.
		if rc.stream != nil {
			_ = rc.stream.Close()
		}
		return &done{code: 0}
	}
	if rc.gaveUp {
		s.away(rc.err)
		rc.err = s.lost()
	}
	var ae *api.Error
	if errors.As(rc.err, &ae) && ae.Code == api.CodeNotFound && s.leaseID != "" && !s.started && s.child == nil && s.grace == nil {
		// mpsd does not know the lease it had queued (or granted, and
		// the command was held): it was lost with what mpsd had not yet
		// written when it went. Nothing ran under it, so it is simply
		// asked for again.
		if !s.cfg.Quiet {
			fmt.Fprintf(s.errw, "%slease %s was lost while mpsd was away; requesting a new one\n", s.prefix(), s.leaseID)
		}
		s.unhold()
		s.lease, s.leaseID, s.attempt, s.revoked, s.pending = nil, "", 0, "", nil
		s.startReconnect(ctx)
		return nil
	}
	if rc.err != nil {
		return s.giveUp(rc.err)
	}
	if !s.contacted {
		s.contacted, s.requestedAt = true, time.Now()
	}
	s.open(rc.stream)
	return nil
}

// giveUp ends the wait for mpsd with err: the session ends, unless a
// command runs on (it is the user's). A command that failed while mpsd was
// away keeps its own status.
func (s *session) giveUp(err error) *done {
	if s.child == nil && s.grace != nil {
		// The command failed while mpsd was away, and mpsd does not
		// know the lease any more (or cannot be reached): no
		// revocation will come, the failure was the command's own.
		return s.endGrace()
	}
	return s.fail(err)
}

func (s *session) cancelled(err error) *done {
	if s.child != nil {
		s.child.kill()
		s.child = nil
	}
	return &done{err: fmt.Errorf("launcher: %w", err)}
}

// open makes st the session's stream and starts its reader.
func (s *session) open(st *Stream) {
	events := make(chan streamMsg)
	stop := make(chan struct{})
	rdDone := make(chan struct{})
	go func() {
		defer close(rdDone)
		for {
			ev, err := st.Next()
			select {
			case events <- streamMsg{ev: ev, err: err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	s.stream, s.events, s.stopRd, s.rdDone = st, events, stop, rdDone
	s.sawEvent = false
}

// closeStream closes the stream, which releases the lease, and waits for
// its reader.
func (s *session) closeStream() {
	if s.stream == nil {
		return
	}
	_ = s.stream.Close()
	close(s.stopRd)
	<-s.rdDone
	s.stream, s.events, s.stopRd, s.rdDone = nil, nil, nil, nil
}

// startReconnect posts the request (again) until mpsd answers, resuming
// the lease the session waits as or holds if there is one. Failures that
// say mpsd is away (ErrUnreachable) are retried with backoff until the
// outage has lasted ReconnectTimeout; only before mpsd first answered is a
// missing socket not waited for.
func (s *session) startReconnect(ctx context.Context) {
	req := s.request()
	ch := make(chan reconnectResult, 1)
	stop := make(chan struct{})
	rcDone := make(chan struct{})
	var first time.Duration
	if !s.awaySince.IsZero() && s.lastFail != nil && !s.sawEvent && s.contacted {
		// The stream mpsd gave ended before its first event: mpsd is not
		// back, so the next try waits too.
		first = s.nextWait()
	}
	awaySince, contacted, window := s.awaySince, s.contacted, s.cfg.ReconnectTimeout
	go func() {
		defer close(rcDone)
		since := awaySince
		backoff, wait := max(first, 10*time.Millisecond), first
		for {
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-stop:
					t.Stop()
					return
				case <-t.C:
				}
			}
			st, err := s.client.Lease(ctx, req)
			if err == nil || !errors.Is(err, ErrUnreachable) || (!contacted && socketAbsent(err)) {
				ch <- reconnectResult{stream: st, err: err, since: since}
				return
			}
			// A socket that refused or dropped the request was there: an
			// mpsd going away may remove it while it restarts.
			contacted = contacted || !socketAbsent(err)
			if since.IsZero() {
				since = time.Now()
			}
			backoff = min(2*backoff, time.Second)
			wait = min(backoff, window-time.Since(since))
			if wait <= 0 {
				ch <- reconnectResult{err: err, gaveUp: true, since: since}
				return
			}
		}
	}()
	s.reconnected, s.stopRc, s.rcDone = ch, stop, rcDone
}

// request is the lease request to send now: a resume of the session's
// lease if mpsd has named one, else a new request; --wait counts from
// mpsd's first answer until a grant.
func (s *session) request() api.LeaseRequest {
	req := s.req
	if s.leaseID != "" {
		req.ResumeLeaseID, req.Attempt = s.leaseID, max(s.attempt, 1)
	}
	if req.WaitMillis > 0 && s.contacted {
		if s.granted {
			req.WaitMillis = 0
		} else {
			left := time.Duration(req.WaitMillis)*time.Millisecond - time.Since(s.requestedAt)
			req.WaitMillis = max(1, left.Milliseconds())
		}
	}
	return req
}

func (s *session) stopTicker() {
	if s.ticker != nil {
		s.ticker.Stop()
		s.ticker = nil
	}
}

// cleanup stops everything the session started. The caller cancels the
// session context first, so a request in flight ends at once.
func (s *session) cleanup() {
	s.stopTicker()
	s.status.clear()
	if s.grace != nil {
		s.grace.Stop()
	}
	s.unhold()
	s.closeStream()
	if s.rcDone != nil {
		close(s.stopRc)
		<-s.rcDone
		select {
		case rc := <-s.reconnected:
			if rc.stream != nil {
				_ = rc.stream.Close()
			}
		default:
		}
	}
	if s.child != nil {
		s.child.kill()
	}
	if s.spare != nil {
		s.spare.kill()
	}
}
