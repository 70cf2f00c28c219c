package mpsd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

// durTmpfsState mounts a small tmpfs as the env's state directory (before
// mpsd makes it), unmounted once mpsd has stopped.
func durTmpfsState(t *testing.T, e *testEnv) string {
	t.Helper()
	dir := filepath.Join(e.dir, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=512k,mode=0700"); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		e.stop()
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// durFill fills the file system of dir with one file until it is full
// and returns a func that frees the space again.
func durFill(t *testing.T, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			break
		}
	}
	_ = f.Close()
	// The state journal's last page may still have room, and a record
	// that fits there is written (and durable) however full the disk:
	// fill it with a line that is no record (the loader skips it), so the
	// next write needs space.
	if j, err := os.OpenFile(filepath.Join(dir, "state.json"+journalSuffix), os.O_WRONLY|os.O_APPEND, 0); err == nil {
		if fi, err := j.Stat(); err == nil && fi.Size()%4096 != 0 {
			pad := bytes.Repeat([]byte(" "), int(4096-fi.Size()%4096))
			pad[len(pad)-1] = '\n'
			_, _ = j.Write(pad)
		}
		_ = j.Close()
	}
	return func() {
		t.Helper()
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

// durMetrics gives the next start of e a fresh metrics listener and
// returns its /readyz URL.
func durMetrics(t *testing.T, e *testEnv) string {
	t.Helper()
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.opts.MetricsListener = mln
	return "http://" + mln.Addr().String() + "/readyz"
}

// durWaitFile waits for path to exist (want) or to stay absent.
func durWaitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not made within %s", path, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// durWaitText waits until get() contains s.
func durWaitText(t *testing.T, what string, get func() string, s string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(get(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("%s shows %q, want %q in it", what, get(), s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// durGated is a workload that marks that it started, then runs until its
// gate opens.
func (e *testEnv) durGated(name string) (args []string, started string, open func()) {
	started = filepath.Join(e.dir, "started-"+name)
	gate := filepath.Join(e.dir, "gate-"+name)
	script := fmt.Sprintf("touch %s; while [ ! -e %s ]; do sleep 0.02; done", started, gate)
	return []string{"/bin/sh", "-c", script}, started, func() {
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
}

// A full state directory holds every new grant, with a reason that names
// the directory (the queued launcher shows it, --no-wait is refused with
// it), fails /readyz and shows in the metrics; once space is free grants
// resume by themselves. A crash of mpsd while the directory is full, and a
// start on it still full, kill nothing: every launcher ends with 0, the
// one held at the crash included.
func TestStateDirFull(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	state := durTmpfsState(t, e)
	readyz := durMetrics(t, e)
	e.start()

	argsA, startedA, openA := e.durGated("a")
	pa := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, argsA...)...))
	durWaitFile(t, startedA)

	free := durFill(t, state)
	// The first request after the disk filled is placed, and its grant's
	// write is the one that fails: it is never told, and its --wait runs
	// out with the reason.
	r := run(t, e.launch("--sm", "10", "--mem", "1G", "--wait", "1s", "--", "/bin/true"))
	if r.code != 75 || !strings.Contains(r.stderr, "state directory "+state) {
		t.Errorf("--wait 1s while the state directory is full: exit %d, stderr %q; want 75 naming the directory", r.code, r.stderr)
	}
	// The next one waits in the queue with that reason.
	master, slave := apitest.OpenPTY(t)
	term := readPTY(master)
	argsB, startedB, openB := e.durGated("b")
	lb := e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, argsB...)...)
	lb.Stderr = slave
	pb := startProc(t, lb)
	durWaitText(t, "the held launcher's terminal", term.String, "state directory "+state+" cannot be written (no space left on device)")
	if st := e.d.Status(); countLeases(st, api.LeaseRunning) != 1 || countLeases(st, api.LeaseQueued) != 1 {
		t.Errorf("status while the grant is held: %d running, %d queued; want the held one shown queued", countLeases(st, api.LeaseRunning), countLeases(st, api.LeaseQueued))
	}
	if _, err := os.Stat(startedB); err == nil {
		t.Fatal("a lease granted while the state directory is full ran its command")
	}
	code, body := httpGet(t, readyz)
	if code != 503 || !strings.Contains(body, "state directory "+state) {
		t.Errorf("/readyz while the state directory is full: %d %q; want 503 naming it", code, body)
	}
	fams := gather(t, e)
	if v, _ := value(fams, "mpsd_state_writable", nil); v != 0 {
		t.Errorf("mpsd_state_writable = %v while writes fail, want 0", v)
	}
	if v, _ := value(fams, "mpsd_state_write_failures_total", nil); v < 1 {
		t.Errorf("mpsd_state_write_failures_total = %v while writes fail, want at least 1", v)
	}
	r = run(t, e.launch("--sm", "10", "--mem", "1G", "--no-wait", "--", "/bin/true"))
	if r.code != 75 || !strings.Contains(r.stderr, "state directory "+state) {
		t.Errorf("--no-wait while the state directory is full: exit %d, stderr %q; want 75 naming the directory", r.code, r.stderr)
	}

	// Space again: the held grant goes through by itself.
	free()
	durWaitFile(t, startedB)
	e.waitStatus("both leases running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 2 })
	if code, body := httpGet(t, readyz); code != 200 {
		t.Errorf("/readyz once the state is written again: %d %q", code, body)
	}
	fams = gather(t, e)
	if v, _ := value(fams, "mpsd_state_writable", nil); v != 1 {
		t.Errorf("mpsd_state_writable = %v once writes succeed, want 1", v)
	}

	// Full again, and a third request held; mpsd dies (SIGKILL) and starts
	// again on the full directory.
	before := e.d.Status()
	workloads := durShells(t, before)
	if len(workloads) != 2 {
		t.Fatalf("workload shells %v, want two", workloads)
	}
	free = durFill(t, state)
	argsC, startedC, openC := e.durGated("c")
	pc := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, argsC...)...))
	e.waitStatus("grants held", func(api.Status) bool { return e.d.heldReason() != "" })
	e.d.crashStop.Store(true)
	e.stop()
	durMetrics(t, e)
	e.start()
	after := e.waitStatus("the two leases re-adopted", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) >= 2 })
	for _, id := range leaseIDs(before) {
		if !slices.Contains(leaseIDs(after), id) {
			t.Errorf("lease %s lost across the crash (leases now %v)", id, leaseIDs(after))
		}
	}
	for _, pid := range workloads {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("workload %d killed across a crash and a start on a full state directory: %v", pid, err)
		}
	}
	free()
	durWaitFile(t, startedC)
	openA()
	openB()
	openC()
	for name, p := range map[string]*proc{"a": pa, "b": pb, "c": pc} {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("launcher %s: exit %d, stderr %q", name, r.code, r.stderr)
		}
	}
	e.waitStatus("no leases", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A state file truncated while mpsd was down (SIGKILLed) is moved aside,
// and the three leases whose record it lost are re-adopted from their
// cgroups: their workloads run on, their launchers resume them and end
// with their workloads' status, 0.
func TestTruncatedStateKeepsLeases(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	var opens []func()
	var procs []*proc
	for _, name := range []string{"t1", "t2", "t3"} {
		args, open := e.gate(name)
		opens = append(opens, open)
		procs = append(procs, startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, args...)...)))
	}
	before := e.waitStatus("three running workloads", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 3 && len(durShells(t, st)) == 3
	})
	workloads := durShells(t, before)
	e.d.crashStop.Store(true)
	e.stop()
	path := filepath.Join(e.dir, "state", "state.json")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	// Its journal too, to nothing: no record of any of the three is
	// left, and only their cgroups tell of them.
	if _, err := os.Stat(path + journalSuffix); err == nil {
		if err := os.Truncate(path+journalSuffix, 0); err != nil {
			t.Fatal(err)
		}
	}
	e.start()
	if aside, _ := filepath.Glob(path + ".bad-*"); len(aside) != 1 {
		t.Errorf("truncated state file not moved aside: %v", aside)
	}
	for _, pid := range workloads {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("workload %d killed at the start after a truncated state file: %v", pid, err)
		}
	}
	after := e.waitStatus("the three leases re-adopted", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 3 })
	if !slices.Equal(leaseIDs(after), leaseIDs(before)) {
		t.Errorf("leases after the restart %v, want %v", leaseIDs(after), leaseIDs(before))
	}
	for _, id := range leaseIDs(before) {
		e.waitLogLine("is in no state file", "its workload is re-adopted", "lease="+id)
	}
	for _, open := range opens {
		open()
	}
	for i, p := range procs {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("launcher %d: exit %d, stderr %q", i+1, r.code, r.stderr)
		}
	}
	e.waitStatus("no leases", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// durShells are the gate shells of the running leases: of their "sh"
// processes, those whose parent is not in the lease too (a shell forks
// before each sleep it runs, and the child is "sh" until it execs).
func durShells(t *testing.T, st api.Status) []int {
	t.Helper()
	var out []int
	for _, l := range st.Leases {
		for _, pid := range shellPIDs(api.Status{Leases: []api.LeaseStatus{l}}) {
			ps, err := readProcStatus("/proc", pid)
			if err == nil && !slices.Contains(l.PIDs, ps.ppid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// durInstanceState is the state of the instance on GPU index.
func durInstanceState(st api.Status, gpu int) string {
	for _, in := range st.Instances {
		if in.GPUIndex == gpu {
			return in.State
		}
	}
	return ""
}

// mpsctl drain, a quarantine and mpsctl resume are saved before they are
// answered and put back at the next start, before any grant: across a
// SIGTERM and across a SIGKILL of mpsd.
func TestIntentSurvivesRestart(t *testing.T) {
	for _, crash := range []bool{false, true} {
		name := "SIGTERM"
		if crash {
			name = "SIGKILL"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, oneGroup, "")
			e.start()
			e.waitStatus("every instance ready", isoAllReady)
			restart := func() api.Status {
				t.Helper()
				e.d.crashStop.Store(crash)
				e.stop()
				e.start()
				// At once: the drain is in force before any instance is up.
				return e.d.Status()
			}

			e.admin(t, "drain", "--gpu", "0")
			// At once the drain holds: draining until the adopted
			// instance's first reconciliation shows no client of no
			// lease, drained from then on.
			if got := durInstanceState(restart(), 0); got != api.InstanceDraining && got != api.InstanceDrained {
				t.Fatalf("GPU 0 after a restart of a drained instance: %q, want draining or drained", got)
			}
			if got := durInstanceState(e.d.Status(), 1); got == api.InstanceDrained || got == api.InstanceDraining {
				t.Errorf("GPU 1, never drained, is %s after the restart", got)
			}
			// Only GPU 1 takes leases.
			e.waitStatus("GPU 1 ready and GPU 0 drained", func(st api.Status) bool {
				return durInstanceState(st, 1) == api.InstanceReady && durInstanceState(st, 0) == api.InstanceDrained
			})

			e.admin(t, "resume", "--gpu", "0")
			restart()
			e.waitStatus("GPU 0 ready after the resume and a restart", func(st api.Status) bool { return durInstanceState(st, 0) == api.InstanceReady })

			// A quarantine (as the watchdog sets it) holds across a restart
			// until resume, which is saved too.
			e.d.mu.Lock()
			for _, in := range e.d.instances {
				if in.gpus[0].Index == 1 {
					in.holds.quarantined = true
				}
			}
			saved := e.d.store.request()
			e.d.mu.Unlock()
			select {
			case <-saved:
			case <-time.After(waitFor):
				t.Fatal("quarantine not saved")
			}
			if got := durInstanceState(restart(), 1); got != api.InstanceQuarantined {
				t.Fatalf("GPU 1 after a restart of a quarantined instance: %q, want quarantined", got)
			}
			e.admin(t, "resume", "--gpu", "1")
			restart()
			e.waitStatus("every instance ready after the resume and a restart", isoAllReady)
		})
	}
}

// A command killed while mpsd was away (here by the test; in life the OOM
// killer or a person: mpsd kills nothing at start) is reported by its
// launcher as such, and the launcher exits 128+9 as for any SIGKILL.
func TestKilledWhileMpsdAway(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	args, _ := e.gate("k")
	p := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, args...)...))
	st := e.waitStatus("a running workload", func(st api.Status) bool { return len(durShells(t, st)) == 1 })
	shell := durShells(t, st)[0]
	e.d.crashStop.Store(true)
	e.stop()
	if err := syscall.Kill(shell, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Gone once its launcher, its parent, has reaped it.
	emutestWaitGone(t, shell)
	e.start()
	r := p.wait(t)
	if r.code != 137 || !strings.Contains(r.stderr, "the command was killed by SIGKILL while mpsd was away (exit status 137)") {
		t.Errorf("launcher: exit %d, stderr %q; want 137 saying the command was killed while mpsd was away", r.code, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}
