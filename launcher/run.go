package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
	"github.com/mpsd/mpsd/internal/buildinfo"
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
	// when Stderr is a terminal); without it the wait is logged instead, a
	// line as it begins, at each change of its reason and at its grant.
	// Quiet turns either off.
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
	// another, before it asks mpsd to release the lease (a release
	// refused as revoking waits on for the event); 0 means
	// DefaultRevokeGrace.
	RevokeGrace time.Duration
	// AttachTimeout bounds the attach request; 0 means
	// DefaultAttachTimeout.
	AttachTimeout time.Duration
	// apiLevel is the API level the session needs of mpsd; 0 means what
	// its request uses (requestLevel).
	apiLevel int
	// signalsRegistered, when not nil, is closed once Signals receives
	// the forwarded signals (Main registers them in the background): a
	// command started before would not have them forwarded.
	signalsRegistered <-chan struct{}
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
	switch {
	case errors.Is(err, errHelp):
		fmt.Fprint(stdout, Usage)
		return 0
	case errors.Is(err, errVersion):
		fmt.Fprintln(stdout, buildinfo.Read().Line("mps-launch"))
		return 0
	}
	if err == nil {
		err = opts.CheckUID(os.Getuid())
	}
	if err != nil {
		fmt.Fprintf(stderr, "mps-launch: %s\n", message(err))
		return ExitFailure
	}
	// The signals are registered while the trampoline starts and the
	// request goes out (registering costs a few hundred microseconds of
	// round trips with the runtime's signal thread); the command starts
	// only once they are. They stay registered until the process exits:
	// unregistering would wait for the signal loop to be idle, for
	// nothing, on the way out.
	sigs := make(chan os.Signal, 8)
	registered := make(chan struct{})
	go func() {
		defer close(registered)
		notifyForwarded(sigs)
	}()
	defer func() { <-registered }()
	return Run(ctx, Config{
		Options:           opts,
		Stdin:             stdin,
		Stdout:            stdout,
		Stderr:            stderr,
		Environ:           environ,
		Signals:           sigs,
		signalsRegistered: registered,
		Terminal:          isTerminal(stderr),
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
		client: newClient(cfg.Socket),
		req:    cfg.LeaseRequest(),
		status: statusLine{w: errw, live: cfg.Terminal && !cfg.Quiet, logged: !cfg.Terminal && !cfg.Quiet},
		tm:     timing{revokeGrace: cfg.RevokeGrace, reconnectTimeout: cfg.ReconnectTimeout, quiet: cfg.Quiet},
	}
	s.status.prefix = s.prefix()
	s.conn = conn{client: s.client, window: cfg.ReconnectTimeout}
	switch {
	case cfg.NoWait:
		s.conn.firstWindow, s.conn.firstWhy = time.Nanosecond, "--no-wait was given"
	case cfg.Wait > 0:
		s.conn.firstWindow, s.conn.firstWhy = cfg.Wait, "--wait "+cfg.Wait.String()+" ran out"
	}
	s.kids = children{self: cfg.Self, argv: cfg.Command, stdin: cfg.Stdin, stdout: cfg.Stdout, stderr: cfg.Stderr}
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
// returns. Its decisions are step's (session.go), on st; the rest is the
// means to carry them out.
type session struct {
	cfg    Config
	errw   io.Writer
	client *client.Client
	path   string
	req    api.LeaseRequest
	status statusLine
	st     state
	tm     timing

	// The stream and its reconnection (stream.go).
	conn conn

	ticker      *time.Ticker
	queuedSince time.Time

	// requestedAt is when mpsd first answered (--wait counts from it until
	// the first grant).
	requestedAt time.Time
	// skewWarned: the API level skew was warned of (warnSkew).
	skewWarned bool

	// The command's processes (children.go), and a granted lease whose
	// attach found mpsd gone, its command waiting unstarted in the spare
	// until mpsd is back or the outage outlasts ReconnectTimeout;
	// holdRetry re-tries the attach while the stream stays open.
	kids children
	// attachAsked is the trampoline the last new request asked mpsd to
	// attach with its grant (api.LeaseRequest.AttachPID): a grant naming
	// its pid has it in the lease's cgroup already. Compared as the
	// process, not the pid, which a later trampoline could reuse.
	attachAsked *child
	// exit is how the command last exited, sent with its release.
	exit      commandExit
	held      *api.Lease
	holdRetry *time.Timer

	// verdictTimer fires at st.verdict.until (verdictAt).
	verdictTimer *time.Timer
	verdictAt    time.Time

	// releaseAnswer brings the answer to the release a verdict asked for
	// (actAskRelease); asks owns the goroutine that waits for it.
	releaseAnswer chan error
	asks          sync.WaitGroup
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
	s.path, s.kids.path = path, path

	// Every stream and request of the session lives in sctx, so returning
	// aborts whatever is still in flight.
	sctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		s.cleanup()
	}()
	s.conn.startPredial(sctx)
	if err := s.kids.spawnSpare(); err != nil {
		return 0, err
	}

	s.queuedSince = time.Now()
	s.conn.startReconnect(sctx, s.request())

	for {
		var r *done
		select {
		case <-ctx.Done():
			r = s.cancelled(ctx.Err())
		case m := <-s.conn.events:
			r = s.onStream(sctx, m)
		case rc := <-s.conn.reconnected:
			r = s.onReconnect(sctx, rc)
		case <-s.kids.childExited():
			r = s.onChildExit(sctx)
		case <-s.kids.spareExited():
			// A signal to the process group, say, while queued: it
			// never ran the program; another is started at the grant.
			s.kids.spare.reap()
			s.kids.spare = nil
		case sig := <-s.cfg.Signals:
			r = s.onSignal(sctx, sig)
		case <-s.tickC():
			s.status.update(s.st.position, s.st.group, s.st.reason, time.Since(s.queuedSince))
		case <-s.verdictC():
			r = s.step(sctx, input{kind: inVerdictDue})
		case err := <-s.releaseAnswer:
			s.releaseAnswer = nil
			r = s.step(sctx, input{kind: inReleaseAnswer, err: err})
		case <-s.holdRetryC():
			r = s.retryHeld(sctx)
		}
		if r != nil {
			var ae *api.Error
			if err := s.release(sctx); r.err == nil && errors.As(err, &ae) && ae.Code == api.CodeCancelled {
				// The command ended (by the cancel's signal, perhaps with
				// status 0) before the revoked event was read: mps-launch
				// ends as cancelled, as it would have after the event.
				r = &done{err: ae}
			}
			return r.code, r.err
		}
		// Whatever the handler did to s.st (a step, or a launch outside
		// one: the held lease's retry), the verdict's timer follows it
		// here, once: a verdict without its timer would wait for ever.
		s.syncVerdictTimer()
	}
}

