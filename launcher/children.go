package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
)

// The command's processes: the spare trampoline started ahead of the
// grant, the running command and its signals, the attach and release of
// a granted lease's trampoline, and a grant held while mpsd is away. The
// trampoline itself and its pipes are trampoline.go's.

// children are the session's processes: the command running under the
// lease (nil when none), and the spare trampoline started ahead of the
// grant, so that its start overlaps the wait for mpsd (nil when none is
// ready). Their fields belong to run's goroutine.
type children struct {
	self, path   string
	argv         []string
	stdin        *os.File
	stdout       *os.File
	stderr       *os.File
	child, spare *child
}

// childExited is closed when the running command has ended.
func (k *children) childExited() <-chan struct{} {
	if k.child == nil {
		return nil
	}
	return k.child.exited
}

// spareExited is closed when the spare trampoline has ended.
func (k *children) spareExited() <-chan struct{} {
	if k.spare == nil {
		return nil
	}
	return k.spare.exited
}

func (k *children) spawnSpare() error {
	c, err := startChild(k.self, k.path, k.argv, k.stdin, k.stdout, k.stderr)
	if err != nil {
		return err
	}
	k.spare = c
	return nil
}

// takeSpare returns the waiting trampoline, or a new one if there is none
// or it has died.
func (k *children) takeSpare() (*child, error) {
	if k.spare != nil {
		select {
		case <-k.spare.exited:
			k.spare.reap()
			k.spare = nil
		default:
		}
	}
	if k.spare == nil {
		if err := k.spawnSpare(); err != nil {
			return nil, err
		}
	}
	c := k.spare
	k.spare = nil
	return c, nil
}

// killAll kills what is still running (the command is the session's
// only while the session lasts: mps-launch never leaves it behind).
func (k *children) killAll() {
	if k.child != nil {
		k.child.kill()
	}
	if k.spare != nil {
		k.spare.kill()
	}
}

// hold keeps lease, whose attach of trampoline c failed with err because
// mpsd could not be reached: c goes back to waiting, unreleased (if mpsd
// did move it before it went, it is in the lease's cgroup, the only place
// the lease's next attach puts it too), and the attach is tried again once
// mpsd is back: by the grant of the resumed stream if the stream ends (it
// shares mpsd's fate), by holdRetry while it stays open. An outage longer
// than ReconnectTimeout gives up.
func (s *session) hold(ctx context.Context, lease *api.Lease, c *child, err error) *done {
	select {
	case <-c.exited:
		c.reap()
	default:
		if s.kids.spare == nil {
			s.kids.spare = c
		} else {
			c.kill()
		}
	}
	s.conn.away(err)
	if s.conn.outageOver() {
		return s.step(ctx, input{kind: inFail, err: s.conn.lost()})
	}
	s.held = lease
	s.holdRetry = time.NewTimer(s.conn.nextWait())
	return nil
}

// retryHeld tries the held lease's attach again, if its stream is still
// open; a reconnect under way brings the lease's state instead.
func (s *session) retryHeld(ctx context.Context) *done {
	s.holdRetry = nil
	lease := s.held
	if lease == nil || s.conn.stream == nil {
		return nil
	}
	if s.conn.outageOver() {
		return s.step(ctx, input{kind: inFail, err: s.conn.lost()})
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

// launch runs the command under lease (step has made it the session's):
// have mpsd attach a waiting trampoline to the lease's cgroup, then
// release it to exec the program.
func (s *session) launch(ctx context.Context, lease *api.Lease) *done {
	s.stopTicker()
	s.status.clear()
	s.status.granted(lease, time.Since(s.queuedSince))
	for retried := false; ; retried = true {
		c, err := s.kids.takeSpare()
		if err != nil {
			return &done{err: err}
		}
		if c != s.attachAsked || lease.AttachedPID != c.pid {
			// Not attached with the grant (another trampoline was named,
			// or mpsd refused it): attached now.
			actx, cancel := context.WithTimeout(ctx, s.cfg.AttachTimeout)
			err = s.client.Attach(actx, lease.ID, lease.Attempt, c.pid)
			if refusesField(err, "attempt") {
				// An mpsd from before attempts were named (upgraded, not
				// yet restarted): it attaches to whatever attempt runs.
				err = s.client.Attach(actx, lease.ID, 0, c.pid)
			}
			cancel()
		}
		if err != nil {
			err = fmt.Errorf("launcher: attach pid %d to lease %s: %w", c.pid, lease.ID, err)
			if errors.Is(err, ErrUnreachable) {
				// mpsd went away between the grant and the attach: the
				// command must neither start outside the lease's cgroup
				// nor be given up while mpsd may come back.
				return s.hold(ctx, lease, c, err)
			}
		} else {
			s.waitSignalsRegistered()
			err = s.startCommand(c, lease)
		}
		if err == nil {
			s.kids.child = c
			s.st.child, s.st.started, s.st.phase = true, true, phaseRunning
			s.conn.awaySince, s.conn.backoff, s.conn.lastFail = time.Time{}, 0, nil
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
		if errors.As(err, &ae) && (ae.Code == api.CodeConflict || ae.Code == api.CodeNotFound) && s.conn.stream != nil {
			// The lease ended between its grant and the attach: a fault
			// revoked it, and the revoked event (or the error that ends
			// the lease) is on its way. Wait for it like for a killed
			// command's; if none comes, the attach's failure stands.
			s.st = attachRefused(s.st, err, time.Now(), s.tm)
			return nil
		}
		if !died || retried {
			return &done{err: err}
		}
	}
}

// waitSignalsRegistered returns once the forwarded signals reach the
// session (at once when they were registered before Run).
func (s *session) waitSignalsRegistered() {
	if s.cfg.signalsRegistered != nil {
		<-s.cfg.signalsRegistered
	}
}

func (s *session) onChildExit(ctx context.Context) *done {
	ws := s.kids.child.reap()
	s.kids.child = nil
	in := input{kind: inChildExit, code: exitStatus(ws), streamOpen: s.conn.stream != nil,
		reconnecting: s.conn.stream == nil && s.conn.reconnected != nil}
	if ws.Signaled() {
		in.killedBy = unix.SignalName(ws.Signal())
	}
	code := in.code
	s.exit = commandExit{status: &code, signal: in.killedBy}
	return s.step(ctx, in)
}

func (s *session) onSignal(ctx context.Context, sig os.Signal) *done {
	return s.step(ctx, input{kind: inSignal, sig: sig})
}

func (s *session) cancelled(err error) *done {
	if s.kids.child != nil {
		s.kids.child.kill()
		s.kids.child = nil
	}
	return &done{err: fmt.Errorf("launcher: %w", err)}
}
