package launcher

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
	"github.com/mpsd/mpsd/internal/buildinfo"
	"github.com/mpsd/mpsd/internal/units"
)

// harness runs Run in-process against a fake mpsd, with the command's
// stdout and mps-launch's stderr going to files of the test.
type harness struct {
	t       *testing.T
	fake    *apitest.Server
	dir     string
	signals chan os.Signal
	cfg     Config
}

func newHarness(t *testing.T, onLease func(*apitest.LeaseConn)) *harness {
	t.Helper()
	h := &harness{t: t, fake: apitest.New(t, onLease), dir: t.TempDir(), signals: make(chan os.Signal, 4)}
	h.cfg = Config{
		Options: Options{Requeue: -1, Socket: h.fake.Socket},
		Stdout:  h.create("stdout"),
		Stderr:  h.create("stderr"),
		Environ: []string{"PATH=/usr/bin:/bin", "KEEP=kept"},
		Signals: h.signals,
	}
	return h
}

func (h *harness) create(name string) *os.File {
	h.t.Helper()
	f, err := os.Create(filepath.Join(h.dir, name))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = f.Close() })
	return f
}

func (h *harness) path(name string) string { return filepath.Join(h.dir, name) }

func (h *harness) read(name string) string {
	h.t.Helper()
	b, err := os.ReadFile(h.path(name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		h.t.Fatal(err)
	}
	return string(b)
}

// start runs the command under Run in a goroutine; wait collects it.
func (h *harness) start(ctx context.Context, command ...string) <-chan int {
	h.cfg.Command = command
	ch := make(chan int, 1)
	go func() { ch <- Run(ctx, h.cfg) }()
	return ch
}

func (h *harness) wait(ch <-chan int) int {
	h.t.Helper()
	select {
	case code := <-ch:
		return code
	case <-time.After(apitest.Wait):
		h.t.Fatalf("Run did not return within %s", apitest.Wait)
		return -1
	}
}

// sh is a shell command running in the test's directory.
func (h *harness) sh(script string) []string {
	return []string{"/bin/sh", "-c", "cd " + h.dir + " && " + script}
}

func TestRunGrantedLease(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.SM, h.cfg.Mem = 10, units.GiB
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := h.sh(`echo "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT|$CUDA_MPS_PIPE_DIRECTORY|$MPSD_LEASE_ID|$MPSD_GROUP|$MPSD_ATTEMPT|$KEEP|$MPSD_LAUNCH_TRAMPOLINE" > env; exit 3`)
	done := h.start(t.Context(), cmd...)

	lc := h.fake.NextLease(t)
	if lc.Request.SM != 10 || lc.Request.MemBytes != units.GiB || lc.Request.Command[0] != "/bin/sh" {
		t.Errorf("request %+v", lc.Request)
	}
	if lc.PeerPID != os.Getpid() {
		t.Errorf("peer pid %d, want the launcher %d", lc.PeerPID, os.Getpid())
	}
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	if a.LeaseID != "lease-1" || a.PeerPID != os.Getpid() {
		t.Errorf("attach %+v", a)
	}
	// While mpsd attaches, the process must still be the trampoline: the
	// user's program has not started outside the cgroup.
	if a.Exe != self {
		t.Errorf("at attach /proc/%d/exe = %q, want the launcher %q", a.PID, a.Exe, self)
	}
	if code := h.wait(done); code != 3 {
		t.Errorf("exit %d, want the command's 3; stderr: %s", code, h.read("stderr"))
	}
	if got, want := h.read("env"), "10|0=1024M|/run/mpsd/default/GPU-fake-0/pipe|lease-1|default|1|kept|\n"; got != want {
		t.Errorf("command environment\n got %q\nwant %q", got, want)
	}
	lc.WaitReleased(t)
	// stderr is no terminal: the wait is logged, and its end.
	want := regexp.MustCompile(`^mps-launch: queued, position 1\nmps-launch: granted lease lease-1 in group default after waiting \d+s\n$`)
	if s := h.read("stderr"); !want.MatchString(s) {
		t.Errorf("stderr %q, want it to match %q", s, want)
	}
}

// TestRunLongArgv: a command with more than 64 KiB of arguments (a tool
// given thousands of files) runs with all of them, while the request
// names only the start of its argv for mpsd's status, which refuses a
// command over api.MaxCommandBytes (and a request over api.MaxRequestBytes).
func TestRunLongArgv(t *testing.T) {
	h := newHarness(t, nil)
	cmd := h.sh(`echo "$#" > count`)
	cmd = append(cmd, "sh") // $0
	for range 3000 {
		cmd = append(cmd, "/data/shard-000000.bin") // 66 KB in all
	}
	done := h.start(t.Context(), cmd...)
	var lc *apitest.LeaseConn
	select {
	case lc = <-h.fake.Leases():
	case code := <-done:
		t.Fatalf("exit %d before a lease stream; stderr %q", code, h.read("stderr"))
	case <-time.After(apitest.Wait):
		t.Fatalf("no lease request within %s", apitest.Wait)
	}
	want := shownCommand(cmd)
	if !slices.Equal(lc.Request.Command, want) || len(want) >= len(cmd) || !strings.HasPrefix(want[len(want)-1], "…(+") {
		t.Errorf("request names %d arguments, ending %q; want the %d of %q", len(lc.Request.Command), lc.Request.Command[max(0, len(lc.Request.Command)-1):], len(want), want[len(want)-1])
	}
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if code := h.wait(done); code != 0 {
		t.Fatalf("exit %d, want 0; stderr %q", code, h.read("stderr"))
	}
	if got := h.read("count"); got != "3000\n" {
		t.Errorf("the command got %q arguments, want all 3000", got)
	}
}

// TestRunWaitsForTheSignals: Main registers the forwarded signals while
// the request goes out; a command started before they are would not have
// a signal to mps-launch forwarded, so the granted command waits for them.
func TestRunWaitsForTheSignals(t *testing.T) {
	h := newHarness(t, nil)
	registered := make(chan struct{})
	h.cfg.signalsRegistered = registered
	done := h.start(t.Context(), h.sh("echo ran > ran")...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	h.fake.NextAttach(t)
	// The attach is answered; the command must still wait. Nothing is
	// there to wait on but its absence, so the check is that the file is
	// not made while the launcher could have made it many times over.
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		if h.read("ran") != "" {
			t.Fatal("the command ran before the signals were registered")
		}
		select {
		case code := <-done:
			t.Fatalf("Run returned %d before the signals were registered; stderr: %s", code, h.read("stderr"))
		case <-time.After(10 * time.Millisecond):
		}
	}
	close(registered)
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0; stderr: %s", code, h.read("stderr"))
	}
	if got := h.read("ran"); got != "ran\n" {
		t.Errorf("the command wrote %q, want \"ran\\n\"", got)
	}
	lc.WaitReleased(t)
}

func TestRunExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   int
	}{
		{"true", "exit 0", 0},
		{"false", "exit 1", 1},
		{"own code", "exit 42", 42},
		{"SIGKILL", "kill -KILL $$", 137},
		{"SIGTERM", "kill -TERM $$", 143},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, apitest.Grant)
			h.cfg.RevokeGrace = time.Millisecond // SIGKILL: no revocation is coming
			if code := h.wait(h.start(t.Context(), h.sh(tc.script)...)); code != tc.want {
				t.Errorf("exit %d, want %d; stderr: %s", code, tc.want, h.read("stderr"))
			}
		})
	}
}

func TestRunCommandErrors(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	writeFile(t, plain, 0o644)
	for _, tc := range []struct {
		name    string
		command []string
		code    int
		line    string
	}{
		{"not found", []string{"no-such-command-mpsd"}, ExitNotFound, "mps-launch: command not found: no-such-command-mpsd\n"},
		{"not executable", []string{plain}, ExitNotExecutable, "mps-launch: command not executable: " + plain + ": permission denied\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			// Resolved before mpsd is asked: the fake sees no request.
			h.cfg.Socket = filepath.Join(h.dir, "absent.sock")
			if code := h.wait(h.start(t.Context(), tc.command...)); code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if got := h.read("stderr"); got != tc.line {
				t.Errorf("stderr %q, want %q", got, tc.line)
			}
		})
	}
}

func TestRunUnreachable(t *testing.T) {
	h := newHarness(t, nil)
	sock := filepath.Join(h.dir, "mpsd.sock")
	h.cfg.Socket = sock
	if code := h.wait(h.start(t.Context(), "/bin/true")); code != ExitFailure {
		t.Errorf("exit %d, want %d", code, ExitFailure)
	}
	want := "mps-launch: cannot reach mpsd at " + sock + ": no such file or directory (is mpsd running? --socket or $MPSD_SOCKET names another socket)\n"
	if got := h.read("stderr"); got != want {
		t.Errorf("stderr\n got %q\nwant %q", got, want)
	}
}

func TestRunStdinPassthrough(t *testing.T) {
	h := newHarness(t, apitest.Grant)
	in := "line one\nline two\x00binary\xff\n"
	if err := os.WriteFile(h.path("in"), []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	stdin, err := os.Open(h.path("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	h.cfg.Stdin = stdin
	if code := h.wait(h.start(t.Context(), "cat")); code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, h.read("stderr"))
	}
	if got := h.read("stdout"); got != in {
		t.Errorf("stdout %q, want stdin %q", got, in)
	}
}

// readyPipe gives the command a stdout pipe and returns a function that
// waits for the command to print "ready".
func (h *harness) readyPipe() func() {
	r, w, err := os.Pipe()
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	h.cfg.Stdout = w
	lines := bufio.NewReader(r)
	return func() {
		h.t.Helper()
		got := make(chan string, 1)
		go func() {
			line, _ := lines.ReadString('\n')
			got <- line
		}()
		select {
		case line := <-got:
			if line != "ready\n" {
				h.t.Fatalf("command printed %q, want ready", line)
			}
		case <-time.After(apitest.Wait):
			h.t.Fatal("command never got ready")
		}
	}
}

// quietStdin gives the command a stdin pipe that stays open and empty
// until the test ends.
func (h *harness) quietStdin() {
	r, w, err := os.Pipe()
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	h.cfg.Stdin = r
}

func TestRunForwardsSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1} {
		t.Run(sig.String(), func(t *testing.T) {
			h := newHarness(t, apitest.Grant)
			ready := h.readyPipe()
			n := strconv.Itoa(int(sig))
			// The shell runs a trap between commands: short sleeps, not
			// one blocking read, which a signal arriving just before the
			// read(2) would leave blocked forever (the shell's own race).
			done := h.start(t.Context(), h.sh(`trap 'echo got `+n+` > marker; exit 7' `+n+`; echo ready; while :; do sleep 0.05; done`)...)
			ready()
			h.signals <- sig
			if code := h.wait(done); code != 7 {
				t.Errorf("exit %d, want the trap's 7; stderr: %s", code, h.read("stderr"))
			}
			if got := h.read("marker"); got != "got "+n+"\n" {
				t.Errorf("marker %q: the command did not get signal %d", got, sig)
			}
		})
	}
}

func TestRunAbandonWhileQueued(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			h := newHarness(t, nil)
			done := h.start(t.Context(), "/bin/true")
			lc := h.fake.NextLease(t)
			lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 4, Group: "g"})
			h.signals <- syscall.SIGUSR1 // nothing to deliver it to: ignored
			h.signals <- sig
			if code := h.wait(done); code != 128+int(sig) {
				t.Errorf("exit %d, want %d", code, 128+int(sig))
			}
			lc.WaitReleased(t)
			// Nothing but the wait's logged line (not a terminal), if the
			// queued event was read before the signal.
			if s := h.read("stderr"); s != "" && s != "mps-launch: queued, position 4 in group g\n" {
				t.Errorf("stderr %q, want at most the queued line", s)
			}
		})
	}
}

