package mpsd

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Attacker tests of membership changes (docs/security.md, rule 22): an
// admin removes bob from group a with a reload. Uids 64540-64549 are this
// file's.
const (
	memberUIDAlice = 64540 // stays a member of group a
	memberUIDBob   = 64541 // removed from group a by the reload
)

func membershipGroups(users ...string) string {
	return fmt.Sprintf(`  a:
    users: [%s]
    memory: 10G
    gpus: ["0"]
`, strings.Join(users, ", "))
}

// cwdProbe is a process of a tenant whose working directory is a pipe
// directory (testdata/cwdprobe).
type cwdProbe struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
}

func startCWDProbe(t *testing.T, prog, dir string, uid uint32) *cwdProbe {
	t.Helper()
	cmd := asUID(exec.Command(prog, "-dir", dir), uid)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p := &cwdProbe{t: t, in: in, out: bufio.NewScanner(out)}
	if line := p.line(); line != "ready" {
		t.Fatalf("cwdprobe in %s as uid %d: %q", dir, uid, line)
	}
	return p
}

func (p *cwdProbe) line() string {
	p.t.Helper()
	got := make(chan string, 1)
	go func() {
		if p.out.Scan() {
			got <- p.out.Text()
		} else {
			got <- "EOF"
		}
	}()
	select {
	case s := <-got:
		return s
	case <-time.After(waitFor):
		p.t.Fatal("cwdprobe said nothing")
		return ""
	}
}

// try connects to the control socket and opens the log FIFO; it returns
// what each gave ("ok" or the errno's text).
func (p *cwdProbe) try() (control, log string) {
	p.t.Helper()
	if _, err := io.WriteString(p.in, "try\n"); err != nil {
		p.t.Fatal(err)
	}
	control, log = strings.TrimPrefix(p.line(), "control "), strings.TrimPrefix(p.line(), "log ")
	if done := p.line(); done != "done" {
		p.t.Fatalf("cwdprobe: %q", done)
	}
	return control, log
}

// Bob, a member of group a, queues a request behind Alice's lease and
// leaves a process with its working directory in the instance's pipe
// directory. The admin removes him from the group (a reload). His queued
// request fails at once with a reason his mps-launch prints (before,
// it was granted when Alice's lease ended), and his process no longer
// reaches the control socket or the log FIFO (before, only
// <run_dir>/a carried the ACL: the pipe directory below it was 0755).
// Alice, still a member, runs MPS clients as before.
func TestRemovedMemberLosesQueueAndPipeDir(t *testing.T) {
	alice, bob := emutest.User(t, memberUIDAlice), emutest.User(t, memberUIDBob)
	e := newEnv(t, membershipGroups(alice, bob), "")
	e.start()
	probe := e.buildTestProgram("cwdprobe")
	client := filepath.Join(e.emu, "mpsemu-client")

	gateArgs, open := e.gate("alice")
	aliceLease := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "10G", "--"}, gateArgs...)...), memberUIDAlice))
	st := e.waitStatus("alice running", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Instances) == 1
	})
	pipe := filepath.Join(e.dir, "run", "a", st.Instances[0].GPUUUID, "pipe")
	bobQueued := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), memberUIDBob))
	e.waitStatus("bob queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })

	p := startCWDProbe(t, probe, pipe, memberUIDBob)
	if control, log := p.try(); control != "ok" || log != "ok" {
		t.Fatalf("as a member, bob's process in %s: control %q, log %q; want both ok", pipe, control, log)
	}

	e.writeConfig(membershipGroups(alice), "")
	r := bobQueued.wait(t)
	if r.code == 0 || !strings.Contains(r.stderr, fmt.Sprintf("uid %d is no longer a member of group a", memberUIDBob)) {
		t.Errorf("bob's queued mps-launch after his removal: exit %d, stderr %q; want it failed naming the reason", r.code, r.stderr)
	}
	if h := e.history(0); len(h.Records) != 1 || h.Records[0].UID != memberUIDBob || h.Records[0].Ended != api.EndedRefused {
		t.Errorf("history after bob's removal: %+v; want his queued request, refused", h.Records)
	}
	e.waitLogAny("queued request failed: its uid is no longer a member of its group")

	// The reload has rewritten the ACLs before it logs "config reloaded".
	e.waitLogAny("config reloaded")
	control, log := p.try()
	if control != unix.EACCES.Error() || log != unix.EACCES.Error() {
		t.Errorf("after his removal, bob's process in %s: control %q, log %q; want both %q", pipe, control, log, unix.EACCES.Error())
	}
	for _, dir := range []string{pipe, filepath.Dir(pipe), filepath.Join(e.dir, "log", "a", st.Instances[0].GPUUUID)} {
		if err := unix.Faccessat(unix.AT_FDCWD, dir, unix.X_OK, unix.AT_EACCESS); err != nil {
			t.Fatalf("access %s as root: %v", dir, err)
		}
		checkSearchAs(t, dir, memberUIDBob, false)
		checkSearchAs(t, dir, memberUIDAlice, true)
	}

	// Alice, still a member, reaches MPS through the guarded directories.
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--no-wait", "--", "/bin/true"), memberUIDBob)); r.code == 0 {
		t.Errorf("bob's new request after his removal succeeded")
	}
	open()
	if r := aliceLease.wait(t); r.code != 0 {
		t.Fatalf("alice's lease: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "200ms"), memberUIDAlice)); r.code != 0 {
		t.Fatalf("alice's MPS client after the reload: exit %d, stderr %q", r.code, r.stderr)
	}
}

