package mpsd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/policy"
)

// mpsd killed (as SIGKILL leaves it: no state written on the way out)
// while 24 launches of a small group wait or run, and started again a
// second later: no launch gives up. Each launcher resumes its own lease,
// the running ones with their commands still running and the queued ones
// in their place in the queue, and every launch completes with its
// command's 0.
func TestRestartWithLaunchesWaiting(t *testing.T) {
	const launches, running = 24, 2
	e := newEnvGPUs(t, 1, `  small:
    users: [root]
    sm_percent: 100
    memory: 20G
`, "")
	e.start()
	gate := filepath.Join(e.dir, "gate")
	workload := fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.02; done; echo "$MPSD_LEASE_ID"`, gate)
	procs := make([]*proc, launches)
	for i := range procs {
		// --sm 40: two leases fit the group's 100%, the rest wait.
		procs[i] = startProc(t, e.launch("--sm", "40", "--mem", "1G", "--job", jobName(i), "--", "/bin/sh", "-c", workload))
	}
	before := e.waitStatus("two running, the rest queued", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == running && st.Queue["small"] == launches-running &&
			len(shellPIDs(st)) == running
	})
	leaseOf := map[string]string{} // job: lease
	for _, l := range before.Leases {
		leaseOf[l.JobID] = l.ID
	}
	queue := queueOrder(e.d, "small")
	// What the kill leaves: the state file as last written. The queued
	// requests are written without anyone waiting for it; and every
	// launcher has been sent its queued event, which names its lease.
	waitCond(t, "the state file to hold every lease", func() bool { return len(savedLeaseIDs(t, e.d)) == launches }, nil)
	waitCond(t, "every lease's events to be sent", func() bool { return eventsSent(e.d) }, nil)

	e.d.crashStop.Store(true)
	e.stop()
	time.Sleep(time.Second) // mpsd is away for a second, as a restart by systemd after a SIGKILL
	e.start()

	waitCond(t, "every launcher to resume its lease", func() bool { return allBound(e.d, launches) }, func() string {
		return describeLeases(e.d, leaseOf)
	})
	after := e.d.Status()
	if n := countLeases(after, api.LeaseRunning); n != running {
		t.Errorf("after the restart: %d running leases, want the %d re-adopted", n, running)
	}
	for _, l := range after.Leases {
		if leaseOf[l.JobID] != l.ID {
			t.Errorf("after the restart job %s holds lease %s, before it held %q: not resumed", l.JobID, l.ID, leaseOf[l.JobID])
		}
	}
	if got := queueOrder(e.d, "small"); !slices.Equal(got, queue) {
		t.Errorf("queue after the restart\n %v\nbefore\n %v", got, queue)
	}
	e.d.mu.Lock()
	for _, l := range e.d.queues["small"] {
		if l.req.Requeued {
			// It would go ahead of requests queued before it.
			t.Errorf("lease %s, never run, is restored as requeued", l.id)
		}
	}
	e.d.mu.Unlock()

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, p := range procs {
		r := p.wait(t)
		switch {
		case r.code == 125:
			t.Errorf("job %s exit 125 (gave up as if mpsd had refused it): stderr %q", jobName(i), r.stderr)
		case r.code != 0:
			t.Errorf("job %s exit %d, want 0: stderr %q", jobName(i), r.code, r.stderr)
		case withoutWaitLog(r.stderr) != "":
			t.Errorf("job %s said %q, want nothing but its wait's log", jobName(i), r.stderr)
		}
		if got, want := strings.TrimSpace(r.stdout), leaseOf[jobName(i)]; got != want {
			t.Errorf("job %s ran under lease %q, want the one it had before the restart, %q", jobName(i), got, want)
		}
	}
	e.waitStatus("no leases left", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// mpsd killed while it handles a launch's attach, after the grant: the
// launcher reads EOF where the attach's answer should be. It neither
// starts the command nor gives up; once mpsd is back it resumes the lease,
// attaches the command again and runs it, once.
func TestRestartBetweenGrantAndAttach(t *testing.T) {
	e := newEnvGPUs(t, 1, oneGroup, "")
	inAttach := make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	var d atomic.Pointer[Daemon] // the mpsd to kill, set before the launch
	e.opts.attachSwap = func(pid int) int {
		if armed.CompareAndSwap(true, false) {
			close(inAttach)
			// The attach goes on only once mpsd has closed every
			// connection: its answer never reaches the launcher.
			<-d.Load().ctx.Done()
		}
		return pid
	}
	e.start()
	d.Store(e.d)
	marker := filepath.Join(e.dir, "ran")
	p := startProc(t, e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", `echo "$MPSD_LEASE_ID" >> `+marker))
	select {
	case <-inAttach:
	case <-time.After(waitFor):
		t.Fatalf("no attach within %s; launcher stderr %q", waitFor, p.errb.String())
	}
	leases := e.d.Status().Leases
	if len(leases) != 1 {
		t.Fatalf("%d leases, want the one granted", len(leases))
	}
	id := leases[0].ID
	e.d.crashStop.Store(true)
	e.stop()
	time.Sleep(time.Second) // mpsd away for a second
	if b, err := os.ReadFile(marker); !os.IsNotExist(err) {
		t.Fatalf("the command ran (%q, %v) while mpsd was away; its attach was never answered", b, err)
	}
	e.start()
	r := p.wait(t)
	if r.code != 0 || r.stderr != "" {
		t.Errorf("exit %d, stderr %q; want 0 and nothing said", r.code, r.stderr)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != id+"\n" {
		t.Errorf("the command ran as %q (%v), want once under lease %s", b, err, id)
	}
	e.waitStatus("no leases left", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// mpsd killed while launches flow (short commands: grants, attaches and
// releases under way), and started a second later: every launch
// completes with its command's 0. A launcher whose queued request the
// kill lost (not yet written) says so and asks anew; no other line.
func TestRestartWhileLaunchesFlow(t *testing.T) {
	const launches = 24
	e := newEnvGPUs(t, 1, `  small:
    users: [root]
    sm_percent: 100
    memory: 20G
`, "")
	e.start()
	procs := make([]*proc, launches)
	for i := range procs {
		procs[i] = startProc(t, e.launch("--sm", "40", "--mem", "1G", "--job", jobName(i), "--", "/bin/sh", "-c", "sleep 0.2"))
	}
	// Every launcher has reached mpsd (one still starting when the socket
	// is gone would find no mpsd at all), and four are done.
	waitCond(t, "every launch admitted", func() bool { e.d.mu.Lock(); defer e.d.mu.Unlock(); return e.d.seq == launches }, nil)
	e.waitStatus("four launches done", func(st api.Status) bool { return len(st.Leases) <= launches-4 })
	e.d.crashStop.Store(true)
	e.stop()
	time.Sleep(time.Second)
	e.start()
	lost := regexp.MustCompile(`^(mps-launch: job j\d\d: lease \S+ was lost while mpsd was away; requesting a new one\n)?$`)
	for i, p := range procs {
		r := p.wait(t)
		if r.code != 0 || !lost.MatchString(withoutWaitLog(r.stderr)) {
			t.Errorf("job %s exit %d, stderr %q; want 0", jobName(i), r.code, r.stderr)
		}
	}
	e.waitStatus("no leases left", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A lease whose release the previous mpsd finished (its command gone, its
// cgroup deleted) but had not yet written down when it went is released
// by the next mpsd within seconds (reapAdoptedAfter), not held for the
// reconnect grace: its attempt ran, and without its cgroup nothing of it
// can still run.
func TestAdoptedLeaseWithoutCgroup(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.opts.ReconnectGrace = time.Hour
	e.start()
	args, open := e.gate("g")
	p := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, args...)...))
	st := e.waitStatus("a running workload", func(st api.Status) bool { return len(shellPIDs(st)) == 1 })
	id, workload := st.Leases[0].ID, shellPIDs(st)[0]
	e.stop() // the state file says the lease runs, and ran
	_ = p.cmd.Process.Kill()
	p.wait(t)
	open()
	emutestWaitGone(t, workload)
	cg, err := e.d.cg.Open(cgroup.LeaseID{Group: "inference", Lease: id})
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

func jobName(i int) string { return fmt.Sprintf("j%02d", i) }

// waitCond polls cond until it holds, failing the test after waitFor with
// what describe says (if given).
func waitCond(t *testing.T, what string, cond func() bool, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			seen := ""
			if describe != nil {
				seen = "; " + describe()
			}
			t.Fatalf("waiting for %s: not within %s%s", what, waitFor, seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// describeLeases says which leases mpsd knows, whether a launcher holds
// each, and whether each is the one its job held before (leaseOf).
func describeLeases(d *Daemon, leaseOf map[string]string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, l := range d.leases {
		out = append(out, fmt.Sprintf("%s job %s running %v bound %v resumed %v", l.id, l.jobID, l.running(), l.bound, leaseOf[l.jobID] == l.id))
	}
	slices.Sort(out)
	return fmt.Sprintf("%d leases: %s", len(out), strings.Join(out, "; "))
}

// queueOrder is the ids of a group's queued leases, next first.
func queueOrder(d *Daemon, group string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := slices.Clone(d.queues[group])
	slices.SortStableFunc(q, func(a, b *lease) int { return policy.QueueOrder(a.req, b.req) })
	ids := make([]string, len(q))
	for i, l := range q {
		ids[i] = l.id
	}
	return ids
}

// savedLeaseIDs is the leases of the state file on disk.
func savedLeaseIDs(t *testing.T, d *Daemon) []string {
	t.Helper()
	b := stateBytesAt(d.layout.StateFile())
	if b == nil {
		return nil
	}
	var st savedState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil // being replaced; the next read sees it whole
	}
	var ids []string
	for _, l := range st.Leases {
		ids = append(ids, l.ID)
	}
	return ids
}

// eventsSent reports whether every lease's stream has taken its events.
func eventsSent(d *Daemon) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.leases {
		l.box.mu.Lock()
		n := len(l.box.evs)
		l.box.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

// allBound reports whether n leases are known and each is held by a
// launcher's stream.
func allBound(d *Daemon, n int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.leases) != n {
		return false
	}
	for _, l := range d.leases {
		if !l.bound {
			return false
		}
	}
	return true
}
