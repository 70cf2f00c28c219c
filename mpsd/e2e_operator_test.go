package mpsd

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"io"
	"log/slog"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Test uids of the operator's tests.
const (
	opUIDMember = 64700 // a member of group a, no admin
)

// opGroups: one instance (GPU 0) whose 10G fit one 8G lease at a time, so
// a second one queues.
const opGroups = `  a:
    users: [root, "64700"]
    memory: 10G
    gpus: ["0"]
`

func (e *testEnv) mpsctl(uid uint32, args ...string) result {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e.bin, "mpsctl"), append([]string{"--socket", e.socket}, args...)...)
	if uid != 0 {
		asUID(cmd, uid)
	}
	return run(e.t, cmd)
}

// mpsctl shutdown ends everything, as SIGTERM does not: the running lease
// is revoked and not requeued, the queued request refused, both launchers
// exit 75 saying why, the control daemon is gone, the compute mode is back
// to DEFAULT, and Run returns. A non-admin is refused first, and nothing
// happens.
func TestShutdownEndsWorkloadsAndMPS(t *testing.T) {
	emutest.User(t, opUIDMember)
	e := newEnv(t, opGroups, "mps:\n  compute_mode: exclusive_process")
	e.start()
	e.waitStatus("instance ready", func(st api.Status) bool {
		return len(st.Instances) == 1 && st.Instances[0].State == api.InstanceReady
	})
	work, _ := e.gate("never")
	running := startProc(t, e.launch(append([]string{"--mem", "8G", "--job", "J-run", "--"}, work...)...))
	st := e.waitStatus("the first lease running with its command", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	daemon := st.Instances[0].DaemonPID
	queued := startProc(t, e.launch("--mem", "8G", "--job", "J-queued", "--", "true"))
	e.waitStatus("the second lease queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })

	r := e.mpsctl(opUIDMember, "shutdown")
	if r.code != 1 || !strings.Contains(r.stderr, "not an mpsd admin") {
		t.Fatalf("shutdown as uid %d: exit %d, stderr %q; want 1 and a refusal", opUIDMember, r.code, r.stderr)
	}
	if st := e.d.Status(); countLeases(st, api.LeaseRunning) != 1 || countLeases(st, api.LeaseQueued) != 1 {
		t.Fatalf("a refused shutdown changed the leases: %+v", st.Leases)
	}

	r = e.mpsctl(0, "shutdown")
	if r.code != 0 {
		t.Fatalf("shutdown: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if want := "mpsd shut down: 1 running lease(s) revoked, 1 queued request(s) refused, 1 MPS control daemon(s) stopped, compute modes restored where mpsd had set them\n"; r.stdout != want {
		t.Errorf("shutdown said %q; want %q", r.stdout, want)
	}
	for _, p := range []struct {
		name string
		p    *proc
	}{{"running", running}, {"queued", queued}} {
		res := p.p.wait(t)
		if res.code != 75 || !strings.Contains(res.stderr, "mpsd is shutting down (mpsctl shutdown by uid 0)") {
			t.Errorf("%s launcher: exit %d, stderr %q; want 75 and the shutdown named", p.name, res.code, res.stderr)
		}
		// The running lease is revoked and ended, never requeued.
		want := map[string]string{"running": "the lease was revoked and its command stopped", "queued": "the request was not granted"}[p.name]
		if !strings.Contains(res.stderr, want) || strings.Contains(res.stderr, "requeued") {
			t.Errorf("%s launcher's stderr %q; want %q and no requeue", p.name, res.stderr, want)
		}
	}
	e.waitRunReturned()
	if procRunning(daemon) {
		t.Errorf("control daemon %d still running after the shutdown", daemon)
	}
	if ret := e.sim.NVML().Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer e.sim.NVML().Shutdown()
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if m, ret := dev.GetComputeMode(); ret != nvml.SUCCESS || m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 0 compute mode %v (%v) after the shutdown; want DEFAULT", m, ret)
	}
	b, err := os.ReadFile(e.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "MPS service shut down; mpsd exits") {
		t.Errorf("the log does not say the service was shut down")
	}
	// Both are in the history, ended by the shutdown.
	b, err = os.ReadFile(filepath.Join(e.dir, "state", historyLive))
	if err != nil {
		t.Fatal(err)
	}
	ended := map[string]string{}
	if err := readHistory(bytes.NewReader(b), nil, func(r api.HistoryRecord) { ended[r.JobID] = r.Ended }); err != nil {
		t.Fatal(err)
	}
	if ended["J-run"] != api.EndedShutdown || ended["J-queued"] != api.EndedShutdown || len(ended) != 2 {
		t.Errorf("history after the shutdown: %v; want both jobs ended by it", ended)
	}
}

// waitRunReturned waits for Run to return after a shutdown, without an
// error.
func (e *testEnv) waitRunReturned() {
	e.t.Helper()
	select {
	case err := <-e.done:
		e.cancel = nil
		if err != nil {
			e.t.Errorf("Run after shutdown: %v", err)
		}
	case <-time.After(waitFor):
		e.t.Fatalf("Run did not return within %s of the shutdown", waitFor)
	}
}

// holdStartRunner holds the start (-d) of the control daemons whose pipe
// directory is under prefix until release is closed, telling held the
// pipe directory of the first one.
type holdStartRunner struct {
	prefix  string
	held    chan string
	release chan struct{}
}

func (r *holdStartRunner) Start(cmd *exec.Cmd) error {
	if slices.Contains(cmd.Args[1:], "-d") {
		for _, kv := range cmd.Env {
			if p, ok := strings.CutPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY="); ok && strings.HasPrefix(p, r.prefix) {
				select {
				case r.held <- p:
				default:
				}
				select {
				case <-r.release:
				case <-time.After(waitFor):
				}
			}
		}
	}
	return cmd.Start()
}

// pipeDirProcs lists the processes whose environment names pipe as their
// MPS pipe directory.
func pipeDirProcs(pipe string) []int {
	needle := []byte("CUDA_MPS_PIPE_DIRECTORY=" + pipe + "\x00")
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, de := range ents {
		pid, err := strconv.Atoi(de.Name())
		if err != nil || !procRunning(pid) {
			continue
		}
		if env, err := os.ReadFile(filepath.Join("/proc", de.Name(), "environ")); err == nil && bytes.Contains(env, needle) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A control daemon that is starting when mpsctl shutdown begins (an
// instance a reload added, a start retried) is waited for and stopped
// with the others, and counted: the shutdown neither leaves it running
// after mpsd has gone nor says every daemon stopped without it.
func TestShutdownDuringAStart(t *testing.T) {
	e := newEnv(t, opGroups, "")
	runner := &holdStartRunner{prefix: filepath.Join(e.dir, "run", "b") + "/", held: make(chan string, 1), release: make(chan struct{})}
	var once sync.Once
	open := func() { once.Do(func() { close(runner.release) }) }
	t.Cleanup(open)
	e.opts.mpsRunner = runner
	e.start()
	daemonA := e.waitStatus("group a's instance ready", func(st api.Status) bool {
		return len(st.Instances) == 1 && st.Instances[0].State == api.InstanceReady
	}).Instances[0].DaemonPID
	e.writeConfig(opGroups+`  b:
    users: [root]
    memory: 5G
    gpus: ["0"]
`, "")
	var pipe string
	select {
	case pipe = <-runner.held:
	case <-time.After(waitFor):
		t.Fatal("group b's control daemon was not started after the reload")
	}
	t.Cleanup(func() { emutest.KillByPipeDir(pipe) })

	type answer struct {
		code   int
		stdout string
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		cmd := exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "shutdown")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			answered <- answer{ee.ExitCode(), out.String() + errb.String(), nil}
			return
		}
		answered <- answer{0, out.String() + errb.String(), err}
	}()
	e.waitLogLine("mpsd shutting down: ending the leases")
	// While group b's daemon is still starting, the shutdown must wait.
	select {
	case a := <-answered:
		t.Fatalf("shutdown answered while group b's control daemon was starting: exit %d, %q", a.code, a.stdout)
	case <-time.After(300 * time.Millisecond):
	}
	open()
	var a answer
	select {
	case a = <-answered:
	case <-time.After(waitFor):
		t.Fatal("shutdown did not answer once group b's daemon had started")
	}
	if a.err != nil || a.code != 0 || !strings.Contains(a.stdout, "2 MPS control daemon(s) stopped") || strings.Contains(a.stdout, "problem") {
		t.Errorf("shutdown: exit %d, err %v, said %q; want 0 and both daemons stopped", a.code, a.err, a.stdout)
	}
	e.waitRunReturned()
	if procRunning(daemonA) {
		t.Errorf("group a's control daemon %d still running after the shutdown", daemonA)
	}
	if pids := pipeDirProcs(pipe); len(pids) > 0 {
		t.Errorf("group b's MPS processes %v still running after the shutdown", pids)
	}
}

// By the time mps-launch has exited, status no longer shows its lease:
// the launcher's release is answered once the lease is gone.
func TestReleaseVisibleWhenLauncherExits(t *testing.T) {
	e := newEnv(t, opGroups, "")
	e.start()
	for i := range 5 {
		r := run(t, e.launch("--mem", "1G", "--", "true"))
		if r.code != 0 {
			t.Fatalf("run %d: exit %d, stderr %q", i, r.code, r.stderr)
		}
		if st := e.d.Status(); len(st.Leases) != 0 {
			t.Fatalf("run %d: mps-launch has exited, status still shows %+v", i, st.Leases)
		}
	}
}

// Status shows what an operator asks first: the running lease's run
// time, user, job and command; the queued one's position, wait time and
// the reason its launcher is told; the schema version.
func TestStatusShowsWaitAndRun(t *testing.T) {
	e := newEnv(t, opGroups, "")
	e.start()
	work, open := e.gate("run")
	first := startProc(t, e.launch(append([]string{"--mem", "8G", "--job", "J1", "--"}, work...)...))
	e.waitStatus("the first lease running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	second := startProc(t, e.launch("--mem", "8G", "--", "true", "second"))
	st := e.waitStatus("the second lease queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })
	if st.SchemaVersion != api.StatusSchemaVersion || st.At.IsZero() {
		t.Errorf("schema_version %d at %v; want %d and mpsd's clock", st.SchemaVersion, st.At, api.StatusSchemaVersion)
	}
	for _, l := range st.Leases {
		switch l.State {
		case api.LeaseRunning:
			if l.RunningSince.IsZero() || l.RunningSince.After(st.At) || l.JobID != "J1" || strings.Join(l.Command, " ") != strings.Join(work, " ") {
				t.Errorf("running lease %+v: want its grant time, job J1 and command %q", l, work)
			}
		case api.LeaseQueued:
			if l.Position != 1 || l.WaitReason != "waiting for room" || l.QueuedSince.IsZero() || strings.Join(l.Command, " ") != "true second" {
				t.Errorf("queued lease %+v: want position 1, reason \"waiting for room\", its queue time and command", l)
			}
		}
	}
	r := e.mpsctl(0, "status")
	if r.code != 0 {
		t.Fatalf("mpsctl status: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, re := range []string{
		`(?m)^instances: 1 ready; leases: 1 running, 1 queued; granted: mem 8G of 10G, clients 1 of \d+$`,
		// SM%, PROCS (one), CLIENTS (a shell has none), MEM, USED,
		// LAUNCHER beside PIDS.
		`(?m)^a-\S+\s+a\s+root\s+J1\s+0\s+\d+\s+1\s+(0|-)\s+8G\s+(0B|-)\s+1\s+[0-9.]+m?s\s+\d+\s+[\d,]+\s+/bin/sh -c "while`,
		`(?m)^a\s+1\s+a-\S+\s+root\s+-\s+\d+\s+1\s+8G\s+1\s+[0-9.]+m?s\s+\d+\s+true second$`,
		`(?m)^  a: waiting for room$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("mpsctl status does not match %s:\n%s", re, r.stdout)
		}
	}
	open()
	first.wait(t)
	second.wait(t)
}

// At info level the log says who got what: each grant, revocation,
// requeue and release with lease, job, uid, user, group, the GPU's UUID
// and its index.
func TestLeaseLifeLogged(t *testing.T) {
	e := newEnv(t, opGroups, "")
	var buf syncBuffer
	e.opts.Logger = newInfoLogger(&buf)
	e.start()
	work, open := e.gate("log")
	p := startProc(t, e.launch(append([]string{"--mem", "1G", "--job", "J-log", "--"}, work...)...))
	st := e.waitStatus("the lease running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	id, uuid := st.Leases[0].ID, st.Instances[0].GPUUUID
	if r := e.mpsctl(0, "requeue", id); r.code != 0 {
		t.Fatalf("requeue: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the lease running again", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && st.Leases[0].Attempt == 2
	})
	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	e.stop()
	log := buf.String()
	common := `lease=` + id + ` job=J-log uid=0 user=root`
	for _, msg := range []string{`msg="lease granted"`, `msg="lease revoked"`, `msg="lease requeued"`, `msg="lease released"`} {
		re := regexp.MustCompile(`level=INFO ` + regexp.QuoteMeta(msg) + ` group=a gpu=` + regexp.QuoteMeta(uuid) + ` gpu_index=0 ` + regexp.QuoteMeta(common))
		if !re.MatchString(log) {
			t.Errorf("no info line %s with gpu=%s gpu_index=0 %s in the log:\n%s", msg, uuid, common, log)
		}
	}
	if n := strings.Count(log, `msg="lease granted"`); n != 2 {
		t.Errorf("%d grants logged; want 2 (the first and the requeued attempt)", n)
	}
}

// newInfoLogger logs at info level, mpsd's default, as text.
func newInfoLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// procRunning: pid names a process that has not exited (a zombie waiting for
// its reaper has).
func procRunning(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return !ok || !strings.HasPrefix(rest, "Z")
}

// Only the lease's owner releases it: another user's release is refused
// and the lease runs on; a release of no lease is not found, a malformed
// one refused; the owner's launcher then releases it as it exits.
func TestReleaseOnlyByOwner(t *testing.T) {
	emutest.User(t, opUIDMember)
	e := newEnv(t, opGroups, "")
	e.start()
	helper := e.isoBuildAPICall()
	work, open := e.gate("rel")
	p := startProc(t, e.launch(append([]string{"--mem", "1G", "--"}, work...)...))
	st := e.waitStatus("the lease running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	id := st.Leases[0].ID
	if code, body, _ := e.isoAPICall(helper, opUIDMember, api.ReleasePath(id), "{}", false); code != api.CodeForbidden || !strings.Contains(string(body), "not yours") {
		t.Errorf("release of root's lease by uid %d: %q %s; want forbidden", opUIDMember, code, body)
	}
	if code, _, _ := e.isoAPICall(helper, opUIDMember, api.ReleasePath("a-000000000000"), "{}", false); code != api.CodeNotFound {
		t.Errorf("release of no lease: %q; want not_found", code)
	}
	if code, body, _ := e.isoAPICall(helper, opUIDMember, api.ReleasePath(id), `{"x":1}`, false); code != api.CodeBadRequest {
		t.Errorf("release with an unknown field: %q %s; want bad_request", code, body)
	}
	if st := e.d.Status(); countLeases(st, api.LeaseRunning) != 1 {
		t.Fatalf("refused releases ended the lease: %+v", st.Leases)
	}
	open()
	if r := p.wait(t); r.code != 0 {
		t.Errorf("launcher: exit %d, stderr %q", r.code, r.stderr)
	}
	if st := e.d.Status(); len(st.Leases) != 0 {
		t.Errorf("after the launcher exited status shows %+v", st.Leases)
	}
}
