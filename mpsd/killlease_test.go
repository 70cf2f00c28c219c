package mpsd

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/cgroup"

	"github.com/mpsd/mpsd/internal/clock"
)

// slowCgroup is a lease cgroup whose Kill waits for the test.
type slowCgroup struct {
	killing chan struct{} // closed when Kill begins
	release chan struct{} // Kill returns once it is closed
	deleted bool
	killed  bool
}

func (c *slowCgroup) ID() cgroup.LeaseID           { return cgroup.LeaseID{Group: "g", Lease: "g-1"} }
func (c *slowCgroup) Path() string                 { return "test/g/g-1" }
func (c *slowCgroup) Attach(int) error             { return nil }
func (c *slowCgroup) Start(*exec.Cmd) error        { return errors.New("not here") }
func (c *slowCgroup) Pids() ([]int, error)         { return []int{10, 11}, nil }
func (c *slowCgroup) Stats() (cgroup.Stats, error) { return cgroup.Stats{}, nil }
func (c *slowCgroup) Limits() (cgroup.Limits, error) {
	return cgroup.Limits{}, nil
}

// Delete refuses while the lease's processes are there, as the real one
// does.
func (c *slowCgroup) Delete() error {
	if !c.killed {
		return cgroup.ErrNotEmpty
	}
	c.deleted = true
	return nil
}
func (c *slowCgroup) Signal(unix.Signal) (int, error) { return 0, nil }
func (c *slowCgroup) Kill(ctx context.Context) error {
	close(c.killing)
	select {
	case <-c.release:
		c.killed = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// within runs f and fails the test if it does not return within a second
// (it would be waiting on the lock a kill holds).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatalf("%s waited on a kill of the lease's cgroup", what)
	}
}

// A kill of a lease's cgroup (up to 30 s) holds no lock: while it runs,
// the lease's pids are read (Status, Xid handling) and an attach to it is
// refused at once; after it, the lease takes no process until its next
// grant (an attach that looked at the lease before the revocation began
// must not make a fresh cgroup no revocation covers).
func TestKillLeaseHoldsNoLock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &Daemon{clock: clock.Real{}, ctx: ctx}
	cg := &slowCgroup{killing: make(chan struct{}), release: make(chan struct{})}
	l := &lease{id: "g-1", group: "g", cg: cg, pids: []int{10}}
	killed := make(chan error, 1)
	go func() { killed <- d.killLease(l) }()
	<-cg.killing
	within(t, "livePids", func() {
		if got := l.livePids(clock.Real{}); !slices.Equal(got, []int{10, 11}) {
			t.Errorf("pids during the kill: %v, want [10 11]", got)
		}
	})
	within(t, "attach", func() {
		if err := d.attach(l, 0, 12, nil); !errors.Is(err, errLeaseEnding) {
			t.Errorf("attach during the kill: %v, want errLeaseEnding", err)
		}
	})
	if err := d.killLease(l); !errors.Is(err, errLeaseEnding) {
		t.Errorf("a second kill while one runs: %v, want errLeaseEnding", err)
	}
	close(cg.release)
	if err := <-killed; err != nil {
		t.Fatalf("kill: %v", err)
	}
	if !cg.deleted || l.cg != nil || l.pids != nil {
		t.Errorf("after the kill: deleted %v, cg %v, pids %v; want the cgroup deleted and forgotten", cg.deleted, l.cg, l.pids)
	}
	// d.cg is nil: an attach that went on to create a cgroup would panic.
	if err := d.attach(l, 0, 12, nil); !errors.Is(err, errLeaseEnding) {
		t.Errorf("attach after the kill: %v, want errLeaseEnding", err)
	}
}
