package cgroup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Kill strategy.
//
// v2 and hybrid write cgroup.kill: the kernel SIGKILLs every task in the
// subtree and, while the kill is in progress, every task forked into it, so
// a fork storm cannot escape. Kill then waits for cgroup.events to say
// populated 0, woken by inotify on that file. Because a process attached
// from outside after the write would not be killed, the wait also wakes every
// rekillInterval and writes cgroup.kill again.
//
// v1 (and v2 kernels before 5.14 without cgroup.kill) freeze the cgroup so
// nothing in it can fork, SIGKILL every pid, thaw so the signals are
// delivered, and repeat until the membership tree is empty. A freeze that
// does not complete within freezeWait (a task in uninterruptible sleep, for
// example in a GPU driver) does not stall the kill: the pids seen so far are
// killed anyway and the next round tries again.

const (
	rekillInterval = 100 * time.Millisecond
	freezeWait     = 100 * time.Millisecond
	// maxBackoff bounds one sleep of the v1 paths, which have no event to
	// wait for.
	maxBackoff = 10 * time.Millisecond
)

// freezer is the cgroup freezer of one hierarchy.
type freezer interface {
	set(frozen bool) error
	frozen() (bool, error)
}

func (l *lease) killV2(ctx context.Context) error {
	dir := l.m.v2.dir(l.rel)
	events := filepath.Join(dir, "cgroup.events")
	// An empty cgroup has nothing to kill, as on the v1 path: the write
	// to cgroup.kill (under the kernel's cgroup lock, which every attach
	// and rmdir on the host contends for) is skipped. Only a member forks
	// into it, and the caller keeps attaches out while it kills.
	if b, err := readFile("unified", dir, "cgroup.events"); err == nil {
		if populated, err := parsePopulated(b); err == nil && !populated {
			return nil
		}
	}
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("cgroup: unified: kill %s: inotify: %w", dir, err)
	}
	defer unix.Close(in)
	// Watch before killing so the transition to populated 0 cannot be
	// missed.
	if _, err := unix.InotifyAddWatch(in, events, unix.IN_MODIFY); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("cgroup: unified: kill %s: %w: %w", dir, ErrNotExist, err)
		}
		return fmt.Errorf("cgroup: unified: kill %s: watch %s: %w", dir, events, err)
	}
	kill := func() error {
		err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		if err != nil {
			return fmt.Errorf("cgroup: unified: kill %s: write cgroup.kill: %w", dir, err)
		}
		return nil
	}
	if err := kill(); err != nil {
		if errors.Is(err, fs.ErrNotExist) && exists(dir) {
			return l.killFrozen(ctx, v2Freezer{dir: dir})
		}
		return err
	}
	w, err := newCtxWaker(ctx)
	if err != nil {
		return fmt.Errorf("cgroup: unified: kill %s: %w", dir, err)
	}
	defer w.close()
	buf := make([]byte, 4096)
	for {
		b, err := readFile("unified", dir, "cgroup.events")
		if err != nil {
			return err
		}
		populated, err := parsePopulated(b)
		if err != nil {
			return fmt.Errorf("cgroup: unified: kill %s: %w", dir, err)
		}
		if !populated {
			return nil
		}
		ready, err := w.wait(rekillInterval, in)
		if err != nil {
			return fmt.Errorf("cgroup: unified: kill %s: %w", dir, err)
		}
		if ready {
			// Drain so the next poll blocks until the next change.
			for {
				if _, err := unix.Read(in, buf); err != nil {
					break
				}
			}
			continue
		}
		if err := kill(); err != nil {
			return err
		}
	}
}

// killFrozen is the freeze, SIGKILL, thaw loop.
func (l *lease) killFrozen(ctx context.Context, f freezer) error {
	self := os.Getpid()
	for round := 1; ; round++ {
		pids, err := l.pids()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("cgroup: kill %s: %d processes left after %d rounds: %w", l.m.memberDir(l.rel), len(pids), round-1, err)
		}
		if err := f.set(true); err != nil {
			return err
		}
		// Best effort: see the strategy comment.
		_ = waitFor(ctx, freezeWait, f.frozen)
		pids, err = l.pids()
		if err == nil {
			for _, pid := range pids {
				if pid != self {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		if terr := f.set(false); terr != nil {
			return errors.Join(err, terr)
		}
		if err != nil {
			return err
		}
		if err := waitFor(ctx, rekillInterval, func() (bool, error) {
			p, err := l.pids()
			return len(p) == 0, err
		}); err != nil && !errors.Is(err, errTimeout) {
			if ctx.Err() == nil {
				return err
			}
		}
	}
}

var errTimeout = errors.New("timed out")

// waitFor polls cond with exponential backoff (from 50µs to maxBackoff)
// until it is true, limit has passed (errTimeout) or ctx ends.
func waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	backoff := 50 * time.Microsecond
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if !time.Now().Before(deadline) {
			return errTimeout
		}
		t.Reset(backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// ctxWaker lets a poll(2) loop end when ctx does: an eventfd that a
// context.AfterFunc makes readable.
type ctxWaker struct {
	ctx  context.Context
	efd  int
	stop func() bool

	mu     sync.Mutex // orders the AfterFunc's write against close
	closed bool
}

func newCtxWaker(ctx context.Context) (*ctxWaker, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	w := &ctxWaker{ctx: ctx, efd: efd}
	w.stop = context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.closed {
			var one [8]byte
			binary.NativeEndian.PutUint64(one[:], 1)
			_, _ = unix.Write(w.efd, one[:])
		}
	})
	return w, nil
}

func (w *ctxWaker) close() {
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	unix.Close(w.efd)
}

// wait blocks until one of fds is readable (true), timeout passes (false)
// or the context ends (its error).
func (w *ctxWaker) wait(timeout time.Duration, fds ...int) (bool, error) {
	pfds := make([]unix.PollFd, 0, len(fds)+1)
	for _, fd := range fds {
		pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	pfds = append(pfds, unix.PollFd{Fd: int32(w.efd), Events: unix.POLLIN})
	deadline := time.Now().Add(timeout)
	for {
		if err := w.ctx.Err(); err != nil {
			return false, err
		}
		ms := int(time.Until(deadline).Milliseconds())
		if ms < 0 {
			return false, nil
		}
		n, err := unix.Poll(pfds, ms+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll: %w", err)
		}
		if n == 0 {
			return false, nil
		}
		if pfds[len(pfds)-1].Revents != 0 {
			return false, w.ctx.Err()
		}
		return true, nil
	}
}
