package mpsd

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/cgroup"

	"github.com/mpsd/mpsd/internal/clock"
)

// pathCgroup is a lease cgroup at a given path whose processes are a
// fixed list.
type pathCgroup struct {
	path string
	pids []int
}

func (c *pathCgroup) ID() cgroup.LeaseID              { return cgroup.LeaseID{Group: "g", Lease: "g-1"} }
func (c *pathCgroup) Path() string                    { return c.path }
func (c *pathCgroup) Attach(int) error                { return nil }
func (c *pathCgroup) Start(*exec.Cmd) error           { return errors.New("not here") }
func (c *pathCgroup) Pids() ([]int, error)            { return c.pids, nil }
func (c *pathCgroup) Kill(context.Context) error      { return nil }
func (c *pathCgroup) Signal(unix.Signal) (int, error) { return 0, nil }
func (c *pathCgroup) Delete() error                   { return nil }
func (c *pathCgroup) Stats() (cgroup.Stats, error)    { return cgroup.Stats{}, nil }
func (c *pathCgroup) Limits() (cgroup.Limits, error)  { return cgroup.Limits{}, nil }

func writeProcCgroup(t *testing.T, proc string, pid, line string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A process the reading of every lease's cgroup lacks is looked up
// through /proc/PID/cgroup (its lease's cgroup or one nested in it), and
// what is found is used again until the next reading: a burst of client
// events looks each process up once. The next reading forgets it.
func TestResolveLeasedRemembersLookups(t *testing.T) {
	m, err := cgroup.New(cgroup.Config{Parent: "mpsd-test-lookup"})
	if err != nil {
		t.Skipf("no cgroup hierarchies to name: %v", err)
	}
	if m.Mode() == cgroup.ModeV1 {
		t.Skip("no unified hierarchy: processes are found by reading every cgroup")
	}
	proc := t.TempDir()
	writeProcCgroup(t, proc, "101", "0::/mpsd/0123456789abcdef/g/g-1")
	writeProcCgroup(t, proc, "102", "0::/mpsd/0123456789abcdef/g/g-1/nested")
	writeProcCgroup(t, proc, "103", "0::/mpsd/0123456789abcdef/g/g-10")
	l := &lease{id: "g-1", group: "g", cg: &pathCgroup{path: "mpsd/0123456789abcdef/g/g-1", pids: []int{100}}}
	in := &instance{key: "g/0", group: "g", leases: map[string]*lease{l.id: l}}
	d := &Daemon{clock: clock.Real{}, proc: proc, cg: m, instances: map[string]*instance{in.key: in}}

	want := leaseAt{lease: "g-1", inst: "g/0", group: "g"}
	leased := d.leasedPids(0)
	if got := leased[100]; got != want || len(leased) != 1 {
		t.Fatalf("reading of every cgroup: %v, want 100 in %v", leased, want)
	}
	got := d.resolveLeased([]int{100, 101, 102, 103, 104, 101}, leased)
	for _, pid := range []int{100, 101, 102} {
		if got[pid] != want {
			t.Errorf("pid %d: %v, want %v", pid, got[pid], want)
		}
	}
	for _, pid := range []int{103, 104} { // another cgroup; gone
		if at, ok := got[pid]; ok {
			t.Errorf("pid %d taken as leased (%v)", pid, at)
		}
	}
	if len(leased) != 1 {
		t.Errorf("the reading itself changed: %v", leased)
	}

	// Looked up once: found again without /proc.
	if err := os.RemoveAll(filepath.Join(proc, "101")); err != nil {
		t.Fatal(err)
	}
	if got := d.resolveLeased([]int{101}, d.leasedPids(time.Hour)); got[101] != want {
		t.Errorf("pid 101 looked up before: %v, want %v", got[101], want)
	}
	// A new reading of every cgroup forgets it.
	if got := d.resolveLeased([]int{101}, d.leasedPids(0)); got[101] == want {
		t.Errorf("pid 101 still taken as leased after a new reading: %v", got[101])
	}
}
