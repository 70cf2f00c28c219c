package mpsd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

// inpGroup is one group the tests' root caller belongs to; each of the
// two simulated GPUs is an instance of one GPU.
const inpGroup = `  inference:
    users: [root]
    memory: 20G
`

// inpOneLine checks that mps-launch said what went wrong in exactly one line
// on stderr, starting "mps-launch: " and naming every want.
func inpOneLine(t *testing.T, r result, want ...string) {
	t.Helper()
	if strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr is not exactly one line: %q", r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "mps-launch: ") {
		t.Errorf("stderr does not start with \"mps-launch: \": %q", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q does not name %q", r.stderr, w)
		}
	}
}

// Bad input to mps-launch, whether the launcher or mpsd finds it, ends
// with 125 and one line saying what is wrong; a command that cannot be run
// with the shell's 126 and 127; a command killed by a signal with 128+N.
func TestE2ELaunchBadInput(t *testing.T) {
	e := newEnv(t, inpGroup, "")
	e.start()

	notExec := filepath.Join(e.dir, "not-executable.sh")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nowhere := filepath.Join(e.dir, "no-such.sock")
	// Socket files nobody listens on any more: one with mpsd's live
	// marker beside it, as a crashed or restarting mpsd leaves, and one
	// without, as nothing that will come back leaves.
	staleSocket := func(name string) string {
		p := filepath.Join(e.dir, name)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		_ = ln.Close()
		return p
	}
	stale, gone := staleSocket("stale.sock"), staleSocket("gone.sock")
	if err := os.WriteFile(api.LiveMarker(stale), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	hostGPUs := fmt.Sprintf("%d GPUs", len(e.d.host.GPUs()))
	if len(e.d.host.GPUs()) == 1 {
		hostGPUs = "1 GPU"
	}

	tests := []struct {
		name string
		args []string
		env  []string // added to the launcher's environment
		code int
		// want are what the one line on stderr must name; nil for a
		// command's own end, where mps-launch adds nothing.
		want []string
	}{
		{"sm zero", []string{"--sm", "0", "--", "/bin/true"}, nil, 125, []string{"--sm", `"0"`, "1 to 100"}},
		{"sm above 100", []string{"--sm", "101", "--", "/bin/true"}, nil, 125, []string{"--sm", `"101"`}},
		{"sm not a number", []string{"--sm", "abc", "--", "/bin/true"}, nil, 125, []string{"--sm", `"abc"`}},
		{"mem bad unit", []string{"--mem", "8X", "--", "/bin/true"}, nil, 125, []string{"--mem", `"8X"`}},
		{"mem negative", []string{"--mem", "-1G", "--", "/bin/true"}, nil, 125, []string{"--mem", `"-1G"`}},
		{"gpus zero", []string{"--gpus", "0", "--", "/bin/true"}, nil, 125, []string{"--gpus", `"0"`}},
		{"unknown flag", []string{"--frobnicate", "--", "/bin/true"}, nil, 125, []string{"unknown flag", "--frobnicate"}},
		{"missing command", []string{"--sm", "10", "--"}, nil, 125, []string{"missing command"}},
		{"no arguments", nil, nil, 125, []string{"missing command"}},
		{"unknown group", []string{"--group", "nosuch", "--", "/bin/true"}, nil, 125, []string{`unknown group "nosuch"`, "groups you may use: inference"}},
		{"group without its value", []string{"--group", "--", "/bin/true"}, nil, 125, []string{"--group needs a value"}},
		{"unknown GPU index", []string{"--gpu", "7", "--", "/bin/true"}, nil, 125, []string{"no GPU with index 7 (this host has " + hostGPUs + ")"}},
		// Policy never lets a group accept a request its instances could
		// not hold (max_mem <= memory, gpus = gpus_per_instance), so
		// "larger than any GPU" is refused by the group's limits: it can
		// never fit.
		{"more GPUs than an instance has", []string{"--gpus", "2", "--", "/bin/true"}, nil, 125,
			[]string{"can never fit", "gpus 2: group inference's instances have 1 GPU each; ask --gpus 1"}},
		{"more memory than the group allows", []string{"--mem", "30G", "--", "/bin/true"}, nil, 125,
			[]string{"can never fit", "mem 30G", "inference", "max_mem 20G"}},
		{"more memory than a GPU has", []string{"--mem", "64G", "--", "/bin/true"}, nil, 125,
			[]string{"can never fit", "mem 64G", "max_mem"}},
		{"daemon not running (--socket)", []string{"--socket", nowhere, "--", "/bin/true"}, nil, 125,
			[]string{nowhere}},
		{"daemon not running (MPSD_SOCKET)", []string{"--", "/bin/true"}, []string{api.EnvSocket + "=" + nowhere}, 125,
			[]string{nowhere}},
		// A stale socket with the live marker is an mpsd that stopped
		// and comes back: waited for as a restart, here not at all.
		{"daemon restarting (stale socket)", []string{"--socket", stale, "--no-wait", "--", "/bin/true"}, nil, 75,
			[]string{stale, "connection refused", "--no-wait was given"}},
		// Without the marker no mpsd is coming: said at once.
		{"daemon gone (stale socket, no marker)", []string{"--socket", gone, "--", "/bin/true"}, nil, 125,
			[]string{gone, "connection refused", "no mpsd is coming back"}},
		{"command not found (path)", []string{"--", filepath.Join(e.dir, "no-such-program")}, nil, 127,
			[]string{"no-such-program"}},
		{"command not found (PATH)", []string{"--", "mpsd-no-such-program"}, nil, 127,
			[]string{"mpsd-no-such-program"}},
		{"command not executable", []string{"--", notExec}, nil, 126, []string{notExec}},
		{"command is a directory", []string{"--", e.dir}, nil, 126, []string{e.dir}},
		{"command killed by SIGKILL", []string{"--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", "kill -KILL $$"}, nil, 137, nil},
		{"command killed by SIGTERM", []string{"--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", "kill -TERM $$"}, nil, 143, nil},
		{"command's own status", []string{"--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", "exit 3"}, nil, 3, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := e.launch(tc.args...)
			cmd.Env = append(cmd.Env, tc.env...)
			r := run(t, cmd)
			if r.code != tc.code {
				t.Fatalf("mps-launch %q: exit %d, want %d; stderr %q", tc.args, r.code, tc.code, r.stderr)
			}
			t.Logf("exit %d, stderr %q", r.code, r.stderr)
			if tc.want != nil {
				inpOneLine(t, r, tc.want...)
				if n := strings.Count(r.stderr, "this host has"); n > 1 {
					t.Errorf("stderr says the host's GPUs %d times: %q", n, r.stderr)
				}
			} else if r.stderr != "" {
				t.Errorf("mps-launch added to the command's end: stderr %q", r.stderr)
			}
		})
	}
	// Nothing refused or ended leaves a lease or a queued request behind.
	e.waitStatus("no leases left", func(st api.Status) bool { return len(st.Leases) == 0 && st.Queue["inference"] == 0 })
}

