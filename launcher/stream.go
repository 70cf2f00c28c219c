package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
)

// The lease stream and its reconnection: one stream at a time, read by
// one goroutine that sends each event (or the end) to run's loop; a
// reconnect that posts the request again, resuming the session's lease,
// with backoff, until mpsd answers or the outage has lasted
// ReconnectTimeout.

// conn is the session's connection to mpsd: the lease stream, its
// reader, the reconnect under way, and the outage they are in. Its
// fields belong to run's goroutine, like the session's.
type conn struct {
	client *client.Client
	// window is ReconnectTimeout: how long an outage is waited out.
	window time.Duration
	// firstWindow, when set, bounds the wait before mpsd first answered:
	// --wait's duration (mps-launch waits that long for a lease, mpsd's
	// absence included), or a nanosecond for --no-wait (no waiting at all).
	firstWindow time.Duration
	// firstWhy names the flag that set firstWindow, for the line that gives up.
	firstWhy string
	// everAnswered: mpsd has sent an event on some stream.
	everAnswered bool

	stream *client.Stream
	events chan streamMsg
	stopRd chan struct{}
	rdDone chan struct{}

	reconnected chan reconnectResult
	stopRc      chan struct{}
	rcDone      chan struct{}

	// predialed brings the connection startPredial made ahead of the first
	// request, until startReconnect takes it for that request's first try.
	predialed chan predialResult

	// contacted: mpsd has answered once; until then a socket with
	// nothing listening is not waited for (no mpsd at all, mpsctl
	// shutdown ended it, or another socket meant), unless an earlier try
	// reached an mpsd or the socket's live marker says one is coming.
	contacted bool
	// An outage: since when mpsd has been unreachable (zero while it
	// answers; only an event ends an outage), the wait before the next
	// try, and the last failure, for the line that gives up.
	awaySince time.Time
	backoff   time.Duration
	lastFail  error
	// sawEvent: the current stream has carried an event.
	sawEvent bool
}

// answered records that mpsd sent an event: the outage, if any, is over.
func (c *conn) answered() {
	c.sawEvent, c.awaySince, c.backoff, c.lastFail = true, time.Time{}, 0, nil
	c.everAnswered = true
}

// outageWindow is how long the current outage is waited out: window, or
// less before mpsd first answered when --wait or --no-wait says so.
func (c *conn) outageWindow() time.Duration {
	if !c.everAnswered && c.firstWindow > 0 {
		return min(c.window, c.firstWindow)
	}
	return c.window
}

// stop closes the stream and ends a reconnect under way (closing the
// stream it may have got). The caller cancels the reconnect's context
// first, so a request in flight ends at once.
func (c *conn) stop() {
	c.close()
	if c.predialed != nil {
		// Never taken (the session ended before its first request): the
		// connect ends with the cancelled context, or is closed here.
		if r := <-c.predialed; r.conn != nil {
			_ = r.conn.Close()
		}
		c.predialed = nil
	}
	if c.rcDone != nil {
		close(c.stopRc)
		<-c.rcDone
		select {
		case rc := <-c.reconnected:
			if rc.stream != nil {
				_ = rc.stream.Close()
			}
		default:
		}
	}
}

type predialResult struct {
	conn net.Conn
	err  error
}

// startPredial connects to mpsd in the background for the first request,
// which names the trampoline that the session starts meanwhile: the
// connect and the trampoline's fork and exec overlap instead of adding up.
func (c *conn) startPredial(ctx context.Context) {
	ch := make(chan predialResult, 1)
	go func() {
		conn, err := c.client.DialLease(ctx)
		ch <- predialResult{conn: conn, err: err}
	}()
	c.predialed = ch
}

type streamMsg struct {
	ev  api.Event
	err error
}

type reconnectResult struct {
	stream *client.Stream
	err    error
	// gaveUp: err is the last failure of a reconnect that ran out of
	// time. since is when its failures began (zero if none).
	gaveUp bool
	since  time.Time
}

// open makes st the session's stream and starts its reader.
func (c *conn) open(st *client.Stream) {
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
	c.stream, c.events, c.stopRd, c.rdDone = st, events, stop, rdDone
	c.sawEvent = false
}