// TestRunAttachedWithGrant: the request names the waiting trampoline
// (attach_pid); a grant that says mpsd attached it is run without an
// attach round trip, one that names another pid is attached as usual,
// and a resume never names one.
func TestRunAttachedWithGrant(t *testing.T) {
	t.Run("attached", func(t *testing.T) {
		h := newHarness(t, nil)
		done := h.start(t.Context(), h.sh(`echo "$MPSD_ATTEMPT" > ran`)...)
		lc := h.fake.NextLease(t)
		pid := lc.Request.AttachPID
		if pid <= 0 {
			t.Fatalf("request %+v names no trampoline to attach", lc.Request)
		}
		if ppid, err := apitest.ParentPID(pid); err != nil || ppid != os.Getpid() {
			t.Fatalf("attach_pid %d: parent %d (%v), want the launcher %d", pid, ppid, err, os.Getpid())
		}
		ev := apitest.Granted(lc.Request, "lease-1", 1)
		ev.Lease.AttachedPID = pid
		lc.MustSend(t, ev)
		if code := h.wait(done); code != 0 {
			t.Fatalf("exit %d; stderr: %s", code, h.read("stderr"))
		}
		if got := h.read("ran"); got != "1\n" {
			t.Errorf("the command wrote %q, want attempt 1", got)
		}
		if n := len(h.fake.Attaches()); n != 0 {
			t.Errorf("%d attach requests after a grant that attached the trampoline, want none", n)
		}
		lc.WaitReleased(t)
	})
	t.Run("another pid", func(t *testing.T) {
		h := newHarness(t, nil)
		done := h.start(t.Context(), h.sh(`true`)...)
		lc := h.fake.NextLease(t)
		ev := apitest.Granted(lc.Request, "lease-1", 1)
		ev.Lease.AttachedPID = lc.Request.AttachPID + 1
		lc.MustSend(t, ev)
		if a := h.fake.NextAttach(t); a.PID != lc.Request.AttachPID {
			t.Errorf("attached pid %d, want the trampoline %d", a.PID, lc.Request.AttachPID)
		}
		if code := h.wait(done); code != 0 {
			t.Fatalf("exit %d; stderr: %s", code, h.read("stderr"))
		}
		lc.WaitReleased(t)
	})
	t.Run("resume", func(t *testing.T) {
		h := newHarness(t, nil)
		h.cfg.ReconnectTimeout = apitest.Wait
		done := h.start(t.Context(), h.sh(`true`)...)
		lc := h.fake.NextLease(t)
		lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, LeaseID: "lease-1"})
		lc.Cut()
		lc2 := h.fake.NextLease(t)
		if lc2.Request.ResumeLeaseID == "" || lc2.Request.AttachPID != 0 {
			t.Errorf("reconnect request %+v: want a resume without attach_pid", lc2.Request)
		}
		lc2.MustSend(t, apitest.Granted(lc2.Request, "lease-1", 1))
		h.fake.NextAttach(t)
		if code := h.wait(done); code != 0 {
			t.Fatalf("exit %d; stderr: %s", code, h.read("stderr"))
		}
	})
}

func TestRunRequeue(t *testing.T) {
	h := newHarness(t, nil)
	ready := h.readyPipe()
	// Attempt 1 runs until killed; attempt 2 succeeds.
	done := h.start(t.Context(), h.sh(`echo $MPSD_ATTEMPT >> attempts; [ "$MPSD_ATTEMPT" = 2 ] && exit 0; echo ready; exec sleep 1000`)...)
	lc := h.fake.NextLease(t)
	if lc.Request.RequeueAttempts != nil {
		t.Errorf("requeue_attempts sent without --requeue: %d", *lc.Request.RequeueAttempts)
	}
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	first := h.fake.NextAttach(t)
	ready()

	// mpsd's order: revoked, then kill the cgroup, then requeue.
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "MPS server on GPU 0 crashed"})
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 2))
	second := h.fake.NextAttach(t)
	if second.PID == first.PID {
		t.Errorf("attempt 2 reused pid %d: not a fresh process", first.PID)
	}
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0 from attempt 2; stderr: %s", code, h.read("stderr"))
	}
	if got := h.read("attempts"); got != "1\n2\n" {
		t.Errorf("attempts %q, want 1 then 2", got)
	}
	// The queued event reaches a launcher whose revoked command is gone,
	// or not yet (it then shows nothing): its wait lines come or not.
	want := regexp.MustCompile(`^mps-launch: lease lease-1 revoked \(MPS server on GPU 0 crashed\); requeued, attempt 2\n` +
		`(mps-launch: queued, position 1\nmps-launch: granted lease lease-1 in group default after waiting \d+s\n)?$`)
	if got := h.read("stderr"); !want.MatchString(got) {
		t.Errorf("stderr\n got %q\nwant %s", got, want)
	}
	lc.WaitReleased(t)
}

// TestRunRevokedPendingGrant: a grant that comes while the revoked
// command is still dying waits for it; when that grant's attempt is
// revoked too, it must not run once the command is gone: the requeue's
// next grant does (the chaos soak's "requeued without a revocation").
func TestRunRevokedPendingGrant(t *testing.T) {
	h := newHarness(t, nil)
	ready := h.readyPipe()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	h.cfg.Stderr = w
	stderr := bufio.NewReader(r)
	nextLine := func(want string) {
		t.Helper()
		got := make(chan string, 1)
		go func() {
			line, _ := stderr.ReadString('\n')
			got <- line
		}()
		select {
		case line := <-got:
			if line != want {
				t.Fatalf("mps-launch printed %q, want %q", line, want)
			}
		case <-time.After(apitest.Wait):
			t.Fatalf("mps-launch did not print %q", want)
		}
	}
	done := h.start(t.Context(), h.sh(`echo $MPSD_ATTEMPT >> attempts; [ "$MPSD_ATTEMPT" != 1 ] && exit 0; echo ready; exec sleep 1000`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	first := h.fake.NextAttach(t)
	ready()

	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "fault a"})
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	nextLine("mps-launch: lease lease-1 revoked (fault a); requeued, attempt 2\n")
	// Attempt 1's command is still there (nobody killed it yet): the
	// grant of attempt 2 waits, and is revoked in turn.
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 2))
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "fault b"})
	// mpsd's kill of attempt 1's command, then, once the launcher has
	// taken the command's exit (reaped it), the requeue.
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, first.PID)
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 3})
	nextLine("mps-launch: lease lease-1 revoked (fault b); requeued, attempt 3\n")
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 3))
	h.fake.NextAttach(t)
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0 from attempt 3", code)
	}
	if got := h.read("attempts"); got != "1\n3\n" {
		t.Errorf("attempts %q, want 1 then 3 (the revoked attempt 2 never runs)", got)
	}
	lc.WaitReleased(t)
}

