package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/containerd/cgroups/v3/cgroup1"
	"golang.org/x/sys/unix"
)

// lease is a Lease on real cgroupfs.
type lease struct {
	m   *Cgroups
	id  LeaseID
	rel string
	mu  sync.Mutex
}

var _ Lease = (*lease)(nil)

func (l *lease) ID() LeaseID { return l.id }

func (l *lease) Path() string { return l.rel }

// checkPid refuses a pid that can never be attached: none, mpsd itself,
// and any thread of mpsd, whose id written to cgroup.procs moves the whole
// process. tgkill with signal 0 sends nothing and succeeds exactly when
// pid is one of this process's threads: one system call, as Attach is on
// the launch path, and no /proc needed.
func checkPid(pid int) error {
	if pid <= 0 || pid == os.Getpid() || unix.Tgkill(os.Getpid(), pid, 0) == nil {
		return fmt.Errorf("%w: %d", ErrInvalidPid, pid)
	}
	return nil
}

// Attach implements Lease. On v1 and hybrid the v1 controllers are written
// first so that, by the time the process shows in the membership tree, its
// limits already apply.
func (l *lease) Attach(pid int) error {
	if err := checkPid(pid); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m.v1 != nil {
		if err := l.m.v1.attach(l.rel, pid); err != nil {
			return err
		}
	}
	if l.m.v2 != nil {
		return writeProcs("unified", l.m.v2.dir(l.rel), pid)
	}
	return nil
}

// Pids implements Lease.
func (l *lease) Pids() ([]int, error) {
	return l.pids()
}

// pids reads cgroup.procs of the membership directory and every cgroup
// nested in it. Nested cgroups that vanish during the walk are skipped.
func (l *lease) pids() ([]int, error) {
	root := l.m.memberDir(l.rel)
	hier := "unified"
	if l.m.v2 == nil {
		hier = string(cgroup1.Freezer)
	}
	var pids []int
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != root && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			if p != root && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		got, err := parsePids(b)
		if err != nil {
			return fmt.Errorf("%s/cgroup.procs: %w", p, err)
		}
		pids = append(pids, got...)
		return nil
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("cgroup: %s: list processes of %s: %w: %w", hier, root, ErrNotExist, err)
		}
		return nil, fmt.Errorf("cgroup: %s: list processes of %s: %w", hier, root, err)
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// Kill implements Lease.
func (l *lease) Kill(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m.v2 != nil {
		return l.killV2(ctx)
	}
	return l.killFrozen(ctx, v1Freezer{dir: l.m.v1.dir(cgroup1.Freezer, l.rel)})
}

// Signal implements Lease: one round of pinning, listing and signalling
// (signalListed), with no freeze: a process forked meanwhile may miss it,
// as it would miss a signal sent to a process group.
func (l *lease) Signal(sig unix.Signal) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	pids, err := l.pids()
	if err != nil {
		return 0, err
	}
	return l.signalListed(pids, sig)
}

// Delete implements Lease.
func (l *lease) Delete() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if !l.rmdirs() {
		pids, err := l.pids()
		switch {
		case errors.Is(err, ErrNotExist):
		case err != nil:
			return err
		case len(pids) > 0:
			return fmt.Errorf("cgroup: delete %s: %d processes, first %d: %w", l.m.memberDir(l.rel), len(pids), pids[0], ErrNotEmpty)
		}
		if err := l.remove(); err != nil {
			return err
		}
	}
	// The group directory goes with its last lease; the parent may be a
	// delegated subtree mpsd does not own, so it stays.
	for _, d := range l.m.dirs(filepath.Dir(l.rel)) {
		if err := unix.Rmdir(d.path); err != nil && !errors.Is(err, unix.ENOENT) &&
			!errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("cgroup: %s: remove group %s: %w", d.hierarchy, d.path, err)
		}
	}
	l.m.log.Debug("lease cgroup deleted", "lease", l.id.String())
	return nil
}

// rmdirs removes the lease directory from every hierarchy, membership
// last, with one rmdir each, and says whether all are gone. The kernel
// refuses to remove a cgroup that holds a process or a cgroup (EBUSY), so
// this cannot lose a process that forks meanwhile; on the first refusal
// it stops, and Delete looks at what is left (most leases end empty, and
// are so removed without reading their directories).
func (l *lease) rmdirs() bool {
	dirs := l.m.dirs(l.rel)
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Rmdir(dirs[i].path); err != nil && !errors.Is(err, unix.ENOENT) {
			return false
		}
	}
	return true
}

// removeEmpty removes a cgroup that holds no process: one rmdir in each
// hierarchy, and a walk of what that leaves (cgroups made inside it).
func (l *lease) removeEmpty() error {
	if l.rmdirs() {
		return nil
	}
	return l.remove()
}

// remove removes the lease directory from every hierarchy, membership last
// so a lease that fails half way is still listed and can be retried.
func (l *lease) remove() error {
	dirs := l.m.dirs(l.rel)
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if i == 0 && len(errs) > 0 {
			// Another hierarchy is still busy (an exited process not yet
			// reaped stays in a v1 cgroup): the membership directory stays,
			// and with it the lease, listed, killable and deleted again.
			break
		}
		if err := removeTree(d.path); err != nil {
			if errors.Is(err, unix.EBUSY) {
				err = fmt.Errorf("%w: %w", ErrNotEmpty, err)
			}
			errs = append(errs, fmt.Errorf("cgroup: %s: remove %s: %w", d.hierarchy, d.path, err))
		}
	}
	return errors.Join(errs...)
}

// Stats implements Lease.
func (l *lease) Stats() (Stats, error) {
	if l.m.v1 != nil {
		return l.m.v1.stats(l.rel)
	}
	return l.m.v2.stats(l.rel)
}

// Limits implements Lease.
func (l *lease) Limits() (Limits, error) {
	if l.m.v1 != nil {
		return l.m.v1.limits(l.rel)
	}
	return l.m.v2.limits(l.rel)
}
