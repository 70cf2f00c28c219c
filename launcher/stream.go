package launcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
)

// The lease stream and its reconnection: one stream at a time, read by
// one goroutine that sends each event (or the end) to run's loop; a
// reconnect that posts the request again, resuming the session's lease,
// with backoff, until mpsd answers or the outage has lasted
// ReconnectTimeout.

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
func (s *session) open(st *client.Stream) {
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
			if err == nil || !errors.Is(err, ErrUnreachable) || (!contacted && client.SocketAbsent(err)) {
				ch <- reconnectResult{stream: st, err: err, since: since}
				return
			}
			// A socket that refused or dropped the request was there: an
			// mpsd going away may remove it while it restarts.
			contacted = contacted || !client.SocketAbsent(err)
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
	if s.st.leaseID != "" {
		req.ResumeLeaseID, req.Attempt = s.st.leaseID, max(s.st.attempt, 1)
	}
	if req.WaitMillis > 0 && s.contacted {
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

func (s *session) onReconnect(ctx context.Context, rc reconnectResult) *done {
	s.reconnected, s.stopRc, s.rcDone = nil, nil, nil
	if s.awaySince.IsZero() {
		s.awaySince = rc.since
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
		s.away(rc.err)
		rc.err = s.lost()
	}
	if rc.err != nil {
		return s.step(ctx, input{kind: inGiveUp, err: rc.err})
	}
	if !s.contacted {
		s.contacted, s.requestedAt = true, time.Now()
	}
	s.open(rc.stream)
	return nil
}
