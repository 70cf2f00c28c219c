package cgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Disabled is the Manager for running without cgroups (non-root
// simulation, config cgroup.enabled: false). It keeps leases in memory and
// tracks only the processes it is given, through pidfds so a recycled pid is
// never signalled: nothing is limited, a lease's descendants are seen only
// while they stay in the process group Start made, and List forgets
// everything across restarts. It says so once, when made.
type Disabled struct {
	mu     sync.Mutex
	leases map[LeaseID]*disabledLease
}

var _ Manager = (*Disabled)(nil)

// NewDisabled returns a Disabled manager and logs, once, that isolation is
// off. A nil log discards that warning; mpsd passes its own.
func NewDisabled(log *slog.Logger) *Disabled {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log.Warn("cgroup isolation is off: lease processes are not confined or limited, and descendants that leave their process group survive a kill")
	return &Disabled{leases: map[LeaseID]*disabledLease{}}
}

// Create implements Manager; lim is validated and otherwise ignored.
func (d *Disabled) Create(id LeaseID, lim Limits) (Lease, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.leases[id]; ok {
		return nil, fmt.Errorf("cgroup: create %s (disabled): %w", id, ErrExist)
	}
	l := &disabledLease{d: d, id: id}
	d.leases[id] = l
	return l, nil
}

// Open implements Manager.
func (d *Disabled) Open(id LeaseID) (Lease, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.leases[id]
	if !ok {
		return nil, fmt.Errorf("cgroup: open %s (disabled): %w", id, ErrNotExist)
	}
	return l, nil
}

// Unowned implements Manager: without cgroups nothing is shared.
func (d *Disabled) Unowned() ([]string, error) { return nil, nil }

// List implements Manager.
func (d *Disabled) List() ([]LeaseID, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]LeaseID, 0, len(d.leases))
	for id := range d.leases {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].Group != ids[j].Group {
			return ids[i].Group < ids[j].Group
		}
		return ids[i].Lease < ids[j].Lease
	})
	return ids, nil
}

type trackedProc struct {
	pid   int
	pidfd int
	// group: the process leads a process group Start made, so Kill can
	// signal its descendants too while it lives.
	group bool
}

type disabledLease struct {
	d  *Disabled
	id LeaseID

	mu    sync.Mutex
	procs []trackedProc
}

var _ Lease = (*disabledLease)(nil)

func (l *disabledLease) ID() LeaseID { return l.id }

// Path implements Lease: there is no cgroup, only the lease's name.
func (l *disabledLease) Path() string { return l.id.String() + " (no cgroup)" }

func (l *disabledLease) track(pid int, group bool) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("cgroup: track %d in %s (disabled): %w: %w", pid, l.id, ErrNoProcess, err)
		}
		return fmt.Errorf("cgroup: track %d in %s (disabled): pidfd_open: %w", pid, l.id, err)
	}
	l.procs = append(l.procs, trackedProc{pid: pid, pidfd: fd, group: group})
	return nil
}

// Attach implements Lease: the process is tracked, not confined.
func (l *disabledLease) Attach(pid int) error {
	if err := checkPid(pid); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.track(pid, false)
}

// Start implements Lease. Unless cmd asks for a session or group of its own,
// the child is made a process group leader so that Kill reaches the
// children it forks.
func (l *disabledLease) Start(cmd *exec.Cmd) error {
	if cmd == nil || cmd.Process != nil {
		return fmt.Errorf("%w: nil or already started", ErrInvalidCmd)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	a := cmd.SysProcAttr
	if !a.Setsid && !a.Setpgid {
		a.Setpgid, a.Pgid = true, 0
	}
	group := a.Setsid || (a.Setpgid && a.Pgid == 0)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cgroup: start %s in %s (disabled): %w", cmd.Path, l.id, err)
	}
	// The child cannot have been reaped yet: only the caller's cmd.Wait
	// reaps it, and Start has not returned.
	if err := l.track(cmd.Process.Pid, group); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	return nil
}

// exited reports whether a pidfd says its process has ended (it turns
// readable when the process becomes a zombie).
func exited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0
	}
}

// prune forgets processes that have ended; l.mu is held.
func (l *disabledLease) prune() {
	l.procs = slices.DeleteFunc(l.procs, func(p trackedProc) bool {
		if exited(p.pidfd) {
			unix.Close(p.pidfd)
			return true
		}
		return false
	})
}

// Pids implements Lease: the tracked processes still running.
func (l *disabledLease) Pids() ([]int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prune()
	pids := make([]int, 0, len(l.procs))
	for _, p := range l.procs {
		pids = append(pids, p.pid)
	}
	slices.Sort(pids)
	return pids, nil
}

// Signal implements Lease: sig to each tracked process through its pidfd
// (the processes of a lease without cgroups are those it tracks).
func (l *disabledLease) Signal(sig unix.Signal) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prune()
	n := 0
	for _, p := range l.procs {
		switch err := unix.PidfdSendSignal(p.pidfd, sig, nil, 0); {
		case err == nil:
			n++
		case !errors.Is(err, unix.ESRCH):
			return n, fmt.Errorf("cgroup: signal %d in %s (disabled): %w", p.pid, l.id, err)
		}
	}
	return n, nil
}

// Kill implements Lease: SIGKILL to each tracked process (and the process
// group of those Start made), then wait on their pidfds.
func (l *disabledLease) Kill(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prune()
	for _, p := range l.procs {
		if p.group {
			// The leader is alive (prune just ran), so its pid is
			// still this group's id.
			_ = unix.Kill(-p.pid, unix.SIGKILL)
		}
		if err := unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("cgroup: kill %d in %s (disabled): %w", p.pid, l.id, err)
		}
	}
	w, err := newCtxWaker(ctx)
	if err != nil {
		return fmt.Errorf("cgroup: kill %s (disabled): %w", l.id, err)
	}
	defer w.close()
	for {
		l.prune()
		if len(l.procs) == 0 {
			return nil
		}
		fds := make([]int, len(l.procs))
		for i, p := range l.procs {
			fds[i] = p.pidfd
		}
		if _, err := w.wait(time.Second, fds...); err != nil {
			return fmt.Errorf("cgroup: kill %s (disabled): %d processes left: %w", l.id, len(l.procs), err)
		}
	}
}

// Delete implements Lease.
func (l *disabledLease) Delete() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prune()
	if len(l.procs) > 0 {
		return fmt.Errorf("cgroup: delete %s (disabled): %d processes, first %d: %w", l.id, len(l.procs), l.procs[0].pid, ErrNotEmpty)
	}
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	if l.d.leases[l.id] == l {
		delete(l.d.leases, l.id)
	}
	return nil
}

// Stats implements Lease: without cgroups nothing is accounted.
func (l *disabledLease) Stats() (Stats, error) { return Stats{}, nil }

// Limits implements Lease: without cgroups nothing is enforced.
func (l *disabledLease) Limits() (Limits, error) { return Limits{}, nil }
