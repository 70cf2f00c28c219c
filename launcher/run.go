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
	// ReconnectTimeout bounds reconnecting after mpsd closed the stream
	// (restarted); 0 means DefaultReconnectTimeout.
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
// ExitNotFound or ExitTempFail with one line on Stderr saying why. With a
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

	// lease is the last granted lease, kept after a revocation to resume
	// with after a reconnect.
	lease *api.Lease
	child *child
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

	st, err := s.client.Lease(sctx, s.req)
	if err != nil {
		return 0, err
	}
	s.open(st)
	s.queuedSince = time.Now()

	for {
		var r *done
		select {
		case <-ctx.Done():
			r = s.cancelled(ctx.Err())
		case m := <-s.events:
			r = s.onEvent(sctx, m)
		case rc := <-s.reconnected:
			r = s.onReconnect(rc)
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
		}
		if r != nil {
			return r.code, r.err
		}
	}
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

func (s *session) onEvent(ctx context.Context, m streamMsg) *done {
	if m.err != nil {
		s.closeStream()
		if errors.Is(m.err, ErrProtocol) {
			return s.fail(m.err)
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
	ev := m.ev
	switch ev.Type {
	case api.EventQueued:
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
			s.lease = ev.Lease
			if s.grace != nil {
				// mpsd kept the lease: the SIGKILL was not its revocation.
				return s.endGrace()
			}
		case s.child != nil:
			s.pending = ev.Lease
		default:
			return s.launch(ctx, ev.Lease)
		}
	case api.EventRevoked:
		if s.lease == nil {
			return s.fail(fmt.Errorf("%w: revoked before any lease was granted", ErrProtocol))
		}
		s.revoked, s.awayKill = ev.Reason, ""
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
			fmt.Fprintf(s.errw, "%slease %s revoked (%s); requeued, attempt %d\n", s.prefix(), s.lease.ID, s.revoked, ev.Attempt)
		}
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
	s.lease, s.revoked, s.pending = lease, "", nil
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
		} else if err = s.startCommand(c, lease); err == nil {
			s.child = c
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

func (s *session) onReconnect(rc reconnectResult) *done {
	s.reconnected, s.stopRc, s.rcDone = nil, nil, nil
	if rc.err != nil {
		if s.child == nil && s.grace != nil {
			// The command failed while mpsd was away, and mpsd does not
			// know the lease any more (or cannot be reached): no
			// revocation will come, the failure was the command's own.
			return s.endGrace()
		}
		return s.fail(rc.err)
	}
	s.open(rc.stream)
	return nil
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

// startReconnect posts the request again until mpsd answers or
// ReconnectTimeout passes, resuming the last lease if there is one.
func (s *session) startReconnect(ctx context.Context) {
	req := s.req
	if s.lease != nil {
		req.ResumeLeaseID, req.Attempt = s.lease.ID, s.lease.Attempt
	}
	ch := make(chan reconnectResult, 1)
	stop := make(chan struct{})
	rcDone := make(chan struct{})
	deadline := time.Now().Add(s.cfg.ReconnectTimeout)
	go func() {
		defer close(rcDone)
		backoff := 20 * time.Millisecond
		for {
			st, err := s.client.Lease(ctx, req)
			if err == nil || !errors.Is(err, ErrUnreachable) {
				ch <- reconnectResult{stream: st, err: err}
				return
			}
			wait := min(backoff, time.Until(deadline))
			if wait <= 0 {
				ch <- reconnectResult{err: fmt.Errorf("%w after %s: %w", ErrLost, s.cfg.ReconnectTimeout, err)}
				return
			}
			t := time.NewTimer(wait)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, time.Second)
		}
	}()
	s.reconnected, s.stopRc, s.rcDone = ch, stop, rcDone
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