// inpClient talks HTTP to mpsd's socket, one connection per request.
func inpClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: 10 * time.Second,
	}}
}

// inpPost posts body to path and returns the status and the body.
func inpPost(t *testing.T, socket, path string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	// A raw connection: mpsd may answer a body it refuses (413) before
	// reading it all and close, and an HTTP client that is still writing
	// then reports the broken pipe instead of the answer. The body is
	// written beside the read, and a failed write is not the test's result.
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	written := make(chan struct{})
	go func() {
		defer close(written)
		_, _ = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: mpsd\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", path, api.ContentTypeJSON, len(body))
		_, _ = c.Write(body)
	}()
	defer func() { <-written }()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("POST %s: read the answer: %v", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatalf("POST %s: read body: %v", path, err)
	}
	// The rest of a refused body is not read by anyone: unblock its writer.
	_ = c.Close()
	return resp.StatusCode, resp.Header, b
}

// inpWantError checks a refusal: the status, a JSON Error body with the
// code, and a one-line message naming every want.
func inpWantError(t *testing.T, what string, status int, hdr http.Header, body []byte, wantStatus int, wantCode api.ErrorCode, want ...string) {
	t.Helper()
	if status != wantStatus {
		t.Errorf("%s: status %d, want %d; body %q", what, status, wantStatus, body)
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, api.ContentTypeJSON) {
		t.Errorf("%s: Content-Type %q, want %s", what, ct, api.ContentTypeJSON)
	}
	var ae api.Error
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ae); err != nil {
		t.Errorf("%s: body is not an api.Error: %v; body %q", what, err, body)
		return
	}
	if ae.Code != wantCode {
		t.Errorf("%s: code %q, want %q; message %q", what, ae.Code, wantCode, ae.Message)
	}
	if ae.Message == "" || strings.Contains(ae.Message, "\n") {
		t.Errorf("%s: message is not one line: %q", what, ae.Message)
	}
	for _, w := range want {
		if !strings.Contains(ae.Message, w) {
			t.Errorf("%s: message %q does not name %q", what, ae.Message, w)
		}
	}
}

