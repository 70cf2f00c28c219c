package mpsd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
)

// newOwnerEnv is an mpsd (not started) whose one group, a, has uid as
// its only user.
func newOwnerEnv(t *testing.T, uid uint32) *testEnv {
	t.Helper()
	return newEnv(t, `  a:
    users: ["`+strconv.Itoa(int(uid))+`"]
    memory: 10G
`, "")
}

// attachLease starts a gated workload as uid and returns its running
// lease, the lease cgroup's v2 path and the gate's opener.
func (e *testEnv) attachLease(uid uint32) (*proc, api.LeaseStatus, string, func()) {
	e.t.Helper()
	gateArgs, open := e.gate("attach")
	p := startProc(e.t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateArgs...)...), uid))
	st := e.waitStatus("a running workload", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	l := st.Leases[0]
	cg := e.leaseCgroup("a", l.ID)
	// The path the assertions compare with must be the real one, or
	// "not in the lease cgroup" holds for nothing.
	if got := cgroupOf(e.t, l.PIDs[0]); got != cg {
		e.t.Fatalf("workload pid %d is in %s, want the lease cgroup %s", l.PIDs[0], got, cg)
	}
	return p, l, cg, open
}

// An attach naming a child that has exited is refused, whether it is
// still a zombie (its /proc entry still names the caller as parent) or
// already reaped; nothing lands in the lease.
func TestAttachExitedPidRefused(t *testing.T) {
	const owner = 64161
	e := newOwnerEnv(t, owner)
	e.start()
	helper := e.isoBuildAPICall()
	p, l, leaseCgroup, open := e.attachLease(owner)
	attach := api.AttachPath(l.ID)
	for _, tc := range []struct {
		state string
		ecode api.ErrorCode
	}{{"zombie", api.CodeConflict}, {"reaped", api.CodeForbidden}} {
		args := []string{"-socket", e.socket, "-path", attach, "-body", `{"pid":{child}}`, "-child", "-child-state", tc.state}
		r := run(t, asUID(apiCallCmd(helper, args...), owner))
		code, msg, _ := strings.Cut(r.stdout, "\n")
		if r.code != 0 || code != string(tc.ecode) {
			t.Errorf("attach of a %s child: exit %d, %q (%s); want %q", tc.state, r.code, code, msg, tc.ecode)
			continue
		}
		if strings.Contains(r.stderr, "cgroup "+leaseCgroup+"\n") {
			t.Errorf("the %s child ended up in the lease cgroup %s", tc.state, leaseCgroup)
		}
	}
	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// waitExited waits until pid has exited (its pidfd polls readable).
func waitExited(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, int(waitFor/time.Millisecond)); err != nil || n != 1 {
		t.Fatalf("pid %d did not exit: %v", pid, err)
	}
}

// The pid an attach names can be reused between mpsd's checks and its
// move into the cgroup. Here the checked child is killed at that moment
// and the move names a root process instead (what a reused pid would make
// it name): the attach is refused, the root process is put back where it
// was, and releasing the lease does not kill it.
func TestAttachPidReusedBetweenCheckAndMove(t *testing.T) {
	const owner = 64162
	e := newOwnerEnv(t, owner)
	bystander := exec.Command("/bin/sleep", "600")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bystander.Process.Kill(); _ = bystander.Wait() })
	home := cgroupOf(t, bystander.Process.Pid)
	var armed, swapped atomic.Bool
	e.opts.attachSwap = func(pid int) int {
		// Only the test's own attach: mps-launch attaches its workload too.
		if !armed.Load() {
			return pid
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitExited(t, pid)
		swapped.Store(true)
		return bystander.Process.Pid
	}
	e.start()
	helper := e.isoBuildAPICall()
	p, l, leaseCgroup, open := e.attachLease(owner)

	armed.Store(true)
	code, body, _ := e.isoAPICall(helper, owner, api.AttachPath(l.ID), `{"pid":{child}}`, true)
	armed.Store(false)
	if !swapped.Load() {
		t.Fatal("the attach never reached the move")
	}
	if code != api.CodeConflict || !strings.Contains(string(body), "exited") {
		t.Errorf("attach whose pid was reused: %q %q, want conflict saying the pid exited", code, body)
	}
	e.isoWaitLog("its pid was reused")
	if got := cgroupOf(t, bystander.Process.Pid); got != home {
		t.Errorf("root process is in %s after the refused attach, want it back in %s (lease cgroup %s)", got, home, leaseCgroup)
	}
	if slices.Contains(e.d.Status().Leases[0].PIDs, bystander.Process.Pid) {
		t.Errorf("lease %s lists the root process %d", l.ID, bystander.Process.Pid)
	}
	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
	if err := syscall.Kill(bystander.Process.Pid, 0); err != nil {
		t.Errorf("root process %d after the lease's release: %v", bystander.Process.Pid, err)
	}
	if b, _ := os.ReadFile("/proc/" + strconv.Itoa(bystander.Process.Pid) + "/stat"); bytes.Contains(b, []byte(") Z")) {
		t.Errorf("root process %d was killed with the lease", bystander.Process.Pid)
	}
}

