package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStartMechanism checks how Start closes the attach race, not just its
// outcome: while the v1 attach runs, the child must already have exec'd the
// program, be stopped under ptrace (state t), and, where the unified tree is
// used, already be in the lease there through CLONE_INTO_CGROUP.
// (v2 has no v1 attach step: the clone itself places the child, which
// TestStartInsideCgroup covers.)
func TestStartMechanism(t *testing.T) {
	eachBackendOf(t, []Mode{ModeHybrid, ModeV1}, func(t *testing.T, b backend) {
		m := newManager(t, b)
		id := LeaseID{"g", "mech"}
		mustCreate(t, m, id, Limits{})
		rel := m.rel(id)
		cmd := exec.Command("/bin/sh", "-c", "cat /proc/self/cgroup")
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.SysProcAttr = &syscall.SysProcAttr{}
		if m.v2 != nil {
			fd, err := unix.Open(m.v2.dir(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		}
		var state, exe string
		var before map[string]string
		err := startTraced(cmd, func(pid int) error {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				return err
			}
			// state is the first field after "(comm)".
			state = strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))[0]
			if exe, err = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil {
				return err
			}
			raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if err != nil {
				return err
			}
			before = cgroupPaths(t, raw)
			return m.v1.attach(rel, pid)
		})
		if err != nil {
			t.Fatalf("startTraced: %v", err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("wait: %v", err)
		}
		if state != "t" {
			t.Errorf("child state during attach = %q, want t (ptrace stop)", state)
		}
		if resolved, _ := os.Readlink("/bin/sh"); !strings.HasSuffix(exe, "sh") && exe != resolved {
			t.Errorf("child exe during attach = %q, want the shell (exec already done)", exe)
		}
		if before["memory"] == "/"+rel {
			t.Errorf("child was in the v1 lease before attach; the test would not notice a racy start")
		}
		if m.v2 != nil && before["unified"] != "/"+rel {
			t.Errorf("unified cgroup before attach = %q, want %q (CLONE_INTO_CGROUP)", before["unified"], "/"+rel)
		}
		checkInside(t, m, rel, out.Bytes())
	})
}

// TestStartTracedAttachFails: when the attach step fails, Start must leave
// nothing running and must reap the child itself.
func TestStartTracedAttachFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: ptrace start is only used with cgroups")
	}
	cmd := exec.Command("/bin/sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	var pid int
	err := startTraced(cmd, func(p int) error {
		pid = p
		return fmt.Errorf("attach refused")
	})
	if err == nil || !strings.Contains(err.Error(), "attach refused") {
		t.Fatalf("startTraced = %v, want the attach error", err)
	}
	if cmd.ProcessState == nil {
		t.Fatalf("child %d was not reaped", pid)
	}
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", cmd.ProcessState)
	}
}

// TestStartWithoutCloneInto runs Start as on a kernel older than 5.7, where
// the unified tree cannot be cloned into: the child must still be inside
// every hierarchy of the lease, its first fork included, through the ptrace
// attach. On this host the kernel has CLONE_INTO_CGROUP, so the test also
// checks that the manager uses it by default.
// (v1 has no unified tree: it always starts through the ptrace attach,
// which TestStartInsideCgroup covers.)
func TestStartWithoutCloneInto(t *testing.T) {
	eachBackendOf(t, []Mode{ModeHybrid, ModeV2}, func(t *testing.T, b backend) {
		m := newManager(t, b)
		if !m.cloneInto {
			t.Errorf("cloneInto = false on kernel with CLONE_INTO_CGROUP (%v)", kernelHasCloneIntoCgroup())
		}
		m.cloneInto = false
		id := LeaseID{"g", "noclone"}
		l := mustCreate(t, m, id, Limits{})
		checkStartedInside(t, m, l, id)
		if err := l.Delete(); err != nil {
			t.Fatal(err)
		}
		if err := l.Start(exec.Command("/bin/true")); !errors.Is(err, ErrNotExist) {
			t.Fatalf("Start(deleted) = %v, want ErrNotExist", err)
		}
	})
}

// A child killed before its exec stop (here by the test, as by the OOM
// killer or an operator) has ended: Start must neither signal it nor reap
// it itself. Reaped early, its pid would be free, for a stranger, while
// Start still killed it and cmd.Wait waited for it (by number, where the
// kernel has no pidfds); left to cmd.Wait, it ends with its real status.
func TestStartTracedChildEndsBeforeExecStop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: ptrace start is only used with cgroups")
	}
	kills := 0
	killTracee = func(p *os.Process) error {
		kills++
		return p.Kill()
	}
	testHookTracedStarted = func(p *os.Process) {
		if err := p.Kill(); err != nil {
			t.Errorf("kill the child before its exec stop: %v", err)
		}
	}
	t.Cleanup(func() {
		killTracee = (*os.Process).Kill
		testHookTracedStarted = nil
	})
	cmd := exec.Command("/bin/sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	attached := false
	err := startTraced(cmd, func(int) error {
		attached = true
		return nil
	})
	if !errors.Is(err, ErrNoProcess) {
		t.Fatalf("startTraced = %v, want ErrNoProcess", err)
	}
	t.Log(err)
	if attached {
		t.Error("attach ran for a child that had ended")
	}
	if kills != 0 {
		t.Errorf("%d kills sent to a child that had ended", kills)
	}
	if cmd.ProcessState == nil {
		t.Fatal("cmd.Wait found no child: it was reaped before, and its pid was free while Start used it")
	}
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", cmd.ProcessState)
	}
}
