package mpsd

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
)

// leaseCgroup is where this mpsd puts a lease's cgroup, relative to the
// cgroup2 mount and with a leading slash, as /proc/<pid>/cgroup names it.
func (e *testEnv) leaseCgroup(group, lease string) string {
	return "/" + filepath.Join(e.parent, e.d.instanceID, group, lease)
}

// A second mpsd with its own socket, directories and state but the same
// cgroup parent leaves the first one's leases alone: it does not take them
// for leftovers of a crash, and the workload runs on in its cgroup and
// ends with exit 0 under the first mpsd.
func TestSecondMpsdLeavesFirstsLeases(t *testing.T) {
	e1 := newEnv(t, oneGroup, "")
	e1.start()
	gateArgs, open := e1.gate("first")
	p := startProc(t, e1.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateArgs...)...))
	st := e1.waitStatus("a running lease with its workload", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	l := st.Leases[0]
	want := e1.leaseCgroup("inference", l.ID)

	e2 := newEnv(t, oneGroup, "")
	e2.parent = e1.parent
	e2.writeConfig(oneGroup, "")
	e2.start()
	if e2.d.instanceID == e1.d.instanceID {
		t.Fatalf("both mpsds have instance id %s", e1.d.instanceID)
	}

	for _, pid := range gateShells(t, l.PIDs) {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("workload pid %d of the first mpsd is gone after the second started: %v", pid, err)
		}
		if got := cgroupOf(t, pid); got != want {
			t.Fatalf("workload pid %d is in %s, want %s", pid, got, want)
		}
	}
	if n := len(e2.d.Status().Leases); n != 0 {
		t.Errorf("the second mpsd has %d leases, want none", n)
	}
	b, err := os.ReadFile(e2.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "cgroup under parent is not ours; left alone") {
		t.Errorf("the second mpsd did not report the first one's cgroups as not its own")
	}
	e2.stop()

	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("the first mpsd's launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	e1.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A restart without a state file (it was lost) kills nothing: the lease
// cgroup under this mpsd's id that no state names is re-adopted, its
// workload runs on in it, and its launcher resumes it and ends with the
// workload's status.
func TestMissingStateLeavesCgroupsAlone(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	gateArgs, open := e.gate("lost")
	p := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateArgs...)...))
	st := e.waitStatus("a running lease with its workload", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(durShells(t, st)) == 1
	})
	l := st.Leases[0]
	want := e.leaseCgroup("inference", l.ID)
	e.d.crashStop.Store(true)
	e.stop()
	for _, name := range []string{"state.json", "state.json" + journalSuffix} {
		if err := os.Remove(filepath.Join(e.dir, "state", name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	e.start()
	// The gate shell: the sleeps it runs come and go.
	for _, pid := range durShells(t, st) {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("workload pid %d killed by a restart without a state file: %v", pid, err)
		}
		if got := cgroupOf(t, pid); got != want {
			t.Fatalf("workload pid %d is in %s, want %s", pid, got, want)
		}
	}
	b, _ := os.ReadFile(e.log.Name())
	if !strings.Contains(string(b), "is in no state file (unwritable, truncated or lost); its workload is re-adopted") {
		t.Errorf("the lease cgroup no state names was not reported as re-adopted")
	}
	if st := e.d.Status(); len(st.Leases) != 1 || st.Leases[0].ID != l.ID || st.Leases[0].SM != 10 || st.Leases[0].MemBytes != 1<<30 {
		t.Errorf("after the restart the leases are %+v, want %s re-adopted with sm 10, mem 1G", st.Leases, l.ID)
	}
	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// The ownership decision: a listed lease cgroup no saved lease owns is
// removed when empty and re-adopted when it has processes, whether the
// state file was read or not.
func TestLeftoverCgroups(t *testing.T) {
	a, b, c := cgroup.LeaseID{Group: "g", Lease: "a"}, cgroup.LeaseID{Group: "g", Lease: "b"}, cgroup.LeaseID{Group: "h", Lease: "c"}
	owned := map[cgroup.LeaseID]bool{a: true}
	rm, adopt := leftoverCgroups([]cgroup.LeaseID{a, b, c}, owned, map[cgroup.LeaseID]bool{a: true, c: true})
	if !slices.Equal(rm, []cgroup.LeaseID{b}) || !slices.Equal(adopt, []cgroup.LeaseID{c}) {
		t.Errorf("remove %v, adopt %v; want remove [b], adopt [c]", rm, adopt)
	}
	rm, adopt = leftoverCgroups([]cgroup.LeaseID{a, b, c}, owned, nil)
	if !slices.Equal(rm, []cgroup.LeaseID{b, c}) || adopt != nil {
		t.Errorf("all empty: remove %v, adopt %v; want remove [b c]", rm, adopt)
	}
}

// The instance id is made once, root-only, read back the same, and a
// damaged one stops mpsd rather than orphaning its leases.
func TestInstanceID(t *testing.T) {
	dir := t.TempDir()
	id, err := loadInstanceID(dir)
	if err != nil || !validInstanceID(id) {
		t.Fatalf("loadInstanceID = %q, %v", id, err)
	}
	fi, err := os.Stat(filepath.Join(dir, instanceIDFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("instance id file: %v, %v; want mode 0600", fi, err)
	}
	if again, err := loadInstanceID(dir); err != nil || again != id {
		t.Fatalf("second load = %q, %v; want %q", again, err, id)
	}
	other, err := loadInstanceID(t.TempDir())
	if err != nil || other == id {
		t.Fatalf("another state dir's id = %q, %v; want a different one", other, err)
	}
	if err := os.WriteFile(filepath.Join(dir, instanceIDFile), []byte("../../x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadInstanceID(dir); !errors.Is(err, errInstanceID) {
		t.Fatalf("corrupt id: %v, want errInstanceID", err)
	}
}