// closeStream closes the stream, which releases the lease, and waits for
// its reader.
func (c *conn) close() {
	if c.stream == nil {
		return
	}
	_ = c.stream.Close()
	close(c.stopRd)
	<-c.rdDone
	c.stream, c.events, c.stopRd, c.rdDone = nil, nil, nil, nil
}

// startReconnect posts the request (again) until mpsd answers, resuming
// the lease the session waits as or holds if there is one. Failures that
// say mpsd is away (ErrUnreachable) are retried with backoff until the
// outage has lasted ReconnectTimeout; only before mpsd first answered is
// a socket with nothing listening (none there, or one that refuses) not
// waited for, unless its live marker says mpsd is coming back
// (nobodyComing).
func (c *conn) startReconnect(ctx context.Context, req api.LeaseRequest) {
	ch := make(chan reconnectResult, 1)
	stop := make(chan struct{})
	rcDone := make(chan struct{})
	var first time.Duration
	if !c.awaySince.IsZero() && c.lastFail != nil && !c.sawEvent && c.contacted {
		// The stream mpsd gave ended before its first event: mpsd is not
		// back, so the next try waits too.
		first = c.nextWait()
	}
	awaySince, contacted, window := c.awaySince, c.contacted, c.outageWindow()
	pre := c.predialed
	c.predialed = nil
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
			var st *client.Stream
			var err error
			if pre != nil {
				// The first try, on the connection made ahead: a connect
				// that failed counts as this try's failure.
				r := <-pre
				pre = nil
				if err = r.err; err == nil {
					st, err = c.client.LeaseOn(ctx, r.conn, req)
				}
			} else {
				st, err = c.client.Lease(ctx, req)
			}
			if (req.AttachPID != 0 || req.WillAttach) && refusesField(err, "attach_pid", "will_attach") {
				// An mpsd older than this launcher (upgraded, not yet
				// restarted) knows neither hint: asked again without
				// them, the trampoline is attached after the grant and
				// the cgroup made at the attach.
				req.AttachPID, req.WillAttach = 0, false
				continue
			}
			if err == nil || !errors.Is(err, ErrUnreachable) {
				ch <- reconnectResult{stream: st, err: err, since: since}
				return
			}
			if !contacted && nobodyComing(c.client.Socket(), err) {
				ch <- reconnectResult{err: noMpsd(c.client.Socket(), err), since: since}
				return
			}
			// An mpsd was there (it took the connection, and dropped the
			// request or gave no answer) or says it is coming back (the
			// live marker): while it restarts it may refuse connections,
			// or have no socket a moment, and is waited for.
			contacted = true
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
	c.reconnected, c.stopRc, c.rcDone = ch, stop, rcDone
}

// refusesField reports whether err is mpsd refusing a request for one of
// the named fields as unknown, as one from before those fields does (it
// decodes requests strictly).
func refusesField(err error, names ...string) bool {
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeBadRequest {
		return false
	}
	for _, n := range names {
		if strings.Contains(ae.Message, `unknown field "`+n+`"`) {
			return true
		}
	}
	return false
}

// request is the lease request to send now: a resume of the session's
// lease if mpsd has named one, else a new request; --wait counts from
// mpsd's first answer until a grant.
func (s *session) request() api.LeaseRequest {
	req := s.req
	if s.st.leaseID != "" {
		req.ResumeLeaseID, req.Attempt = s.st.leaseID, max(s.st.attempt, 1)
	} else if s.kids.spare != nil {
		// mpsd attaches the waiting trampoline with the grant: one round
		// trip less before the command runs.
		req.AttachPID, s.attachAsked = s.kids.spare.pid, s.kids.spare
	}
	if req.WaitMillis > 0 && s.conn.contacted {
		if s.st.granted {
			req.WaitMillis = 0
		} else {
			left := time.Duration(req.WaitMillis)*time.Millisecond - time.Since(s.requestedAt)
			req.WaitMillis = max(1, left.Milliseconds())
		}
	}
	return req
}

