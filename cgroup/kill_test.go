package cgroup

import (
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// withoutCgroupKill makes Kill find no cgroup.kill, as on Linux 5.7 to
// 5.13, until the test ends; it skips where the unified tree has no
// cgroup.freeze (before 5.2) for the fallback to use.
func withoutCgroupKill(t *testing.T, m *Cgroups, rel string) {
	t.Helper()
	if f := filepath.Join(m.v2.dir(rel), "cgroup.freeze"); !exists(f) {
		t.Skipf("no %s: the kernel has no cgroup2 freezer to fall back to", f)
	}
	old := killFile
	killFile = "cgroup.kill-absent"
	t.Cleanup(func() { killFile = old })
}

// hookKillListed sets testHookKillListed until the test ends.
func hookKillListed(t *testing.T, f func(listed []int)) {
	t.Helper()
	testHookKillListed = f
	t.Cleanup(func() { testHookKillListed = nil })
}

func wantSIGKILL(t *testing.T, p *proc) {
	t.Helper()
	var ee *exec.ExitError
	if err := p.wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("%v ended with %v, want SIGKILL", p.cmd.Args, err)
	}
}

// On a kernel without cgroup.kill Kill freezes the unified cgroup,
// signals and thaws instead. os.WriteFile would have opened the missing
// file with O_CREAT, which kernfs refuses with EACCES, and Kill failed.
// (v1 has no cgroup.kill: it always kills through the freezer, which
// TestKillForkStorm covers.)
func TestKillWithoutCgroupKill(t *testing.T) {
	eachBackendOf(t, []Mode{ModeHybrid, ModeV2}, func(t *testing.T, b backend) {
		m := newManager(t, b)
		id := LeaseID{"g", "nokill"}
		l := mustCreate(t, m, id, Limits{})
		withoutCgroupKill(t, m, m.rel(id))
		rounds := 0
		hookKillListed(t, func([]int) { rounds++ })
		p := startIn(t, l.Start, "sleep 1000 & sleep 1000 & echo ready; wait")
		p.readLine(t, 10*time.Second)
		mustKill(t, l)
		if rounds == 0 {
			t.Fatal("Kill did not go through the freezer")
		}
		wantSIGKILL(t, p)
		raw, err := readFile("unified", m.v2.dir(m.rel(id)), "cgroup.freeze")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(raw)); got != "0" {
			t.Fatalf("cgroup.freeze = %q after Kill, want 0 (thawed)", got)
		}
		if err := l.Delete(); err != nil {
			t.Fatal(err)
		}
	})
}

// The freezer kill signals only processes that are still the lease's when
// the signal goes: one that left the lease after it was listed (here moved
// to another lease by the test, as a pid reaped outside the lease and taken
// by a stranger would be) is not signalled, the others are.
func TestKillFrozenSignalsOnlyMembers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		m := newManager(t, b)
		id := LeaseID{"g", "members"}
		l := mustCreate(t, m, id, Limits{})
		if m.v2 != nil {
			withoutCgroupKill(t, m, m.rel(id))
		}
		outside := LeaseID{"g", "outside"}
		mustCreate(t, m, outside, Limits{})
		stay := startIn(t, l.Start, "echo ready; exec sleep 1000")
		leave := startIn(t, l.Start, "echo ready; exec sleep 1000")
		stay.readLine(t, 10*time.Second)
		leave.readLine(t, 10*time.Second)
		pid := leave.cmd.Process.Pid
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pidfd)
		moved := false
		hookKillListed(t, func(listed []int) {
			if moved {
				return
			}
			moved = true
			if !slices.Contains(listed, pid) {
				t.Errorf("first listing %v lacks %d", listed, pid)
			}
			for _, d := range m.dirs(m.rel(outside)) {
				if err := writeProcs(d.hierarchy, d.path, pid); err != nil {
					t.Errorf("move %d out of the lease: %v", pid, err)
				}
			}
		})
		mustKill(t, l)
		if !moved {
			t.Fatal("Kill did not go through the freezer")
		}
		wantSIGKILL(t, stay)
		if exited(pidfd) {
			t.Fatalf("%d, moved out of the lease after it was listed, was killed with it: %v", pid, leave.wait())
		}
		if pids, err := mustOpen(t, m, outside).Pids(); err != nil || !slices.Equal(pids, []int{pid}) {
			t.Fatalf("outside lease Pids() = %v, %v; want [%d]", pids, err, pid)
		}
		if pids, err := l.Pids(); err != nil || len(pids) != 0 {
			t.Fatalf("Pids() after Kill = %v, %v", pids, err)
		}
	})
}

// Signal sends its signal to the lease's processes and only to them: one
// that left the lease after it was listed is not signalled (as a pid
// reaped outside the lease and taken by a stranger would not be).
func TestSignalReachesOnlyMembers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		m := newManager(t, b)
		id := LeaseID{"g", "signal"}
		l := mustCreate(t, m, id, Limits{})
		outside := LeaseID{"g", "outside"}
		mustCreate(t, m, outside, Limits{})
		stay := startIn(t, l.Start, "echo ready; exec sleep 1000")
		leave := startIn(t, l.Start, "echo ready; exec sleep 1000")
		stay.readLine(t, 10*time.Second)
		leave.readLine(t, 10*time.Second)
		pid := leave.cmd.Process.Pid
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pidfd)
		hookKillListed(t, func([]int) {
			for _, d := range m.dirs(m.rel(outside)) {
				if err := writeProcs(d.hierarchy, d.path, pid); err != nil {
					t.Errorf("move %d out of the lease: %v", pid, err)
				}
			}
		})
		n, err := l.Signal(unix.SIGTERM)
		if err != nil || n != 1 {
			t.Fatalf("Signal(SIGTERM) = %d, %v; want 1, nil", n, err)
		}
		var ee *exec.ExitError
		if err := stay.wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Fatalf("the member ended with %v, want SIGTERM", err)
		}
		if exited(pidfd) {
			t.Fatalf("%d, moved out of the lease after it was listed, was signalled: %v", pid, leave.wait())
		}
		mustKill(t, mustOpen(t, m, outside))
	})
}