func TestRunRequeueQuiet(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.Quiet = true
	h.cfg.Requeue = 1
	ready := h.readyPipe()
	done := h.start(t.Context(), h.sh(`[ "$MPSD_ATTEMPT" = 2 ] && exit 5; echo ready; exec sleep 1000`)...)
	lc := h.fake.NextLease(t)
	if lc.Request.RequeueAttempts == nil || *lc.Request.RequeueAttempts != 1 {
		t.Errorf("requeue_attempts %v, want 1", lc.Request.RequeueAttempts)
	}
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	ready()
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "Xid 79"})
	// This time the new grant arrives before the old process is gone.
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 2))
	if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.fake.NextAttach(t)
	if code := h.wait(done); code != 5 {
		t.Errorf("exit %d, want 5 from attempt 2", code)
	}
	if s := h.read("stderr"); s != "" {
		t.Errorf("stderr %q with --quiet", s)
	}
}

func TestRunAttemptsExhausted(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.Requeue = 0
	ready := h.readyPipe()
	done := h.start(t.Context(), h.sh(`echo ready; exec sleep 1000`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	ready()
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "MPS server crashed"})
	lc.MustSend(t, api.Event{Type: api.EventError, Code: api.CodeAttemptsExhausted, Message: "lease lease-1 revoked after 1 attempt (requeue_attempts 0): MPS server crashed"})
	if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(done); code != ExitTempFail {
		t.Errorf("exit %d, want %d", code, ExitTempFail)
	}
	want := "mps-launch: lease lease-1 revoked after 1 attempt (requeue_attempts 0): MPS server crashed\n"
	if got := h.read("stderr"); got != want {
		t.Errorf("stderr\n got %q\nwant %q", got, want)
	}
}

// TestRunSlurmJob: a lease for a batch job carries its GPU list and job
// id; the command sees the lease's GPUs by UUID, not the host's indexes
// it was given; and every line mps-launch prints names the job, down to
// the exhausted requeue a Slurm RequeueExit=75 acts on.
func TestRunSlurmJob(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.Requeue, h.cfg.GPUSelect, h.cfg.JobID = 1, []string{"1"}, "42.0"
	h.cfg.Environ = append(h.cfg.Environ, "CUDA_VISIBLE_DEVICES=1")
	ready := h.readyPipe()
	done := h.start(t.Context(), h.sh(`echo "$MPSD_ATTEMPT $CUDA_VISIBLE_DEVICES" >> attempts; echo ready; exec sleep 1000`)...)
	lc := h.fake.NextLease(t)
	if !slices.Equal(lc.Request.GPUSelect, []string{"1"}) || lc.Request.JobID != "42.0" {
		t.Errorf("request gpu_select %q job_id %q, want [1] and 42.0", lc.Request.GPUSelect, lc.Request.JobID)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", attempt))
		a := h.fake.NextAttach(t)
		ready()
		lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "MPS server on GPU 1 crashed"})
		if attempt == 2 {
			lc.MustSend(t, api.Event{Type: api.EventError, Code: api.CodeAttemptsExhausted,
				Message: "lease revoked: MPS server on GPU 1 crashed; no requeue attempts left (1 used)"})
		}
		if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if attempt == 1 {
			lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
		}
	}
	if code := h.wait(done); code != ExitTempFail {
		t.Errorf("exit %d, want %d", code, ExitTempFail)
	}
	if got, want := h.read("attempts"), "1 GPU-fake-0\n2 GPU-fake-0\n"; got != want {
		t.Errorf("attempts and CUDA_VISIBLE_DEVICES\n got %q\nwant %q", got, want)
	}
	want := "mps-launch: job 42.0: lease lease-1 revoked (MPS server on GPU 1 crashed); requeued, attempt 2\n" +
		"mps-launch: job 42.0: lease revoked: MPS server on GPU 1 crashed; no requeue attempts left (1 used)\n"
	if got := h.read("stderr"); got != want {
		t.Errorf("stderr\n got %q\nwant %q", got, want)
	}
}

// TestRunDaemonErrors: refusals and timeouts mpsd sends as error events.
func TestRunDaemonErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   func(*Options)
		check  func(t *testing.T, r api.LeaseRequest)
		queued bool
		code   api.ErrorCode
		msg    string
		exit   int
	}{
		{"no-wait", func(o *Options) { o.NoWait = true }, func(t *testing.T, r api.LeaseRequest) {
			if !r.NoWait || r.WaitMillis != 0 {
				t.Errorf("request %+v, want no_wait", r)
			}
		}, false, api.CodeWaitTimeout, "group g is full now and --no-wait was given", ExitTempFail},
		{"wait 1s", func(o *Options) { o.Wait = time.Second }, func(t *testing.T, r api.LeaseRequest) {
			if r.WaitMillis != 1000 || r.NoWait {
				t.Errorf("request %+v, want wait_ms 1000", r)
			}
		}, true, api.CodeWaitTimeout, "waited 1s in group g's queue (position 3)", ExitTempFail},
		{"refused", func(o *Options) { o.Group = "b" }, func(t *testing.T, r api.LeaseRequest) {
			if r.Group != "b" {
				t.Errorf("request %+v, want group b", r)
			}
		}, false, api.CodeRefused, `uid 1001 is not a member of group "b"`, ExitFailure},
		{"can never fit", func(o *Options) { o.Mem = 200 * units.GiB }, nil, false, api.CodeRefused, "can never fit: mem 200G is more than any GPU has", ExitFailure},
		{"unknown code", nil, nil, false, "new-code", "something new", ExitFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			if tc.opts != nil {
				tc.opts(&h.cfg.Options)
			}
			done := h.start(t.Context(), "/bin/true")
			lc := h.fake.NextLease(t)
			if tc.check != nil {
				tc.check(t, lc.Request)
			}
			if tc.queued {
				lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 3, Group: "g"})
			}
			lc.MustSend(t, api.Event{Type: api.EventError, Code: tc.code, Message: tc.msg})
			if code := h.wait(done); code != tc.exit {
				t.Errorf("exit %d, want %d", code, tc.exit)
			}
			want := "mps-launch: " + tc.msg + "\n"
			if tc.queued {
				want = "mps-launch: queued, position 3 in group g\n" + want
			}
			if got := h.read("stderr"); got != want {
				t.Errorf("stderr %q, want %q", got, want)
			}
		})
	}
}

