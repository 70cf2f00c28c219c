package cgroup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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
// nothing in it can fork, SIGKILL every process listed, thaw so the signals
// are delivered, and repeat until the membership tree is empty. A freeze
// that does not complete within freezeWait (a task in uninterruptible
// sleep, for example in a GPU driver) does not stall the kill: the
// processes seen so far are killed anyway and the next round tries again.
// Each is signalled through a pidfd, never by its number (see signalListed).

const (
	rekillInterval = 100 * time.Millisecond
	freezeWait     = 100 * time.Millisecond
	// maxBackoff bounds one sleep of the v1 paths, which have no event to
	// wait for.
	maxBackoff = 10 * time.Millisecond
)

// killFile is the unified tree's kill file, a variable only so that a test
// can name one that does not exist, as on kernels before 5.14.
var killFile = "cgroup.kill"

// testHookKillListed, set by tests only, runs in every round of killFrozen
// between the pinning of the listed processes and the second listing.
var testHookKillListed func(listed []int)

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
		if err := writeFile(filepath.Join(dir, killFile), "1"); err != nil {
			return fmt.Errorf("cgroup: unified: kill %s: write %s: %w", dir, killFile, err)
		}
		return nil
	}
	if err := kill(); err != nil {
		// No cgroup.kill (Linux 5.7 to 5.13) in a cgroup that is there:
		// freeze and signal instead. writeFile opens without O_CREAT, or
		// the missing file would read as EACCES.
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
			_, err = l.signalListed(pids, unix.SIGKILL)
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

// signalListed sends sig to the processes of listed that are still the
// lease's, each through a pidfd and never mpsd itself, and returns how
// many it signalled. A pid number alone is not enough: the freeze is best
// effort, an exiting task cannot be frozen and stays listed until it is
// gone, and once a reaper outside the lease has reaped it its number may
// be a stranger's. So each listed pid is pinned with a pidfd first, the
// lease is listed again, and a pidfd is signalled only if its pid is in
// that second listing and its process is alive after it: alive, it has
// held that number since before the second listing, which was therefore
// of this process.
func (l *lease) signalListed(listed []int, sig unix.Signal) (int, error) {
	dir := l.m.memberDir(l.rel)
	self := os.Getpid()
	type pinned struct{ pid, fd int }
	fds := make([]pinned, 0, len(listed))
	defer func() {
		for _, p := range fds {
			unix.Close(p.fd)
		}
	}()
open:
	for _, pid := range listed {
		if pid == self {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		switch {
		case err == nil:
			fds = append(fds, pinned{pid, fd})
		case errors.Is(err, unix.ESRCH):
			// Gone and reaped already.
		case errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE):
			// Out of descriptors: those pinned are signalled now, the
			// rest in a later round.
			break open
		default:
			return 0, fmt.Errorf("cgroup: signal %s: pidfd_open %d: %w", dir, pid, err)
		}
	}
	if testHookKillListed != nil {
		testHookKillListed(listed)
	}
	members, err := l.pids()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range fds {
		if _, ok := slices.BinarySearch(members, p.pid); !ok || exited(p.fd) {
			continue
		}
		switch err := unix.PidfdSendSignal(p.fd, sig, nil, 0); {
		case err == nil:
			n++
		case !errors.Is(err, unix.ESRCH):
			return n, fmt.Errorf("cgroup: signal %s: pidfd_send_signal %d: %w", dir, p.pid, err)
		}
	}
	return n, nil
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