// checkSearchAs checks whether uid may search dir (a subprocess with its
// credentials tries cd).
func checkSearchAs(t *testing.T, dir string, uid uint32, want bool) {
	t.Helper()
	err := asUID(exec.Command("/bin/sh", "-c", `cd "$1"`, "sh", dir), uid).Run()
	if got := err == nil; got != want {
		t.Errorf("uid %d may search %s: %v, want %v (err %v)", uid, dir, got, want, err)
	}
}

// Bob runs a lease in group a when the admin removes him: it is kept
// until it ends, and mpsd logs so. mpsd then restarts; Bob's launcher
// comes back to resume it and is refused, with the reason it prints,
// while Alice's launcher resumes hers.
func TestRemovedMemberResumeRefused(t *testing.T) {
	alice, bob := emutest.User(t, memberUIDAlice), emutest.User(t, memberUIDBob)
	// multiuser: the two uids' clients share one MPS server, so both
	// leases run at once.
	groups := func(users ...string) string { return membershipGroups(users...) + "    multiuser: true\n" }
	e := newEnv(t, groups(alice, bob), "")
	e.start()
	gateArgs, open := e.gate("both")
	defer open()
	aliceLease := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "5G", "--"}, gateArgs...)...), memberUIDAlice))
	bobLease := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "5G", "--"}, gateArgs...)...), memberUIDBob))
	e.waitStatus("alice and bob running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 2 })

	e.writeConfig(groups(alice), "")
	e.waitLogAny("running lease kept until it ends: its uid is no longer a member of its group")
	if st := e.d.Status(); countLeases(st, api.LeaseRunning) != 2 {
		t.Fatalf("after bob's removal %d leases run, want both kept", countLeases(st, api.LeaseRunning))
	}
	waitCond(t, "the state file to hold both leases", func() bool { return len(savedLeaseIDs(t, e.d)) == 2 }, nil)
	waitCond(t, "every lease's events to be sent", func() bool { return eventsSent(e.d) }, nil)

	e.stop()
	e.start()
	e.waitLogAny("resume refused: its uid is no longer a member of its group")
	// mps-launch, refused, waits for the command it started.
	open()
	r := bobLease.wait(t)
	want := fmt.Sprintf("is not resumed: uid %d is no longer a member of group a", memberUIDBob)
	if !strings.Contains(r.stderr, want) {
		t.Errorf("bob's launcher after the restart: exit %d, stderr %q; want it refused with %q", r.code, r.stderr, want)
	}
	if r := aliceLease.wait(t); r.code != 0 {
		t.Errorf("alice's lease across the restart: exit %d, stderr %q", r.code, r.stderr)
	}
}

// Bob queues a request behind Alice's lease; mpsd stops, and while it is
// down the admin removes Bob from group a and Bob's launcher is gone (it
// will not resume). The restarted mpsd keeps Bob's saved request off the
// queue, logging so: when Alice's lease ends, nothing is granted to Bob
// (before, his saved request was queued as it was and granted then, to a
// uid the config no longer admits).
func TestRemovedWhileDownQueuedNotGranted(t *testing.T) {
	alice, bob := emutest.User(t, memberUIDAlice), emutest.User(t, memberUIDBob)
	e := newEnv(t, membershipGroups(alice, bob), "")
	e.start()
	gateArgs, open := e.gate("alice")
	defer open()
	aliceLease := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "10G", "--"}, gateArgs...)...), memberUIDAlice))
	e.waitStatus("alice running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	bobQueued := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), memberUIDBob))
	e.waitStatus("bob queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })
	waitCond(t, "the state file to hold both leases", func() bool { return len(savedLeaseIDs(t, e.d)) == 2 }, nil)
	waitCond(t, "every lease's events to be sent", func() bool { return eventsSent(e.d) }, nil)

	e.stop()
	_ = bobQueued.cmd.Process.Kill()
	_ = bobQueued.wait(t)
	e.writeConfig(membershipGroups(alice), "")
	e.start()
	e.waitLogAny("saved queued request not queued: its uid is no longer a member of its group")

	open()
	if r := aliceLease.wait(t); r.code != 0 {
		t.Fatalf("alice's lease across the restart: exit %d, stderr %q", r.code, r.stderr)
	}
	st := e.waitStatus("alice's lease released", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.UID == memberUIDAlice {
				return false
			}
		}
		return true
	})
	for _, l := range st.Leases {
		if l.UID == memberUIDBob && l.State != api.LeaseQueued {
			t.Errorf("bob's saved request after his removal while mpsd was down: %s, want never granted", l.State)
		}
	}
}
