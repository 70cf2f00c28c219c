package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

// The mpsd binary killed with SIGKILL (no cleanup of any kind: its
// connections cut, its writes and goroutines stopped wherever they were)
// while 24 launches are running or queued, and started again a second
// later: no workload is killed at the start, a drain stays, every launch
// ends with its command's own status, none with 125, and the queued ones
// keep waiting and then run.
func TestBinarySIGKILL(t *testing.T) {
	e := newEnv(t, `  inference:
    users: [root]
    memory: 20G
    requeue_attempts: 5
`)
	start := func() (*exec.Cmd, *proc) {
		t.Helper()
		cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate")
		cmd.Stderr = e.log
		p := startProc(t, cmd)
		e.waitStatus("mpsd serving with both instances", func(st api.Status) bool { return len(st.Instances) == 2 })
		return cmd, p
	}
	mpsd, p := start()
	e.waitStatus("both instances up", func(st api.Status) bool { return instancesUp(st, 2) })

	// GPU 1 drained: its instance takes no lease, before or after the kill.
	if out, err := e.mpsctl("drain", "--gpu", "1"); err != nil {
		t.Fatalf("mpsctl drain: %v: %s", err, out)
	}
	gate := filepath.Join(e.dir, "gate")
	script := fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done", gate)
	const launches = 24
	var launchers []*proc
	for range launches {
		cmd := exec.Command(filepath.Join(e.bin, "mps-launch"), "--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script)
		cmd.Env = append(os.Environ(), api.EnvSocket+"="+e.socket)
		launchers = append(launchers, startProc(t, cmd))
	}
	// GPU 0 holds ten 10% leases; the other fourteen queue.
	before := e.waitStatus("10 leases running and 14 queued", func(st api.Status) bool {
		return countState(st, api.LeaseRunning) == 10 && countState(st, api.LeaseQueued) == 14 && allHavePIDs(st)
	})
	// Each running lease's gate shell (its sleeps come and go).
	var workloads []int
	for _, l := range before.Leases {
		for _, pid := range l.PIDs {
			if ppid := parentOf(pid); ppid > 0 && !slices.Contains(l.PIDs, ppid) {
				workloads = append(workloads, pid)
			}
		}
	}
	if len(workloads) != 10 {
		t.Fatalf("%d gate shells among the running leases' processes, want 10", len(workloads))
	}

	if err := mpsd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != -1 {
		t.Fatalf("mpsd exit %d after SIGKILL, want killed", code)
	}
	time.Sleep(time.Second) // the outage the launchers ride out, as the issue gives it
	start()

	// Both instances adopted (a revocation at the start would come by
	// then), the running leases and the queue as they were.
	after := e.waitStatus("both instances up, the 10 running leases back, the queue kept", func(st api.Status) bool {
		return adopted(st, 2) && countState(st, api.LeaseRunning) == 10 && countState(st, api.LeaseQueued) == 14
	})
	for _, l := range after.Leases {
		if l.Attempt != 1 {
			t.Errorf("lease %s at attempt %d after mpsd's SIGKILL and start, want 1: nothing may be revoked", l.ID, l.Attempt)
		}
	}
	for _, pid := range workloads {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Errorf("workload %d after mpsd's SIGKILL and start: %v; nothing may be killed at the start", pid, err)
		}
	}
	for _, in := range after.Instances {
		if in.GPUIndexes[0] == 1 && !in.Drained {
			t.Errorf("instance on GPU 1 after mpsd's SIGKILL: %+v; the drain was lost", in)
		}
		if in.GPUIndexes[0] == 1 && in.Clients != 0 {
			t.Errorf("drained instance on GPU 1 holds %d leases", in.Clients)
		}
	}

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, l := range launchers {
		code := l.wait(t)
		if code != 0 || strings.Contains(l.errb.String(), "revoked") {
			t.Errorf("launch %d: exit %d, stderr %q; want its command's 0, never revoked", i+1, code, l.errb.String())
		}
	}
}

// parentOf is pid's parent, or 0 if pid is gone.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// adopted reports whether want instances have their daemon and are past
// their start: ready, or drained (and empty).
func adopted(st api.Status, want int) bool {
	n := 0
	for _, in := range st.Instances {
		if in.DaemonPID > 0 && (in.State == api.InstanceReady || in.State == api.InstanceDrained) {
			n++
		}
	}
	return len(st.Instances) == want && n == want
}

func countState(st api.Status, state string) int {
	n := 0
	for _, l := range st.Leases {
		if l.State == state {
			n++
		}
	}
	return n
}

func allHavePIDs(st api.Status) bool {
	for _, l := range st.Leases {
		if l.State == api.LeaseRunning && len(l.PIDs) == 0 {
			return false
		}
	}
	return true
}

// waitStatus polls the status until cond holds, bounded by waitFor.
func (e *testEnv) waitStatus(what string, cond func(api.Status) bool) api.Status {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := apiStatus(e.socket)
		if err == nil && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("waited %s for %s: status %+v, err %v", waitFor, what, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mpsctl runs the mpsctl binary against e's socket.
func (e *testEnv) mpsctl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(e.bin, "mpsctl"), append([]string{"--socket", e.socket}, args...)...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