// away records a failure that says mpsd is gone; the first one starts the
// outage.
func (c *conn) away(err error) {
	if c.awaySince.IsZero() {
		c.awaySince = time.Now()
	}
	c.lastFail = err
}

// outageOver reports whether mpsd has been away for ReconnectTimeout.
func (c *conn) outageOver() bool {
	return !c.awaySince.IsZero() && time.Since(c.awaySince) >= c.outageWindow()
}

// nextWait is the backoff before the next try in this outage: 20ms,
// doubling to 1s, and never past the outage's end.
func (c *conn) nextWait() time.Duration {
	c.backoff = min(max(2*c.backoff, 20*time.Millisecond), time.Second)
	return max(0, min(c.backoff, c.outageWindow()-time.Since(c.awaySince)))
}

// lost is the error that gives up on mpsd after an outage.
func (c *conn) lost() error {
	took := time.Since(c.awaySince)
	if took >= time.Second {
		took = took.Round(time.Second)
	} else {
		took = took.Round(time.Millisecond)
	}
	if !c.everAnswered && c.firstWindow > 0 && c.firstWindow < c.window {
		return fmt.Errorf("%w: unreachable for %s, and %s: %w", ErrLost, took, c.firstWhy, c.lastFail)
	}
	return fmt.Errorf("%w: unreachable for %s: %w", ErrLost, took, c.lastFail)
}

// onReconnect takes a reconnect's result: a stream to read, or the
// failure that ends the wait for mpsd.
func (s *session) onReconnect(ctx context.Context, rc reconnectResult) *done {
	s.conn.reconnected, s.conn.stopRc, s.conn.rcDone = nil, nil, nil
	if s.conn.awaySince.IsZero() {
		s.conn.awaySince = rc.since
	}
	if s.st.finished {
		// The lease is released by the stream's close (cleanup), if mpsd
		// took it back; whatever mpsd says, the command is done.
		if rc.stream != nil {
			_ = rc.stream.Close()
		}
		return &done{code: 0}
	}
	if rc.gaveUp {
		s.conn.away(rc.err)
		rc.err = s.conn.lost()
	}
	if rc.err != nil {
		return s.step(ctx, input{kind: inGiveUp, err: rc.err})
	}
	if !s.conn.contacted {
		s.conn.contacted, s.requestedAt = true, time.Now()
	}
	s.conn.open(rc.stream)
	s.warnSkew()
	if id := rc.stream.LeaseID(); id != "" {
		return s.step(ctx, input{kind: inLeaseNamed, leaseID: id})
	}
	return nil
}

// nobodyComing reports whether err, a request's failure to reach mpsd at
// socket, found nothing listening there (no socket, or one that refuses
// connections) and no live marker beside it (api.LiveMarker): no mpsd
// serves the socket and none is restarting, so waiting would only delay
// the failure. A connection mpsd took and dropped, or left unanswered,
// says an mpsd is there.
func nobodyComing(socket string, err error) bool {
	if !client.SocketAbsent(err) && !errors.Is(err, syscall.ECONNREFUSED) {
		return false
	}
	_, serr := os.Lstat(api.LiveMarker(socket))
	return serr != nil
}

// noMpsd is the error of a request that found nothing listening at
// socket and no mpsd coming (nobodyComing): a missing socket's as it is
// (it names the path and what to check), a refusing one's saying why
// mps-launch does not wait.
func noMpsd(socket string, err error) error {
	if client.SocketAbsent(err) {
		return err
	}
	return &noMpsdError{socket: socket, err: err}
}

// noMpsdError: the socket is there, nothing listens on it, and no mpsd is
// coming back to it. It wraps the request's ErrUnreachable error
// (ExitFailure).
type noMpsdError struct {
	socket string
	err    error
}

func (e *noMpsdError) Error() string {
	return fmt.Sprintf("%s at %s: connection refused, and no mpsd is coming back to it (no %s beside it: mpsctl shutdown ended mpsd, or none serves this socket); start mpsd, or name another socket with --socket or $%s",
		ErrUnreachable, e.socket, filepath.Base(api.LiveMarker(e.socket)), api.EnvSocket)
}

func (e *noMpsdError) Unwrap() error { return e.err }