// The same reuse while the lease ends: the attacker releases its lease
// (on another connection, say) while the root process stands in its
// cgroup. The release's kill waits for the attach's check, which moves
// the root process back first: the kill never reaches it. The release is
// started right after the move, and the attach goes on only once the
// release is about to take the lease's cgroup lock.
func TestAttachPidReusedWhileTheLeaseEnds(t *testing.T) {
	const owner = 64163
	e := newOwnerEnv(t, owner)
	bystander := exec.Command("/bin/sleep", "600")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	bpid := bystander.Process.Pid
	t.Cleanup(func() { _ = bystander.Process.Kill(); _ = bystander.Wait() })
	var armed atomic.Bool
	locking := make(chan struct{}, 1)
	released := make(chan struct{})
	e.opts.attachSwap = func(pid int) int {
		if !armed.Load() {
			return pid
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitExited(t, pid)
		return bpid
	}
	e.opts.attachMoved = func(l *lease) {
		if !armed.Load() {
			return
		}
		go func() {
			defer close(released)
			e.d.release(l, "its command ended")
		}()
		select {
		case <-locking:
		case <-time.After(waitFor):
			t.Errorf("the release did not reach the kill within %s", waitFor)
		}
	}
	e.opts.killLocking = func(*lease) {
		if armed.Load() {
			select {
			case locking <- struct{}{}:
			default:
			}
		}
	}
	e.start()
	helper := e.isoBuildAPICall()
	p, l, _, open := e.attachLease(owner)
	defer open()

	armed.Store(true)
	code, body, _ := e.isoAPICall(helper, owner, api.AttachPath(l.ID), `{"pid":{child}}`, true)
	if code != api.CodeConflict {
		t.Errorf("attach whose pid was reused: %q %q, want conflict", code, body)
	}
	select {
	case <-released:
	case <-time.After(waitFor):
		t.Fatalf("the release did not return within %s", waitFor)
	}
	armed.Store(false)
	// The release has returned: its kill is over, and whatever was in the
	// lease's cgroup then has died.
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(bpid) + "/stat")
	if err := syscall.Kill(bpid, 0); err != nil || bytes.Contains(b, []byte(") Z")) {
		t.Errorf("root process %d was killed with uid %d's lease: stat %q", bpid, owner, b)
	}
	open()
	_ = p.wait(t)
}

