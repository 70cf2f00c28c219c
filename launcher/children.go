package launcher

import (
	"context"
	"time"

	"github.com/mpsd/mpsd/api"
)

// The command's processes: the spare trampoline started ahead of the
// grant, the running command, and a grant held while mpsd is away. The
// trampoline itself, its pipes and its signals are trampoline.go's.

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
		if s.spare == nil {
			s.spare = c
		} else {
			c.kill()
		}
	}
	s.away(err)
	if s.outageOver() {
		return s.step(ctx, input{kind: inFail, err: s.lost()})
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
		return s.step(ctx, input{kind: inFail, err: s.lost()})
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
