package mpsd

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// Real uids of the wait log test; the config names them by number.
const (
	waitLogUIDHolder = 64920 // fills the GPU
	waitLogUIDWaiter = 64921 // waits, its stderr a batch job's log
)

// A queued mps-launch whose stderr is a file (a batch job's log) logs its
// wait: a line when it begins, one when mpsd's reason changes (here a
// state directory that cannot be written, room again, an operator's drain
// with its reason, room again after the resume) and one at the grant,
// with the time waited. With --quiet it logs nothing.
func TestE2EQueuedLaunchLogsItsWait(t *testing.T) {
	e := newEnv(t, `  a:
    users: ["64920", "64921"]
    gpus: ["0"]
    memory: 10G
`, "")
	state := durTmpfsState(t, e)
	e.start()

	gate, open := e.gate("holder")
	holder := startProc(t, asUID(e.launch(append([]string{"--sm", "100", "--mem", "1G", "--"}, gate...)...), waitLogUIDHolder))
	e.waitStatus("the holder running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })

	logFile := func(name string) (*os.File, func() string) {
		path := filepath.Join(e.dir, name)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		return f, func() string {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
	logged, readLogged := logFile("waiter.log")
	cmd := asUID(e.launch("--sm", "50", "--mem", "1G", "--job", "17", "--", "/bin/true"), waitLogUIDWaiter)
	cmd.Stderr = logged
	waiter := startProc(t, cmd)
	durWaitText(t, "the waiter's log", readLogged, "mps-launch: job 17: queued, position 1 in group a (waiting for room)\n")

	// The quiet launch's request is the write that finds the directory
	// full: grants are held, and the waiter is told why.
	free := durFill(t, state)
	quietLog, readQuiet := logFile("quiet.log")
	cmd = asUID(e.launch("--quiet", "--sm", "50", "--mem", "1G", "--", "/bin/true"), waitLogUIDWaiter)
	cmd.Stderr = quietLog
	quiet := startProc(t, cmd)
	durWaitText(t, "the waiter's log", readLogged, "state directory "+state+" cannot be written")
	free()
	durWaitText(t, "the waiter's log", readLogged, "(waiting for room), waited ")
	// An operator's drain, and its resume.
	e.admin(t, "drain", "--gpu", "0", "--reason", "fan replacement")
	durWaitText(t, "the waiter's log", readLogged, "GPU 0 draining (fan replacement) until an admin's mpsctl resume")
	e.admin(t, "resume", "--gpu", "0")
	roomAgain := func() string { return strconv.Itoa(strings.Count(readLogged(), "(waiting for room), waited ")) }
	durWaitText(t, "the waiter's lines of room again", roomAgain, "2")

	open()
	if r := holder.wait(t); r.code != 0 {
		t.Errorf("holder: exit %d, stderr %q", r.code, r.stderr)
	}
	for name, p := range map[string]*proc{"waiter": waiter, "quiet": quiet} {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("%s: exit %d", name, r.code)
		}
	}
	want := regexp.MustCompile(`^mps-launch: job 17: queued, position 1 in group a \(waiting for room\)\n` +
		`mps-launch: job 17: still queued, position 1 in group a \(` + regexp.QuoteMeta("state directory "+state+" cannot be written (no space left on device); no lease is granted until it can") + `\), waited \d+s\n` +
		`mps-launch: job 17: still queued, position 1 in group a \(waiting for room\), waited \d+s\n` +
		`mps-launch: job 17: still queued, position 1 in group a \(waiting for room; GPU 0 draining \(fan replacement\) until an admin's mpsctl resume\), waited \d+s\n` +
		`mps-launch: job 17: still queued, position 1 in group a \(waiting for room\), waited \d+s\n` +
		`mps-launch: job 17: granted lease a-\S+ in group a after waiting \d+s\n$`)
	got := readLogged()
	if !want.MatchString(got) {
		t.Errorf("the waiter's log\n%s\ndoes not match\n%s", got, want)
	}
	t.Logf("the waiter's log:\n%s", got)
	if got := readQuiet(); got != "" {
		t.Errorf("the quiet launch logged %q, want nothing", got)
	}
}

// waitLogLine reports whether msg, a line of mps-launch's stderr after
// "mps-launch: ", is one it logs of a wait in the queue (its stderr no
// terminal): progress, not an end.
func waitLogLine(msg string) bool {
	if rest, ok := strings.CutPrefix(msg, "job "); ok {
		if _, after, found := strings.Cut(rest, ": "); found {
			msg = after
		}
	}
	return strings.HasPrefix(msg, "queued, position ") || strings.HasPrefix(msg, "still queued, position ") ||
		strings.HasPrefix(msg, "granted lease ")
}

// withoutWaitLog is mps-launch's stderr without the lines it logs of a
// wait in the queue.
func withoutWaitLog(stderr string) string {
	var kept []string
	for _, line := range strings.SplitAfter(stderr, "\n") {
		if msg, ok := strings.CutPrefix(line, "mps-launch: "); ok && waitLogLine(strings.TrimSuffix(msg, "\n")) {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "")
}

func TestWithoutWaitLog(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"mps-launch: queued, position 2 in group a (waiting for room)\n", ""},
		{"mps-launch: job 4.0: queued, position 2 in group a (waiting for room)\n" +
			"mps-launch: job 4.0: still queued, position 1 in group a (waiting for room; GPU 0 draining until an admin's mpsctl resume), waited 3s\n" +
			"mps-launch: job 4.0: granted lease a-1 in group a after waiting 5s\n" +
			"mps-launch: job 4.0: lease a-1 revoked (MPS server 7 died); requeued, attempt 2\n",
			"mps-launch: job 4.0: lease a-1 revoked (MPS server 7 died); requeued, attempt 2\n"},
		{"the command's own queued, position 1\nmps-launch: waited 1s in group a's queue (position 1)\n",
			"the command's own queued, position 1\nmps-launch: waited 1s in group a's queue (position 1)\n"},
	} {
		if got := withoutWaitLog(tc.in); got != tc.want {
			t.Errorf("withoutWaitLog(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