// A granted lease whose client will attach (mps-launch says so) has its
// cgroup made at the grant, before any attach, so the attach on the
// launch's critical path only moves the process; it goes with the lease.
// A lease whose client did not say so (a device plugin's) gets none until
// an attach. A creation that comes late, after the lease's end has begun
// (its kill has run), makes nothing: the cgroup would outlive the lease.
func TestLeaseCgroupMadeAtGrant(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	m, ok := e.d.cg.(*cgroup.Cgroups)
	if !ok {
		t.Fatalf("mpsd runs without real cgroups (%T)", e.d.cg)
	}
	c := leaseClient(e.socket)
	plain, _, err := grantQueued(c, benchLease)
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	st := e.waitStatus("the lease running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	plainID := st.Leases[0].ID
	stream, _, err := grantQueued(c, `{"sm":1,"mem_bytes":67108864,"will_attach":true}`)
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	st = e.waitStatus("both leases running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 2 })
	var id string
	for _, l := range st.Leases {
		if l.ID != plainID {
			id = l.ID
		}
	}
	dir := filepath.Join(m.MembershipMount(), e.leaseCgroup("inference", id))
	waitPath(t, dir, true)
	// Made after the plain lease's grant: had that lease's grant made
	// one, it would be there too.
	plainDir := filepath.Join(m.MembershipMount(), e.leaseCgroup("inference", plainID))
	if _, err := os.Lstat(plainDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a lease whose client did not say it will attach has a cgroup at its grant (lstat %s: %v)", plainDir, err)
	}
	_ = plain.Close()
	e.d.mu.Lock()
	l := e.d.leases[id]
	e.d.mu.Unlock()
	_ = stream.Close()
	e.waitStatus("the leases released", func(st api.Status) bool { return len(st.Leases) == 0 })
	waitPath(t, dir, false)
	e.d.prepareCgroup(l)
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a creation after the lease's end made %s (lstat: %v)", dir, err)
	}
}

// waitPath waits until path exists (or, with exists false, is gone).
func waitPath(t *testing.T, path string, exists bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		_, err := os.Lstat(path)
		if (err == nil) == exists {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: exists %v after %s, want %v (lstat: %v)", path, err == nil, waitFor, exists, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An attach names the attempt its child was started for: once the lease
// was revoked and granted again (an admin requeue here; a server's crash
// in the soak, where the new grant was on another GPU), a child of the old
// attempt is refused, and nothing joins the lease's cgroup; one of the
// current attempt is taken.
func TestAttachOfARevokedAttemptRefused(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	c := leaseClient(e.socket)
	h, lease, _, err := grantLease(c, `{"sm":1,"mem_bytes":67108864,"will_attach":true}`)
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	defer func() { _ = h.Close() }()
	e.admin(t, "requeue", lease.ID)
	e.waitStatus("the lease granted again, attempt 2", func(st api.Status) bool {
		return len(st.Leases) == 1 && st.Leases[0].State == api.LeaseRunning && st.Leases[0].Attempt == 2
	})
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Wait() }()
	defer func() { _ = child.Process.Kill() }()
	post := func(attempt int) (int, api.Error) {
		body, _ := json.Marshal(api.AttachRequest{PID: child.Process.Pid, Attempt: attempt})
		resp, err := c.Post("http://mpsd"+api.AttachPath(lease.ID), api.ContentTypeJSON, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var e api.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	if code, ae := post(1); code != http.StatusConflict || ae.Code != api.CodeConflict || !strings.Contains(ae.Message, "attempt 2, not 1") {
		t.Fatalf("attach for attempt 1 of a lease at attempt 2: %d %+v; want 409 naming both attempts", code, ae)
	}
	st := e.waitStatus("the lease", func(api.Status) bool { return true })
	if len(st.Leases) != 1 || len(st.Leases[0].PIDs) != 0 {
		t.Fatalf("after the refused attach the lease holds %v, want nothing", st.Leases)
	}
	if code, ae := post(2); code != http.StatusOK {
		t.Fatalf("attach for the lease's attempt 2: %d %+v; want 200", code, ae)
	}
	e.waitStatus("the child in the lease", func(st api.Status) bool {
		return len(st.Leases) == 1 && slices.Contains(st.Leases[0].PIDs, child.Process.Pid)
	})
}

// A lease request's attach_pid is attached with the grant, checked as an
// attach is: the caller's own child lands in the lease's cgroup and the
// grant names it; a process that is not the caller's child (the test's
// own, root's) is left where it was and the grant names no pid, so the
// client's own attach meets the refusal.
func TestAttachWithGrant(t *testing.T) {
	const owner = 64165
	e := newOwnerEnv(t, owner)
	e.start()
	helper := e.isoBuildAPICall()
	lease := func(t *testing.T, body string, child bool) (api.Event, string, string) {
		t.Helper()
		args := []string{"-socket", e.socket, "-path", api.PathLeases, "-body", body}
		if child {
			args = append(args, "-child")
		}
		r := run(t, asUID(apiCallCmd(helper, args...), owner))
		code, msg, _ := strings.Cut(r.stdout, "\n")
		if r.code != 0 || code != "ok" {
			t.Fatalf("lease request %s: exit %d, %q (%s); stderr %s", body, r.code, code, msg, r.stderr)
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(msg), &ev); err != nil || ev.Type != api.EventGranted || ev.Lease == nil {
			t.Fatalf("lease request %s: first event %q (%v), want a grant", body, msg, err)
		}
		var childPID, cg string
		for line := range strings.SplitSeq(r.stderr, "\n") {
			if v, ok := strings.CutPrefix(line, "child "); ok {
				childPID = v
			}
			if v, ok := strings.CutPrefix(line, "cgroup "); ok {
				cg = v
			}
		}
		return ev, childPID, cg
	}
	t.Run("own child", func(t *testing.T) {
		ev, pid, cg := lease(t, `{"sm":10,"mem_bytes":1073741824,"will_attach":true,"attach_pid":{child}}`, true)
		if strconv.Itoa(ev.Lease.AttachedPID) != pid {
			t.Errorf("grant names attached pid %d, want the child %s", ev.Lease.AttachedPID, pid)
		}
		if want := e.leaseCgroup("a", ev.Lease.ID); cg != want {
			t.Errorf("the child is in %s after the grant, want the lease cgroup %s", cg, want)
		}
	})
	t.Run("not a child", func(t *testing.T) {
		self := os.Getpid()
		before := cgroupOf(t, self)
		ev, _, _ := lease(t, fmt.Sprintf(`{"sm":10,"mem_bytes":1073741824,"attach_pid":%d}`, self), false)
		if ev.Lease.AttachedPID != 0 {
			t.Errorf("grant names attached pid %d for a process that is not the caller's child", ev.Lease.AttachedPID)
		}
		if after := cgroupOf(t, self); after != before {
			t.Errorf("the test process moved from %s to %s", before, after)
		}
	})
	e.waitStatus("the leases released", func(st api.Status) bool { return len(st.Leases) == 0 })
}