// releaseTimeout bounds a release request (at the end of a session, or
// the one a verdict asks for): mpsd holds the answer while a fault record
// naming the lease waits for the Xid that would confirm it (up to 3 s).
const releaseTimeout = 5 * time.Second

// release has mpsd release the lease whose command has ended, and waits
// for the answer, so that status no longer shows the lease once
// mps-launch has exited. Closing the stream (cleanup) releases it anyway;
// a failure here only leaves that to do it.
//
// A release a verdict asked for that is still under way is waited for
// instead (for as long as it may take): it is the same request. It
// returns the release's error (nil when none was asked).
func (s *session) release(ctx context.Context) error {
	if s.releaseAnswer != nil {
		var err error
		select {
		case err = <-s.releaseAnswer:
		case <-ctx.Done():
		}
		s.releaseAnswer = nil
		return err
	}
	if s.conn.stream == nil || s.st.lease == nil || s.kids.child != nil || s.st.revoked != "" || s.st.released {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	return s.releaseLease(rctx, s.st.lease, s.exit)
}

// commandExit is how the command exited, for mpsd's history: its exit
// status as mps-launch exits with it (nil: not known yet) and the
// signal's name when a signal killed it.
type commandExit struct {
	status *int
	signal string
}

// releaseLease asks mpsd to release lease, whose command ran under its
// attempt and has ended, with the command's exit status for mpsd's
// history; an mpsd from before the status (or the attempt) was named is
// asked without it.
func (s *session) releaseLease(ctx context.Context, l *api.Lease, exit commandExit) error {
	q := api.ReleaseRequest{Attempt: l.Attempt, ExitStatus: exit.status, Signal: exit.signal}
	err := s.client.Release(ctx, l.ID, q)
	if refusesField(err, "exit_status", "signal") {
		q.ExitStatus, q.Signal = nil, ""
		err = s.client.Release(ctx, l.ID, q)
	}
	if refusesField(err, "attempt") {
		err = s.client.Release(ctx, l.ID, api.ReleaseRequest{})
	}
	return err
}

// step runs the session's step for in and applies its actions.
func (s *session) step(ctx context.Context, in input) *done {
	if in.now.IsZero() {
		in.now = time.Now()
	}
	var acts []action
	s.st, acts = step(s.st, in, s.tm)
	return s.apply(ctx, acts)
}

// apply carries out acts in order; an end stops there.
func (s *session) apply(ctx context.Context, acts []action) *done {
	for _, a := range acts {
		switch a.kind {
		case actSay:
			fmt.Fprintf(s.errw, "%s%s\n", s.prefix(), a.line)
		case actShowQueue:
			s.status.update(s.st.position, s.st.group, s.st.reason, time.Since(s.queuedSince))
			if s.status.live && s.ticker == nil {
				s.ticker = time.NewTicker(time.Second)
			}
		case actLaunch:
			if r := s.launch(ctx, a.lease); r != nil {
				return r
			}
		case actUnhold:
			s.unhold()
		case actRequeued:
			s.queuedSince = time.Now()
		case actCloseStream:
			s.conn.close()
		case actReconnect:
			s.conn.startReconnect(ctx, s.request())
		case actSignal:
			if s.kids.child != nil {
				s.kids.child.signal(a.sig)
			}
		case actClearStatus:
			s.status.clear()
		case actEnd:
			return &done{code: a.code, err: a.err}
		case actAskRelease:
			s.askRelease(ctx, a.lease)
		}
	}
	return nil
}

// askRelease asks mpsd to release lease without waiting: the answer
// comes on s.releaseAnswer. The session's context bounds the request, and
// cleanup waits for it.
func (s *session) askRelease(ctx context.Context, l *api.Lease) {
	ch := make(chan error, 1)
	s.releaseAnswer = ch
	exit := s.exit // the goroutine's copy: the next attempt's exit may come meanwhile
	s.asks.Go(func() {
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		defer cancel()
		ch <- s.releaseLease(rctx, l, exit)
	})
}

// syncVerdictTimer makes the verdict timer fire at st.verdict's end, or
// not at all. run's loop calls it after each handler, the one place that
// sees every change of s.st.
func (s *session) syncVerdictTimer() {
	v := s.st.verdict
	if v == nil || !v.until.Equal(s.verdictAt) {
		if s.verdictTimer != nil {
			s.verdictTimer.Stop()
			s.verdictTimer, s.verdictAt = nil, time.Time{}
		}
	}
	if v != nil && s.verdictTimer == nil {
		s.verdictTimer, s.verdictAt = time.NewTimer(time.Until(v.until)), v.until
	}
}

func (s *session) verdictC() <-chan time.Time {
	if s.verdictTimer == nil {
		return nil
	}
	return s.verdictTimer.C
}

func (s *session) tickC() <-chan time.Time {
	if s.ticker == nil {
		return nil
	}
	return s.ticker.C
}

func (s *session) holdRetryC() <-chan time.Time {
	if s.holdRetry == nil {
		return nil
	}
	return s.holdRetry.C
}

// onStream takes what the stream's reader sent: an event, or the
// stream's end.
func (s *session) onStream(ctx context.Context, m streamMsg) *done {
	if m.err != nil {
		empty := !s.conn.sawEvent
		s.conn.close()
		in := input{kind: inStreamLost, err: m.err}
		if !errors.Is(m.err, ErrProtocol) {
			// mpsd went away (restarting): the outage begins, or goes on
			// if this stream was mpsd's answer to a reconnect and ended
			// before its first event.
			why := "mpsd closed the lease stream"
			if empty {
				why = "the lease stream ended before its first event"
			}
			if !errors.Is(m.err, io.EOF) {
				why += ": " + m.err.Error()
			}
			s.conn.away(errors.New(why))
			if empty && s.conn.contacted && s.conn.outageOver() {
				in.lost = s.conn.lost()
			}
		}
		return s.step(ctx, in)
	}
	// An event: mpsd is there (again).
	s.conn.answered()
	return s.step(ctx, input{kind: inEvent, ev: m.ev})
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
	if s.verdictTimer != nil {
		s.verdictTimer.Stop()
	}
	s.unhold()
	s.conn.stop()
	s.asks.Wait()
	s.kids.killAll()
}
