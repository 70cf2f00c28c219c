package cgroup

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestDisabled(t *testing.T) {
	h := &recordHandler{}
	d := NewDisabled(slog.New(h))
	id := LeaseID{"g", "l1"}
	l := mustCreate(t, d, id, Limits{MemoryBytes: 1 << 20})
	if _, err := d.Create(id, Limits{}); !errors.Is(err, ErrExist) {
		t.Fatalf("second Create = %v, want ErrExist", err)
	}
	if _, err := d.Create(LeaseID{"g", "bad"}, Limits{Pids: -1}); !errors.Is(err, ErrInvalidLimits) {
		t.Fatalf("Create(bad limits) = %v, want ErrInvalidLimits", err)
	}
	if _, err := d.Open(LeaseID{"g", ".."}); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("Open(..) = %v, want ErrInvalidName", err)
	}
	mustCreate(t, d, LeaseID{"a", "z"}, Limits{})
	if ids, _ := d.List(); !slices.Equal(ids, []LeaseID{{"a", "z"}, id}) {
		t.Fatalf("List() = %v", ids)
	}

	// A leader that forks two children into its process group and prints
	// their pids.
	p := startIn(t, l.Start, `sleep 1000 >/dev/null & a=$!; sleep 1000 >/dev/null & echo $a $!; exec 1>&-; wait`)
	children := strings.Fields(p.readLine(t, 10*time.Second))
	if len(children) != 2 {
		t.Fatalf("children = %v", children)
	}
	outside := startIn(t, (*exec.Cmd).Start, "echo ready; exec sleep 1000")
	outside.readLine(t, 10*time.Second)
	if err := l.Attach(outside.cmd.Process.Pid); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	pids, err := l.Pids()
	want := []int{p.cmd.Process.Pid, outside.cmd.Process.Pid}
	slices.Sort(want)
	if err != nil || !slices.Equal(pids, want) {
		t.Fatalf("Pids() = %v, %v, want %v", pids, err, want)
	}
	if err := l.Delete(); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("Delete with processes = %v, want ErrNotEmpty", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), killDeadline)
	defer cancel()
	if err := l.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if pids, _ := l.Pids(); len(pids) != 0 {
		t.Fatalf("Pids after Kill = %v", pids)
	}
	_ = p.wait()
	_ = outside.wait()
	if os.Geteuid() == 0 {
		// The group's children were orphaned to this (subreaper)
		// process; once reaped, nothing of the group may remain.
		reapOrphans()
		if err := unix.Kill(-p.cmd.Process.Pid, 0); !errors.Is(err, unix.ESRCH) {
			t.Fatalf("process group %d still has members after Kill (%v)", p.cmd.Process.Pid, err)
		}
	} else {
		for _, c := range children {
			pid, _ := strconv.Atoi(c)
			if err := unix.Kill(pid, 0); err == nil {
				// An unreaped zombie answers kill(0) too; accept it
				// only in that state.
				if st, _ := os.ReadFile("/proc/" + c + "/stat"); !strings.Contains(string(st), ") Z ") {
					t.Fatalf("child %d survived Kill", pid)
				}
			}
		}
	}
	if err := l.Delete(); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := d.Open(id); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Open after Delete = %v, want ErrNotExist", err)
	}
	if err := l.Attach(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("Attach(no such pid) = %v, want ErrNoProcess", err)
	}
	if lim, err := l.Limits(); err != nil || lim != (Limits{}) {
		t.Fatalf("Limits() = %+v, %v; nothing is enforced", lim, err)
	}
	if s, err := l.Stats(); err != nil || s != (Stats{}) {
		t.Fatalf("Stats() = %+v, %v; nothing is accounted", s, err)
	}
	if n := h.count(slog.LevelWarn); n != 1 {
		t.Fatalf("%d warnings logged, want exactly one", n)
	}
}

func TestDisabledKillHonoursContext(t *testing.T) {
	d := NewDisabled(discardLogger())
	l := mustCreate(t, d, LeaseID{"g", "ctx"}, Limits{})
	// With its context already cancelled, Kill must still send SIGKILL
	// before it gives up waiting.
	p := startIn(t, l.Start, "echo ready; exec sleep 1000")
	p.readLine(t, 10*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := l.Kill(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Kill(cancelled) = %v", err)
	}
	var ee *exec.ExitError
	if werr := p.wait(); !errors.As(werr, &ee) {
		t.Fatalf("process ended with %v, want killed", werr)
	}
}

// Signal reaches the tracked processes of a lease without cgroups, and
// only them.
func TestDisabledSignal(t *testing.T) {
	d := NewDisabled(slog.New(&recordHandler{}))
	l := mustCreate(t, d, LeaseID{"g", "sig"}, Limits{})
	p := startIn(t, l.Start, "echo ready; exec sleep 1000")
	p.readLine(t, 10*time.Second)
	stranger := startIn(t, (*exec.Cmd).Start, "echo ready; exec sleep 1000")
	stranger.readLine(t, 10*time.Second)
	if n, err := l.Signal(unix.SIGTERM); err != nil || n != 1 {
		t.Fatalf("Signal(SIGTERM) = %d, %v; want 1, nil", n, err)
	}
	var ee *exec.ExitError
	if err := p.wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("the lease's process ended with %v, want SIGTERM", err)
	}
	if err := stranger.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a process outside the lease was signalled: %v", err)
	}
	_ = stranger.cmd.Process.Kill()
	_ = stranger.wait()
}