func TestRunAttachRefused(t *testing.T) {
	h := newHarness(t, nil)
	done := h.start(t.Context(), h.sh("echo ran > marker")...)
	lc := h.fake.NextLease(t)
	h.fake.RefuseAttach("lease-1", api.Error{Code: api.CodeForbidden, Message: "pid is not a child of the caller"})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if code := h.wait(done); code != ExitFailure {
		t.Errorf("exit %d, want %d", code, ExitFailure)
	}
	if regexp.MustCompile(`^mps-launch: attach pid \d+ to lease lease-1: pid is not a child of the caller\n$`).FindString(h.read("stderr")) == "" {
		t.Errorf("stderr %q", h.read("stderr"))
	}
	if _, err := os.Stat(h.path("marker")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran although its attach was refused (%v)", err)
	}
	lc.WaitReleased(t)
}

// TestRunHeldAttachRefused: the grant's attach finds mpsd gone, so the
// lease is held and its attach tried again while the stream stays open;
// that retry is refused because the lease moved on meanwhile. The refusal
// waits RevokeGrace for a revocation like any refused attach, then ends
// (125, the attach's error): its verdict must be timed although the retry
// runs outside a step.
func TestRunHeldAttachRefused(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := h.start(ctx, h.sh("echo ran > marker")...)
	lc := h.fake.NextLease(t)
	h.fake.DropAttaches(apitest.DropEOF, 1)
	h.fake.RefuseAttach("lease-1", api.Error{Code: api.CodeConflict, Message: "lease lease-1 is at attempt 2, not 1"})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	h.fake.NextDrop(t) // the first attach: mpsd unreachable, the lease held
	select {
	case code := <-done:
		if code != ExitFailure {
			t.Errorf("exit %d, want %d", code, ExitFailure)
		}
	case <-time.After(apitest.Wait):
		// Stop the session the test started before failing it.
		cancel()
		<-done
		t.Fatalf("Run did not end within %s after the held attach's retry was refused; stderr %q", apitest.Wait, h.read("stderr"))
	}
	if regexp.MustCompile(`^mps-launch: attach pid \d+ to lease lease-1: lease lease-1 is at attempt 2, not 1\n$`).FindString(h.read("stderr")) == "" {
		t.Errorf("stderr %q", h.read("stderr"))
	}
	if _, err := os.Stat(h.path("marker")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran although its attach was refused (%v)", err)
	}
}

func TestRunReconnect(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(t *testing.T, lc *apitest.LeaseConn)
		stderr string
	}{
		{"lease re-adopted", func(t *testing.T, lc *apitest.LeaseConn) {
			lc.MustSend(t, apitest.Granted(api.LeaseRequest{SM: 25}, "lease-1", 1))
		}, ""},
		{"lease lost", func(t *testing.T, lc *apitest.LeaseConn) {
			lc.MustSend(t, api.Event{Type: api.EventError, Code: api.CodeNotFound, Message: "no lease lease-1"})
			lc.WaitReleased(t) // the error was taken in before the command ends
		}, "mps-launch: no lease lease-1; the command keeps running without a lease\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			stdinR, stdinW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdinR.Close()
			defer stdinW.Close()
			h.cfg.Stdin = stdinR
			done := h.start(t.Context(), h.sh(`read line; exit 4`)...)
			lc := h.fake.NextLease(t)
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			h.fake.NextAttach(t)
			lc.End() // mpsd restarts

			again := h.fake.NextLease(t)
			if again.Request.ResumeLeaseID != "lease-1" || again.Request.Attempt != 1 {
				t.Errorf("reconnect request %+v, want resume of lease-1 attempt 1", again.Request)
			}
			tc.answer(t, again)
			if _, err := stdinW.WriteString("go\n"); err != nil {
				t.Fatal(err)
			}
			if code := h.wait(done); code != 4 {
				t.Errorf("exit %d, want 4", code)
			}
			if got := h.read("stderr"); got != tc.stderr {
				t.Errorf("stderr %q, want %q", got, tc.stderr)
			}
		})
	}
}

func TestRunReconnectWhileQueued(t *testing.T) {
	h := newHarness(t, nil)
	done := h.start(t.Context(), "/bin/true")
	lc := h.fake.NextLease(t)
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 2})
	lc.End()
	again := h.fake.NextLease(t)
	if again.Request.ResumeLeaseID != "" {
		t.Errorf("resumed %q without ever holding a lease", again.Request.ResumeLeaseID)
	}
	again.MustSend(t, apitest.Granted(again.Request, "lease-2", 1))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
	}
}