// inpSlowBound is how long a slow client waits for mpsd to cut it off:
// the harness's RequestTimeout (2s) and ample slack.
const inpSlowBound = 5 * time.Second

// inpSlowConn is a client that sends part of a request and then nothing.
type inpSlowConn struct {
	name   string
	opened time.Time
	closed chan struct{} // closed once mpsd closed the connection
	got    []byte        // what mpsd sent before it closed
	closeT time.Time
	err    error // the read's end: EOF or reset, not the test's deadline
}

func inpOpenSlow(t *testing.T, socket, name, partial string) *inpSlowConn {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatalf("%s: dial: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := &inpSlowConn{name: name, opened: time.Now(), closed: make(chan struct{})}
	if _, err := io.WriteString(c, partial); err != nil {
		t.Fatalf("%s: write: %v", name, err)
	}
	// The test's own bound, well past mpsd's RequestTimeout.
	_ = c.SetReadDeadline(time.Now().Add(inpSlowBound))
	go func() {
		defer close(s.closed)
		var buf bytes.Buffer
		_, err := io.Copy(&buf, c)
		s.closeT, s.got, s.err = time.Now(), buf.Bytes(), err
	}()
	return s
}

func inpClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func inpAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// inpPPid is pid's parent, or 0 if it is gone.
func inpPPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// Malformed or slow API requests are refused or cut off on their own
// connections; a lease that was running goes on undisturbed, and new
// launches work meanwhile.
func TestE2EMalformedRequests(t *testing.T) {
	e := newEnv(t, inpGroup, "")
	e.start()

	gateArgs, open := e.gate("malformed")
	p := startProc(t, e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateArgs...)...))
	// The workload is the launcher's child, the shell of the gate; the
	// sleeps it runs in turn come and go.
	workload := 0
	st := e.waitStatus("the gate lease running with its workload", func(st api.Status) bool {
		if countLeases(st, api.LeaseRunning) != 1 {
			return false
		}
		for _, pid := range st.Leases[0].PIDs {
			if inpPPid(pid) == p.pid() {
				workload = pid
				return true
			}
		}
		return false
	})
	leaseID := st.Leases[0].ID
	undisturbed := func(when string) {
		t.Helper()
		st := e.d.Status()
		i := slices.IndexFunc(st.Leases, func(l api.LeaseStatus) bool { return l.ID == leaseID })
		if i < 0 || st.Leases[i].State != api.LeaseRunning {
			t.Fatalf("%s: lease %s is no longer running: %+v", when, leaseID, st.Leases)
		}
		if !inpAlive(workload) || !slices.Contains(st.Leases[i].PIDs, workload) {
			t.Errorf("%s: workload pid %d of lease %s is gone (lease pids %v)", when, workload, leaseID, st.Leases[i].PIDs)
		}
		if !inpAlive(p.pid()) {
			t.Fatalf("%s: the gate lease's mps-launch (pid %d) ended", when, p.pid())
		}
	}

	// Slow clients: one sends its headers but never the body, one only
	// half its headers, one half its body. Each must be cut off after
	// RequestTimeout.
	noBody := inpOpenSlow(t, e.socket, "headers without body",
		"POST "+api.PathLeases+" HTTP/1.1\r\nHost: mpsd\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
	halfHeaders := inpOpenSlow(t, e.socket, "half the headers",
		"POST "+api.PathLeases+" HTTP/1.1\r\nHost: mpsd\r\nContent-Type: appl")
	halfBody := inpOpenSlow(t, e.socket, "half the body",
		"POST "+api.AttachPath(leaseID)+" HTTP/1.1\r\nHost: mpsd\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"pid\":")
	slow := []*inpSlowConn{noBody, halfHeaders, halfBody}

	// While they are connected a new launch is served.
	r := run(t, e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"))
	if r.code != 0 {
		t.Fatalf("mps-launch -- /bin/true beside the slow clients: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, s := range slow {
		if inpClosed(s.closed) {
			t.Errorf("%s: cut off after %s, before the launch beside it ended; the test shows nothing about serving beside it",
				s.name, s.closeT.Sub(s.opened))
		}
	}
	undisturbed("beside the slow clients")

	// Malformed requests, each on its own connection.
	tooLarge := []byte(`{"command":["` + strings.Repeat("x", 2*api.MaxRequestBytes) + `"]}`)
	malformed := []struct {
		name   string
		path   string
		body   []byte
		status int
		code   api.ErrorCode
		want   []string
	}{
		{"bad JSON", api.PathLeases, []byte(`{"sm": 10,`), 400, api.CodeBadRequest, nil},
		{"not JSON", api.PathLeases, []byte(`sm=10`), 400, api.CodeBadRequest, nil},
		{"empty body", api.PathLeases, nil, 400, api.CodeBadRequest, nil},
		{"unknown field", api.PathLeases, []byte(`{"sm":10,"gpu_count":1}`), 400, api.CodeBadRequest, []string{"gpu_count"}},
		{"data after the object", api.PathLeases, []byte(`{"sm":10}{"sm":20}`), 400, api.CodeBadRequest, nil},
		{"sm out of range", api.PathLeases, []byte(`{"sm":101}`), 400, api.CodeBadRequest, []string{"sm"}},
		{"body over MaxRequestBytes", api.PathLeases, tooLarge, 413, api.CodeTooLarge, nil},
		{"attach, bad JSON", api.AttachPath(leaseID), []byte(`{"pid":`), 400, api.CodeBadRequest, nil},
		{"attach, unknown field", api.AttachPath(leaseID), []byte(`{"pid":1,"uid":0}`), 400, api.CodeBadRequest, []string{"uid"}},
		{"attach, body over MaxRequestBytes", api.AttachPath(leaseID), tooLarge, 413, api.CodeTooLarge, nil},
	}
	for _, m := range malformed {
		t.Run(m.name, func(t *testing.T) {
			status, hdr, body := inpPost(t, e.socket, m.path, m.body)
			inpWantError(t, m.name, status, hdr, body, m.status, m.code, m.want...)
		})
	}
	undisturbed("after the malformed requests")

	// The slow clients are cut off after RequestTimeout, not before and
	// not much later.
	timeout := e.opts.RequestTimeout
	for _, s := range slow {
		<-s.closed
		took := s.closeT.Sub(s.opened)
		var ne net.Error
		if errors.As(s.err, &ne) && ne.Timeout() {
			t.Errorf("%s: mpsd still held the connection after %s (RequestTimeout is %s); it sent %q",
				s.name, took, timeout, s.got)
			continue
		}
		if took < timeout-200*time.Millisecond || took > timeout+3*time.Second {
			t.Errorf("%s: cut off after %s, want about RequestTimeout (%s)", s.name, took, timeout)
		}
		t.Logf("%s: cut off after %s (%v); mpsd sent %q", s.name, took, s.err, s.got)
		// If mpsd answered before closing, the answer is a 4xx.
		if len(s.got) > 0 && !bytes.HasPrefix(s.got, []byte("HTTP/1.1 4")) {
			t.Errorf("%s: mpsd answered %q, want a 4xx or nothing", s.name, s.got)
		}
	}
	undisturbed("after the slow clients")

	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("the gate lease's launch: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// inpCgroup is pid's cgroup v2 path (the "0::" line), or "" if it has
// none or is gone.
func inpCgroup(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p
		}
	}
	return ""
}

// Attach moves only the caller's own child into the caller's own running
// lease; the release of the lease kills what was attached.
func TestE2EAttachAuthorization(t *testing.T) {
	e := newEnv(t, inpGroup, "")
	e.start()

	// A lease held by this test over the raw API: the stream's connection
	// is the lease.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mpsd"+api.PathLeases,
		strings.NewReader(fmt.Sprintf(`{"sm":10,"mem_bytes":%d}`, 1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", api.ContentTypeJSON)
	resp, err := inpClient(e.socket).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", api.PathLeases, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: status %d, body %q", api.PathLeases, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, api.ContentTypeNDJSON) {
		t.Errorf("lease stream Content-Type %q, want %s", ct, api.ContentTypeNDJSON)
	}
	granted := make(chan *api.Lease, 1)
	go func() {
		defer close(granted)
		dec := api.NewEventDecoder(resp.Body)
		for {
			ev, err := dec.Next()
			if err != nil {
				return
			}
			if ev.Type == api.EventGranted {
				granted <- ev.Lease
				return
			}
			if ev.Type == api.EventError {
				t.Errorf("lease stream: error event %s: %s", ev.Code, ev.Message)
				return
			}
		}
	}()
	var lease *api.Lease
	select {
	case lease = <-granted:
	case <-time.After(waitFor):
		t.Fatalf("no granted event within %s", waitFor)
	}
	if lease == nil {
		t.Fatal("the lease stream ended before a granted event")
	}

	// The attach refusals, none of which may move anything.
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	sleepDone := make(chan error, 1)
	go func() { sleepDone <- sleep.Wait() }()
	t.Cleanup(func() { _ = sleep.Process.Kill() })

	// A grandchild: the caller started it, but not as its own child.
	sh := exec.Command("/bin/sh", "-c", "sleep 60 & echo $!; wait")
	shOut, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(shOut).ReadString('\n')
	grandchild, aerr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || aerr != nil {
		_ = sh.Process.Kill()
		t.Fatalf("the shell did not print its child's pid: %q, %v", line, err)
	}
	shDone := make(chan error, 1)
	go func() { shDone <- sh.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(grandchild, syscall.SIGKILL)
		_ = sh.Process.Kill()
		<-shDone
	})

	attach := func(id string, pid int) (int, http.Header, []byte) {
		return inpPost(t, e.socket, api.AttachPath(id), []byte(fmt.Sprintf(`{"pid":%d}`, pid)))
	}
	unknown := "inference-000000000000"
	refusals := []struct {
		name   string
		id     string
		pid    int
		status int
		code   api.ErrorCode
		want   []string
	}{
		// The protocol itself (api.AttachRequest.Validate) rules out pid
		// 1 and below: they can never be anyone's child.
		{"pid 1", lease.ID, 1, http.StatusBadRequest, api.CodeBadRequest, []string{"pid 1"}},
		{"the caller's parent", lease.ID, os.Getppid(), http.StatusForbidden, api.CodeForbidden,
			[]string{strconv.Itoa(os.Getppid()), "not a child"}},
		{"the caller's grandchild", lease.ID, grandchild, http.StatusForbidden, api.CodeForbidden,
			[]string{strconv.Itoa(grandchild), "not a child"}},
		{"the caller itself", lease.ID, os.Getpid(), http.StatusForbidden, api.CodeForbidden,
			[]string{strconv.Itoa(os.Getpid())}},
		{"no such pid", lease.ID, 1 << 30, http.StatusForbidden, api.CodeForbidden, nil},
		{"unknown lease", unknown, sleep.Process.Pid, http.StatusNotFound, api.CodeNotFound, []string{unknown}},
	}
	for _, rf := range refusals {
		before := inpCgroup(rf.pid)
		status, hdr, body := attach(rf.id, rf.pid)
		inpWantError(t, "attach "+rf.name, status, hdr, body, rf.status, rf.code, rf.want...)
		if after := inpCgroup(rf.pid); after != before {
			t.Errorf("attach %s moved pid %d from %s to %s", rf.name, rf.pid, before, after)
		}
	}
	if _, err := exec.LookPath("curl"); err == nil {
		// Another uid may not attach to this lease, whatever the pid.
		out, err := asUID(exec.Command("curl", "-sS", "--max-time", "10", "--unix-socket", e.socket,
			"-H", "Content-Type: application/json", "-d", fmt.Sprintf(`{"pid":%d}`, sleep.Process.Pid),
			"-w", "\n%{http_code}", "http://mpsd"+api.AttachPath(lease.ID)), 65534).Output()
		if err != nil {
			t.Errorf("curl as uid 65534: %v: %s", err, out)
		} else if i := bytes.LastIndexByte(out, '\n'); i < 0 || string(out[i+1:]) != "403" ||
			!strings.Contains(string(out[:i]), `"code":"forbidden"`) {
			body, code := out, []byte("?")
			if i >= 0 {
				body, code = out[:i], out[i+1:]
			}
			t.Errorf("attach by another uid: status %s, body %q; want 403 %s", code, body, api.CodeForbidden)
		}
		if got := inpCgroup(sleep.Process.Pid); strings.HasSuffix(got, "/"+lease.ID) {
			t.Errorf("attach by another uid moved pid %d into the lease cgroup", sleep.Process.Pid)
		}
	} else {
		t.Log("no curl: attach by another uid not checked")
	}

	// The caller's own child goes into the lease's cgroup.
	status, _, body := attach(lease.ID, sleep.Process.Pid)
	if status != http.StatusOK {
		t.Fatalf("attach own child %d: status %d, body %q", sleep.Process.Pid, status, body)
	}
	if got := inpCgroup(sleep.Process.Pid); !strings.HasSuffix(got, "/"+lease.ID) {
		t.Fatalf("after attach, pid %d is in cgroup %q, want the lease's (ending /%s)", sleep.Process.Pid, got, lease.ID)
	}
	if got := inpCgroup(os.Getpid()); strings.HasSuffix(got, "/"+lease.ID) {
		t.Fatalf("the caller itself (pid %d) is in the lease cgroup %s", os.Getpid(), got)
	}
	st := e.waitStatus("the attached pid in status", func(st api.Status) bool {
		return len(st.Leases) == 1 && slices.Contains(st.Leases[0].PIDs, sleep.Process.Pid)
	})
	if st.Leases[0].ID != lease.ID || st.Leases[0].State != api.LeaseRunning {
		t.Errorf("status lease %+v, want running lease %s", st.Leases[0], lease.ID)
	}

	// Closing the stream releases the lease, and the release kills what
	// is in its cgroup.
	cancel()
	_ = resp.Body.Close()
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
	select {
	case err := <-sleepDone:
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("sleep ended with %v, want killed", err)
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("sleep ended with %v, want SIGKILL by the release", err)
		}
	case <-time.After(waitFor):
		t.Fatalf("the attached sleep (pid %d) outlived the release of its lease", sleep.Process.Pid)
	}
}

// A request that declares a body and never sends it, on a path whose
// handler does not read one (status, a path mpsd does not know, a method
// it does not take): mpsd answers once the request timeout has passed
// and closes the connection, instead of holding it, unanswered, for ever.
// The status of 8 instances is an answer larger than net/http's buffer,
// whose headers go out (and the body is drained) while the handler still
// writes.
func TestE2EUnsentBodyTimesOut(t *testing.T) {
	e := newEnvGPUs(t, 8, oneGroup, "")
	e.opts.RequestTimeout = time.Second
	e.start()
	for _, req := range []string{"GET " + api.PathStatus, "GET /v1/nothing-here", "DELETE " + api.PathStatus} {
		t.Run(req, func(t *testing.T) {
			c, err := net.Dial("unix", e.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte(req + " HTTP/1.1\r\nHost: mpsd\r\nContent-Length: 100\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(waitFor))
			b, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("no answer and the connection still open %s on (request timeout 1s): %v, read %q", waitFor, err, b)
			}
			if !bytes.HasPrefix(b, []byte("HTTP/1.1 ")) {
				t.Errorf("answer %q, want an HTTP answer", b)
			}
			if strings.HasPrefix(req, "GET "+api.PathStatus) && len(b) < 4<<10 {
				t.Errorf("status answer of %d bytes; the test wants one over 4 KiB (net/http buffers 2 KiB)", len(b))
			}
		})
	}
}
