package cgroup

import (
	"context"
	"fmt"
	"os/exec"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Manager creates, finds and lists lease cgroups. Both *Cgroups (real
// cgroupfs) and *Disabled (no isolation) implement it.
type Manager interface {
	// Create makes the lease cgroup <parent>/<owner>/<group>/<lease> with
	// limits applied. It fails with ErrExist when it is already there.
	Create(id LeaseID, lim Limits) (Lease, error)
	// Open returns an existing lease cgroup (re-adoption after an mpsd
	// restart), or ErrNotExist.
	Open(id LeaseID) (Lease, error)
	// List returns every lease cgroup of this manager's owner, sorted, so
	// mpsd can re-adopt or reap them after a restart.
	List() ([]LeaseID, error)
	// Unowned names (relative to the mounts) the cgroups directly under the
	// parent that are not this owner's: another owner's leases, leases made
	// before owners, anything else. They are reported, never touched.
	Unowned() ([]string, error)
}

// Lease is one lease's cgroup: the workload and all its descendants.
// Methods are safe for concurrent use; Attach, Start, Kill and Delete on one
// Lease value are serialized.
type Lease interface {
	ID() LeaseID
	// Path is where the lease cgroup is, relative to the cgroup mounts,
	// for logs.
	Path() string
	// Attach moves a running process (and, on v1, only that process; its
	// existing children stay where they are) into the lease.
	Attach(pid int) error
	// Start starts cmd, which the caller built and has not started, so that
	// it is inside the lease before the program's first instruction. If
	// Start returns an error no process is left running and cmd.Wait must
	// not be called; otherwise the caller owns cmd and must Wait for it.
	Start(cmd *exec.Cmd) error
	// Pids lists every process in the lease, nested cgroups included.
	Pids() ([]int, error)
	// Kill SIGKILLs everything in the lease and returns only when it is
	// empty, processes forked during the kill included, or when ctx ends.
	Kill(ctx context.Context) error
	// Signal sends sig to every process in the lease, each proven a
	// member through a pidfd, and returns how many it reached; it does
	// not wait for them.
	Signal(sig unix.Signal) (int, error)
	// Delete removes the lease cgroup (and any cgroups the workload nested
	// in it). It fails with ErrNotEmpty while processes remain and returns
	// nil when the lease is already gone.
	Delete() error
	// Stats reads the lease's current resource usage.
	Stats() (Stats, error)
	// Limits reads back the limits the kernel enforces on the lease.
	Limits() (Limits, error)
}

// LeaseID names a lease cgroup: <parent>/<owner>/<Group>/<Lease>.
type LeaseID struct {
	Group string
	Lease string
}

func (id LeaseID) String() string { return id.Group + "/" + id.Lease }

// Validate checks that both parts are single safe path elements.
func (id LeaseID) Validate() error {
	if !validName(id.Group) {
		return fmt.Errorf("%w: group %q", ErrInvalidName, id.Group)
	}
	if !validName(id.Lease) {
		return fmt.Errorf("%w: lease %q", ErrInvalidName, id.Lease)
	}
	return nil
}

// Limits are a lease's host resource limits. The zero value limits nothing.
type Limits struct {
	// CPUWeight is the lease's relative CPU share, 1..10000 as in cgroup v2
	// cpu.weight (100 is the kernel default); 0 leaves the default. On v1 it
	// is converted to cpu.shares, and read back converted again: an unset
	// v1 weight reads back as 40 (cpu.shares 1024).
	CPUWeight uint64
	// CPUQuota is the CPU time the lease may use per CPUPeriod, at least
	// 1ms; 0 means no quota. 2*CPUPeriod allows two CPUs' worth.
	CPUQuota time.Duration
	// CPUPeriod is the quota period, 1ms..1s; 0 means 100ms when CPUQuota is
	// set. It means nothing without a quota, so it is read back only with
	// one.
	CPUPeriod time.Duration
	// MemoryBytes caps host memory (memory.max / memory.limit_in_bytes); 0
	// means unlimited. The kernel rounds it down to whole pages.
	MemoryBytes int64
	// Pids caps the number of tasks (pids.max); 0 means unlimited.
	Pids int64
}

// DefaultCPUPeriod is the kernel's default CFS period, used when a quota is
// given without a period.
const DefaultCPUPeriod = 100 * time.Millisecond

// Validate checks the limits against the kernel's ranges.
func (l Limits) Validate() error {
	switch {
	case l.CPUWeight > maxWeight:
		return fmt.Errorf("%w: cpu weight %d not in 1..%d", ErrInvalidLimits, l.CPUWeight, maxWeight)
	case l.CPUQuota < 0 || (l.CPUQuota > 0 && l.CPUQuota < time.Millisecond):
		return fmt.Errorf("%w: cpu quota %s below 1ms", ErrInvalidLimits, l.CPUQuota)
	case l.CPUPeriod != 0 && (l.CPUPeriod < time.Millisecond || l.CPUPeriod > time.Second):
		return fmt.Errorf("%w: cpu period %s not in 1ms..1s", ErrInvalidLimits, l.CPUPeriod)
	case l.CPUPeriod != 0 && l.CPUQuota == 0:
		return fmt.Errorf("%w: cpu period %s without a quota", ErrInvalidLimits, l.CPUPeriod)
	case l.MemoryBytes < 0:
		return fmt.Errorf("%w: memory %d bytes", ErrInvalidLimits, l.MemoryBytes)
	case l.Pids < 0:
		return fmt.Errorf("%w: pids %d", ErrInvalidLimits, l.Pids)
	}
	return nil
}

func (l Limits) period() time.Duration {
	if l.CPUQuota > 0 && l.CPUPeriod == 0 {
		return DefaultCPUPeriod
	}
	return l.CPUPeriod
}

// Stats is a lease's resource usage.
type Stats struct {
	// CPUUsage is the CPU time used by the lease's processes so far.
	CPUUsage time.Duration
	// MemoryBytes is the host memory charged to the lease now; 0 where the
	// memory controller is not available.
	MemoryBytes uint64
	// Pids is the number of tasks in the lease now; 0 where the pids
	// controller is not available.
	Pids uint64
}

// validParent checks a configured parent path: one or more safe elements
// separated by slashes, relative, already clean (so it cannot climb out of
// the mount or alias another path). Unlike group and lease names, elements
// may contain dots so a delegated systemd subtree (system.slice/mpsd.service)
// is accepted; each element must still start with a letter or digit.
func validParent(p string) error {
	if p == "" || path.Clean(p) != p || strings.HasPrefix(p, "/") {
		return fmt.Errorf("%w: parent %q must be a clean relative path", ErrInvalidName, p)
	}
	for _, e := range strings.Split(p, "/") {
		if !validName(strings.ReplaceAll(e, ".", "-")) || strings.HasPrefix(e, ".") {
			return fmt.Errorf("%w: parent %q element %q", ErrInvalidName, p, e)
		}
	}
	return nil
}