func TestRunProtocolViolation(t *testing.T) {
	for _, tc := range []struct {
		name, line, want string
	}{
		{"not JSON", "hello", "mps-launch: protocol violation: api: invalid message: event: invalid character 'h' looking for beginning of value\n"},
		{"unknown event", `{"type":"paused"}`, "mps-launch: protocol violation: api: invalid message: unknown event type \"paused\"\n"},
		{"requeued out of order", `{"type":"requeued","attempt":2}`, "mps-launch: protocol violation: requeued without a revocation\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			done := h.start(t.Context(), "/bin/true")
			lc := h.fake.NextLease(t)
			if err := lc.SendRaw(tc.line); err != nil {
				t.Fatal(err)
			}
			if code := h.wait(done); code != ExitFailure {
				t.Errorf("exit %d, want %d", code, ExitFailure)
			}
			if got := h.read("stderr"); got != tc.want {
				t.Errorf("stderr\n got %q\nwant %q", got, tc.want)
			}
			lc.WaitReleased(t)
		})
	}
}

func TestRunStatusLine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		terminal bool
		quiet    bool
		want     string // regexp of the whole of stderr
	}{
		{"terminal", true, false, `^\rmps-launch: queued, position 2 in group g, waited \d+s\x1b\[K\rmps-launch: queued, position 1 in group g, waited \d+s\x1b\[K` +
			`\r\x1b\[Kmps-launch: waited too long\n$`},
		// A batch log: the wait's first line; a new position alone
		// says nothing more.
		{"not a terminal", false, false, `^mps-launch: queued, position 2 in group g\nmps-launch: waited too long\n$`},
		{"quiet terminal", true, true, `^mps-launch: waited too long\n$`},
		{"quiet, not a terminal", false, true, `^mps-launch: waited too long\n$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.cfg.Terminal, h.cfg.Quiet = tc.terminal, tc.quiet
			done := h.start(t.Context(), "/bin/true")
			lc := h.fake.NextLease(t)
			lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 2, Group: "g"})
			lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, Group: "g"})
			lc.MustSend(t, api.Event{Type: api.EventError, Code: api.CodeWaitTimeout, Message: "waited too long"})
			if code := h.wait(done); code != ExitTempFail {
				t.Errorf("exit %d", code)
			}
			if got := h.read("stderr"); !regexp.MustCompile(tc.want).MatchString(got) {
				t.Errorf("stderr %q, want %s", got, tc.want)
			}
		})
	}
}

func TestRunStatusLineClearedOnGrant(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.Terminal = true
	done := h.start(t.Context(), h.sh("echo out >&2")...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1, Group: "g"})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if code := h.wait(done); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// The command's own output starts on a clean line.
	if got := h.read("stderr"); !strings.HasSuffix(got, "\r\x1b[Kout\n") || !strings.HasPrefix(got, "\rmps-launch: queued, position 1") {
		t.Errorf("stderr %q", got)
	}
}

func TestRunCancel(t *testing.T) {
	h := newHarness(t, nil)
	ready := h.readyPipe()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := h.start(ctx, h.sh("echo ready; exec sleep 1000")...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	ready()
	cancel()
	if code := h.wait(done); code != ExitFailure {
		t.Errorf("exit %d, want %d", code, ExitFailure)
	}
	if got := h.read("stderr"); got != "mps-launch: context canceled\n" {
		t.Errorf("stderr %q", got)
	}
	// Run reaped it: the pid names no process any more.
	if err := syscall.Kill(a.PID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("command pid %d still exists after cancel (%v)", a.PID, err)
	}
	lc.WaitReleased(t)
}

// TestRunRevokeAfterKill: the kill can reach the command before the
// revoked event reaches mps-launch; the SIGKILL grace must still turn it
// into a requeue rather than exit 137.
func TestRunRevokeAfterKill(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = time.Hour // only the event may end the grace here
	ready := h.readyPipe()
	done := h.start(t.Context(), h.sh(`[ "$MPSD_ATTEMPT" = 2 ] && exit 0; echo ready; exec sleep 1000`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	ready()
	if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "fault"})
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 2))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0 from attempt 2; stderr: %s", code, h.read("stderr"))
	}
}

// TestRunRevokeAfterFailure: a CUDA client dies of its lost MPS server
// (exit status 86 here, 806 in CUDA) as fast as mpsd notices the server's
// death; the revoked event that follows within the grace still makes it a
// requeue, not the command's own failure.
func TestRunRevokeAfterFailure(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = time.Hour // only the event may end the grace here
	done := h.start(t.Context(), h.sh(`[ "$MPSD_ATTEMPT" = 2 ] && exit 0; exit 86`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	h.fake.NextAttach(t)
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "server died"})
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 2))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0 from attempt 2; stderr: %s", code, h.read("stderr"))
	}
	if !strings.Contains(h.read("stderr"), "server died") {
		t.Errorf("stderr lacks the revocation's reason: %s", h.read("stderr"))
	}
}

// TestRunFailureThenMpsdStops: the command fails, and before the
// revocation reaches mps-launch mpsd stops (it was revoking the lease as
// it went). The stream's end is no verdict: the resumed lease says the run
// was revoked, and the requeued attempt runs.
func TestRunFailureThenMpsdStops(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = time.Hour // only mpsd's word may end the grace here
	done := h.start(t.Context(), h.sh(`[ "$MPSD_ATTEMPT" = 2 ] && exit 0; exit 86`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	// mps-launch has reaped its failed command once its pid is gone.
	deadline := time.Now().Add(apitest.Wait)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(a.PID)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command was not reaped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	lc.End()
	again := h.fake.NextLease(t)
	if again.Request.ResumeLeaseID != "lease-1" || again.Request.Attempt != 1 {
		t.Fatalf("reconnect request %+v, want resume of lease-1 attempt 1", again.Request)
	}
	again.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "server died"})
	again.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	again.MustSend(t, apitest.Granted(lc.Request, "lease-1", 2))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0 from attempt 2; stderr: %s", code, h.read("stderr"))
	}
}

// TestRunRevokedBeforeAttach: a fault can revoke a lease between its grant
// and the attach, which mpsd then refuses (the lease is not running); the
// revocation that follows requeues the launch instead of failing it.
func TestRunRevokedBeforeAttach(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = time.Hour // only the event may end the grace here
	done := h.start(t.Context(), h.sh(`exit 0`)...)
	lc := h.fake.NextLease(t)
	h.fake.RefuseAttach("lease-1", api.Error{Code: api.CodeConflict, Message: "lease lease-1 is not running"})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	// The refused attach is not recorded; the revocation comes after it.
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "server died"})
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	// Another id, so this grant's attach is not refused whenever the
	// first one happens.
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-2", 2))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0 from attempt 2; stderr: %s", code, h.read("stderr"))
	}
}

// TestRunRevokedAfterTheGrace: a CUDA client dies of its lost server, and
// mpsd's revoked event comes later than RevokeGrace (it waits for the
// revocation's state write, slow on a loaded disk). The release
// mps-launch then asks for is refused because the lease is being revoked,
// so it waits for the event and runs the requeued attempt.
func TestRunRevokedAfterTheGrace(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = 20 * time.Millisecond
	h.fake.Answer("POST", api.ReleasePath("lease-1"), apitest.Answer{Status: 409,
		Body: `{"code":"revoking","message":"lease lease-1 is being revoked"}`})
	done := h.start(t.Context(), h.sh(`[ "$MPSD_ATTEMPT" = 2 ] && exit 0; exit 86`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	h.fake.NextAttach(t)
	h.fake.NextAnswered(t, "POST", api.ReleasePath("lease-1"))
	lc.MustSend(t, api.Event{Type: api.EventRevoked, Reason: "server died"})
	lc.MustSend(t, api.Event{Type: api.EventRequeued, Attempt: 2})
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 2))
	if code := h.wait(done); code != 0 {
		t.Errorf("exit %d, want 0 from attempt 2; stderr: %s", code, h.read("stderr"))
	}
	if !strings.Contains(h.read("stderr"), "lease lease-1 revoked (server died); requeued, attempt 2") {
		t.Errorf("stderr lacks the requeue: %s", h.read("stderr"))
	}
}

// A command that fails on its own exits with its status once the grace is
// over, without a revocation.
func TestRunFailureWithoutRevoke(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = 20 * time.Millisecond
	h.fake.Answer("POST", api.ReleasePath("lease-1"), apitest.Answer{Status: 200, Body: "{}\n"})
	done := h.start(t.Context(), h.sh(`exit 3`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	h.fake.NextAttach(t)
	if code := h.wait(done); code != 3 {
		t.Errorf("exit %d, want the command's 3", code)
	}
	// mpsd was asked once, when the grace was over; the lease it released
	// is not released again.
	var n int
	for _, r := range h.fake.Requests() {
		if r.Path == api.ReleasePath("lease-1") {
			n++
			if r.Body != `{"attempt":1,"exit_status":3}` {
				t.Errorf("release body %q, want the attempt the command ran under and its status", r.Body)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d releases asked for, want 1", n)
	}
}

// TestRunKilledWhileStreamEnds: a command SIGKILLed by someone else while
// mpsd goes away exits 137, whether the stream's end or the re-adopted
// lease (then the grace) tells mps-launch that the kill was not a
// revocation.
func TestRunKilledWhileStreamEnds(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = 50 * time.Millisecond
	ready := h.readyPipe()
	done := h.start(t.Context(), h.sh(`echo ready; exec sleep 1000`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	ready()
	if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lc.End()
	// If the stream's end came first, mps-launch reconnects (the command
	// may still be running as far as it knows) and mpsd re-adopts the lease.
	select {
	case code := <-done:
		if code != 137 {
			t.Errorf("exit %d, want 137", code)
		}
	case again := <-h.fake.Leases():
		if again.Request.ResumeLeaseID != "lease-1" {
			t.Errorf("reconnect request %+v", again.Request)
		}
		// mps-launch may have seen its command's end and closed this
		// stream already: the send may fail, the exit status may not.
		_ = again.Send(apitest.Granted(lc.Request, "lease-1", 1))
		if code := h.wait(done); code != 137 {
			t.Errorf("exit %d, want 137", code)
		}
	case <-time.After(apitest.Wait):
		t.Fatal("mps-launch neither ended nor reconnected")
	}
}

func TestMainUsage(t *testing.T) {
	dir := t.TempDir()
	uid := os.Getuid()
	otherUsersJob := []string{"SLURM_JOB_ID=42", "SLURM_JOB_UID=" + strconv.Itoa(uid+1)}
	unreachable := "mps-launch: cannot reach mpsd at " + dir + "/none.sock: no such file or directory (is mpsd running? --socket or $MPSD_SOCKET names another socket)\n"
	for _, tc := range []struct {
		name   string
		args   []string
		env    []string // added to PATH and MPSD_SOCKET
		code   int
		stdout string
		stderr string
	}{
		{"help", []string{"--help"}, nil, 0, Usage, ""},
		{"version", []string{"--version"}, nil, 0, buildinfo.Read().Line("mps-launch") + "\n", ""},
		{"version before a command", []string{"--version", "--", "/bin/false"}, nil, 0, buildinfo.Read().Line("mps-launch") + "\n", ""},
		{"bad flag", []string{"--sm", "0", "--", "/bin/true"}, nil, ExitFailure, "", "mps-launch: --sm \"0\": want a whole percentage from 1 to 100\n"},
		{"missing command", []string{"--sm", "10"}, nil, ExitFailure, "", "mps-launch: missing command: mps-launch [flags] -- COMMAND [ARG...]\n"},
		{"socket from the environment", []string{"/bin/true"}, nil, ExitFailure, "", unreachable},
		{"another user's Slurm job", []string{"/bin/true"}, otherUsersJob, ExitFailure, "", fmt.Sprintf("mps-launch: SLURM_JOB_UID is %d but mps-launch runs as uid %d: "+
			"the lease would be uid %d's, not the job owner's; run it as uid %d, or give --no-slurm to ignore the Slurm job's environment\n",
			uid+1, uid, uid, uid+1)},
		{"another user's Slurm job, --no-slurm", []string{"--no-slurm", "/bin/true"}, otherUsersJob, ExitFailure, "", unreachable},
		{"a bad Slurm variable", []string{"/bin/true"}, []string{"SLURM_JOB_ID=42", "SLURM_STEP_GPUS=?"}, ExitFailure, "",
			"mps-launch: SLURM_STEP_GPUS \"?\": entry 1 \"?\": want \"all\", an index, a GPU UUID or a UUID prefix " +
				"(it is the default of --gpu in a Slurm job; give --gpu, or --no-slurm)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			errf, err := os.Create(filepath.Join(t.TempDir(), "err"))
			if err != nil {
				t.Fatal(err)
			}
			defer errf.Close()
			env := append([]string{"PATH=/usr/bin:/bin", "MPSD_SOCKET=" + dir + "/none.sock"}, tc.env...)
			if code := Main(t.Context(), tc.args, nil, out, errf, env); code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			o, _ := os.ReadFile(out.Name())
			e, _ := os.ReadFile(errf.Name())
			if string(o) != tc.stdout || string(e) != tc.stderr {
				t.Errorf("stdout %q stderr %q, want %q and %q", o, e, tc.stdout, tc.stderr)
			}
		})
	}
}

// childrenOf lists the pids whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			kids = append(kids, n)
		}
	}
	return kids
}

// TestRunSpareTrampoline: the trampoline started ahead of the grant
// waits as long as the request is queued. A signal to the process group
// (which mps-launch ignores without a command) must not cost the launch,
// and if the trampoline dies anyway the program still runs, once, in a
// new one.
func TestRunSpareTrampoline(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			h := newHarness(t, nil)
			done := h.start(t.Context(), h.sh("echo ran >> runs")...)
			lc := h.fake.NextLease(t)
			lc.MustSend(t, api.Event{Type: api.EventQueued, Position: 1})
			spares := childrenOf(t, os.Getpid())
			if len(spares) != 1 {
				t.Fatalf("children of the launcher while queued: %v, want the one waiting trampoline", spares)
			}
			// A signal that came before the trampoline set itself up would
			// prove nothing (the launch survives its death too).
			waitIgnoring(t, spares[0], syscall.SIGUSR1)
			if err := syscall.Kill(spares[0], sig); err != nil {
				t.Fatal(err)
			}
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			a := h.fake.NextAttach(t)
			if sig != syscall.SIGKILL && a.PID != spares[0] {
				t.Errorf("attached pid %d, want the waiting trampoline %d: %v killed it", a.PID, spares[0], sig)
			}
			if a.PID == spares[0] && sig == syscall.SIGKILL {
				// mps-launch took the dying spare before it saw it die:
				// the release fails and a new trampoline is attached.
				a = h.fake.NextAttach(t)
				if a.PID == spares[0] {
					t.Errorf("the killed trampoline %d was attached twice", a.PID)
				}
			}
			if code := h.wait(done); code != 0 {
				t.Errorf("exit %d, want 0; stderr %s", code, h.read("stderr"))
			}
			if got := h.read("runs"); got != "ran\n" {
				t.Errorf("the program ran %q, want once", got)
			}
		})
	}
}

// TestRunProgramFDs: the program gets its standard files and whatever the
// caller passed down, never a descriptor of mps-launch's own (the release
// and exec pipes, the socket to mpsd).
func TestRunProgramFDs(t *testing.T) {
	h := newHarness(t, nil)
	ready := h.readyPipe()
	h.quietStdin()
	done := h.start(t.Context(), h.sh("echo ready; read line")...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	a := h.fake.NextAttach(t)
	ready()
	got, want := apitest.ProgramFDs(t, a.PID)
	if !slices.Equal(got, want) {
		t.Errorf("the program has descriptors %v, want %v", got, want)
	}
	h.signals <- syscall.SIGTERM
	if code := h.wait(done); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGTERM))
	}
}

// An mpsd older than this launcher (upgraded but not yet restarted)
// refuses the fields it does not know, attach_pid, will_attach or an
// attach's attempt: the launcher asks again without them and the command
// runs under its lease as before.
func TestRunOlderMpsd(t *testing.T) {
	for _, field := range []string{"attach_pid", "will_attach", "attempt"} {
		t.Run(field, func(t *testing.T) {
			h := newHarness(t, nil)
			h.fake.RefuseField(field)
			done := h.start(t.Context(), h.sh(`true`)...)
			lc := h.fake.NextLease(t)
			if field != "attempt" && (lc.Request.AttachPID != 0 || lc.Request.WillAttach) {
				t.Errorf("the request the older mpsd took: %+v", lc.Request)
			}
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			if a := h.fake.NextAttach(t); a.LeaseID != "lease-1" {
				t.Errorf("attach %+v", a)
			}
			if code := h.wait(done); code != 0 {
				t.Fatalf("exit %d; stderr: %s", code, h.read("stderr"))
			}
			if s := h.read("stderr"); s != "" {
				t.Errorf("stderr %q, want nothing", s)
			}
			lc.WaitReleased(t)
		})
	}
}

// A cancel's signal can end the command, even with status 0, before
// mps-launch reads the revoked event: mpsd then answers the release with
// the cancel, and mps-launch exits 122 with its line, not the command's
// 0 (or its failure's status once the grace is over).
func TestRunCancelledCommandEndsAsCancelled(t *testing.T) {
	for _, tc := range []struct {
		name, script string
	}{{"status 0", "exit 0"}, {"a failure", "exit 143"}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.cfg.RevokeGrace = 20 * time.Millisecond
			h.fake.Answer("POST", api.ReleasePath("lease-1"), apitest.Answer{Status: 409,
				Body: `{"code":"cancelled","message":"lease lease-1 cancelled by root (uid 0); its command was stopped"}`})
			done := h.start(t.Context(), h.sh(tc.script)...)
			lc := h.fake.NextLease(t)
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			h.fake.NextAttach(t)
			if code := h.wait(done); code != ExitCancelled {
				t.Errorf("exit %d, want %d; stderr: %s", code, ExitCancelled, h.read("stderr"))
			}
			if !strings.Contains(h.read("stderr"), "lease lease-1 cancelled by root (uid 0)") {
				t.Errorf("stderr does not name who cancelled it: %q", h.read("stderr"))
			}
		})
	}
}
