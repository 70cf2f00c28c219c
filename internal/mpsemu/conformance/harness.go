package conformance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

// Target is one implementation of nvidia-cuda-mps-control under test.
type Target struct {
	Name    string   // e.g. "real-550", "emu-550"
	Gen     string   // driver generation: 535, 550, 555
	Control string   // path of nvidia-cuda-mps-control
	BinDir  string   // put first on PATH: holds the nvidia-cuda-mps-server the daemon spawns
	Env     []string // extra environment, e.g. MPSEMU_DRIVER=550
	// Users are the unprivileged users steps may run as (Step.As), by
	// the names scenarios use: "owner", "member" (in owner's group),
	// "stranger". Control and BinDir must be theirs to run, and the
	// directory a scenario runs in theirs to enter.
	Users map[string]Cred
	// RunDir, when set, is where the test makes each run's directory.
	RunDir string
}

// Cred is a user a step runs as.
type Cred struct {
	UID, GID uint32
	Groups   []uint32
}

// Scenario is a script run against each target.
type Scenario struct {
	Name  string
	Env   []string // extra environment for the daemon and every caller
	Steps []Step
	// Gens restricts the scenario to some generations (nil: all).
	Gens []string
}

type op int

const (
	opDaemon op = iota
	opCmd
	opArgv
	opFiles
	opPidFile
	opWaitLog
	opKillDaemon
	opKillServers
	opWaitDaemonExit
	opServersAlive
	opForeground
	opStopForeground
	opLogDir
	opWaitFile
	opFIFO
)

// Step is one action of a scenario and what it records.
type Step struct {
	op      op
	args    []string
	stdin   string
	sig     syscall.Signal
	n       int
	timeout time.Duration
	user    string // Target.Users name; "" is root
}

// Timeout sets the step's deadline (default 5 s).
func (s Step) Timeout(d time.Duration) Step { s.timeout = d; return s }

// As runs the step (a daemon start or a client call) as the target's user
// of that name instead of root. A daemon started as a user owns the
// scenario directory and the log directory, as it would its own.
func (s Step) As(user string) Step { s.user = user; return s }

func daemon(args ...string) Step { return Step{op: opDaemon, args: args} }

// cmd sends each line, newline-terminated, in one client call.
func cmd(lines ...string) Step {
	return Step{op: opCmd, stdin: strings.Join(lines, "\n") + "\n"}
}

// raw sends stdin exactly as given.
func raw(stdin string) Step                  { return Step{op: opCmd, stdin: stdin} }
func argv(args ...string) Step               { return Step{op: opArgv, args: args} }
func files() Step                            { return Step{op: opFiles} }
func pidFile() Step                          { return Step{op: opPidFile} }
func logDir() Step                           { return Step{op: opLogDir} }
func waitFile(name string) Step              { return Step{op: opWaitFile, args: []string{name}} }
func waitLog(substr string, n int) Step      { return Step{op: opWaitLog, args: []string{substr}, n: n} }
func killDaemon(sig syscall.Signal) Step     { return Step{op: opKillDaemon, sig: sig} }
func killServers(sig syscall.Signal) Step    { return Step{op: opKillServers, sig: sig} }
func waitDaemonExit() Step                   { return Step{op: opWaitDaemonExit} }
func serversAlive() Step                     { return Step{op: opServersAlive} }
func foreground(args ...string) Step         { return Step{op: opForeground, args: args} }
func stopForeground(sig syscall.Signal) Step { return Step{op: opStopForeground, sig: sig} }

// fifo writes data into the pipe directory's log FIFO without blocking, as
// any process that may open it can (mpslog.WriteRaw), and records whether
// it all went in. From then on the log is taken to carry no more than it
// has: a snapshot waits for it to stop growing, not for the calls' lines
// (a poisoned or stopped logger never writes them), until a daemon starts
// again.
func fifo(data []byte) Step { return Step{op: opFIFO, args: []string{string(data)}} }

// Entry is one recorded observation.
type Entry struct {
	What string
	Text string
}

// Transcript is everything a scenario recorded on one target, normalised.
type Transcript []Entry

const defaultTimeout = 5 * time.Second

type runner struct {
	t       Target
	sc      Scenario
	dir     string
	pipe    string
	logs    string
	env     []string
	entries []Entry
	fg      *exec.Cmd
	fgOut   *os.File
	fgDone  chan struct{}
	// uiCalls counts client calls that reached a daemon: each is one
	// "NEW UI" the log must show before it is read.
	uiCalls int
	// stopping is set once a scenario has told its daemon to quit or killed
	// it: from then on its log is not read (NVIDIA's daemon loses lines as
	// it exits), until a daemon is started again.
	stopping bool
	// owner is the user the daemon was started as ("" root): its quit is
	// obeyed, another user's refused.
	owner string
	// unsynced is set by a write into the log FIFO: the daemon's logger
	// may swallow or drop what follows, so the log is not awaited line by
	// line until a daemon starts again.
	unsynced bool
}

// Run executes the scenario against the target in a fresh directory under
// dir, then kills every process that carries the scenario's pipe directory.
func Run(ctx context.Context, t Target, sc Scenario, dir string) (Transcript, error) {
	r := &runner{t: t, sc: sc, dir: dir, pipe: filepath.Join(dir, "pipe"), logs: filepath.Join(dir, "log")}
	if err := os.MkdirAll(r.logs, 0o755); err != nil {
		return nil, err
	}
	r.env = r.environ()
	defer r.cleanup()
	for i, st := range sc.Steps {
		if err := r.step(ctx, st); err != nil {
			return nil, fmt.Errorf("%s on %s: step %d: %w", sc.Name, t.Name, i+1, err)
		}
	}
	r.snapshotLog(ctx)
	r.record("server.log", r.readLog("server.log"))
	return r.normalise(), nil
}

func (r *runner) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "MPSEMU_") || k == "PATH" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"PATH="+r.t.BinDir+":/usr/sbin:/usr/bin:/sbin:/bin",
		"CUDA_MPS_PIPE_DIRECTORY="+r.pipe,
		"CUDA_MPS_LOG_DIRECTORY="+r.logs,
	)
	env = append(env, r.t.Env...)
	return append(env, r.sc.Env...)
}

func (r *runner) record(what, text string) {
	r.entries = append(r.entries, Entry{What: what, Text: text})
}

// call runs the control program and records its stdout, stderr and status.
// Output goes to files, not pipes, so a daemon that inherits them cannot
// keep the call open.
func (r *runner) call(ctx context.Context, what, user string, args []string, stdin string, timeout time.Duration) error {
	if timeout == 0 {
		timeout = defaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	outF, err := os.CreateTemp(r.dir, "stdout-")
	if err != nil {
		return err
	}
	errF, err := os.CreateTemp(r.dir, "stderr-")
	if err != nil {
		return err
	}
	defer func() {
		outF.Close()
		errF.Close()
		os.Remove(outF.Name())
		os.Remove(errF.Name())
	}()
	c := exec.CommandContext(ctx, r.t.Control, args...)
	c.Env = r.env
	c.Dir = r.dir
	if user != "" {
		cred, ok := r.t.Users[user]
		if !ok {
			return fmt.Errorf("%s: no user %q on target %s", what, user, r.t.Name)
		}
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: cred.UID, Gid: cred.GID, Groups: cred.Groups}}
		what += " as " + user
	}
	c.Stdin = strings.NewReader(stdin)
	c.Stdout, c.Stderr = outF, errF
	c.WaitDelay = time.Second
	runErr := c.Run()
	status := "exit 0"
	switch {
	case ctx.Err() != nil:
		status = "timed out"
	case runErr != nil:
		var ee *exec.ExitError
		if !errors.As(runErr, &ee) {
			return fmt.Errorf("run %s: %w", what, runErr)
		}
		status = exitStatus(ee.ProcessState)
	}
	// Flags (-d, -f, -h) never reach a daemon; a command, on stdin or
	// (for 535 and 550) as an argument, does when the call succeeds.
	if status == "exit 0" && (len(args) == 0 || !strings.HasPrefix(args[0], "-")) {
		r.uiCalls++
	}
	out, _ := os.ReadFile(outF.Name())
	serr, _ := os.ReadFile(errF.Name())
	r.record(what, fmt.Sprintf("stdout %q\nstderr %q\n%s", out, serr, status))
	return nil
}

func exitStatus(ps *os.ProcessState) string {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return "exit " + strconv.Itoa(ps.ExitCode())
}

func (r *runner) step(ctx context.Context, st Step) error {
	switch st.op {
	case opDaemon:
		r.stopping = false
		before := strings.Count(r.readLog("control.log"), daemonStartLine)
		if err := r.own(st.user); err != nil {
			return err
		}
		r.owner = st.user
		if err := r.call(ctx, "daemon "+strings.Join(st.args, " "), st.user, st.args, "", st.timeout); err != nil {
			return err
		}
		// NVIDIA's daemon writes its log from another thread: -d can return
		// before its first lines are there. Wait for them (bounded; a daemon
		// that refused to start never writes them) so later steps see them.
		if strings.HasSuffix(r.entries[len(r.entries)-1].Text, "exit 0") {
			started := r.waitFor(ctx, 2*time.Second, func() bool {
				return strings.Count(r.readLog("control.log"), daemonStartLine) > before
			})
			if started && r.unsynced {
				// A new daemon, a new logger: calls count from here.
				r.unsynced = false
				r.uiCalls = strings.Count(r.readLog("control.log"), "] NEW UI\n")
			}
		}
	case opCmd:
		// A quit the daemon obeys (root's or its owner's) ends its log.
		if strings.HasPrefix(strings.TrimSpace(st.stdin), "quit") && (st.user == "" || st.user == r.owner) {
			r.snapshotLog(ctx)
			r.stopping = true
		}
		return r.call(ctx, fmt.Sprintf("cmd %q", st.stdin), st.user, nil, r.expand(st.stdin), st.timeout)
	case opArgv:
		return r.call(ctx, "argv "+strings.Join(st.args, " "), st.user, st.args, "", st.timeout)
	case opFIFO:
		r.unsynced = true
		r.record(fmt.Sprintf("write %d bytes into the log FIFO", len(st.args[0])), fifoResult(filepath.Join(r.pipe, "log"), []byte(st.args[0])))
	case opFiles:
		r.record("pipe dir", listDir(r.pipe))
	case opLogDir:
		r.record("log dir", listDir(r.logs))
	case opPidFile:
		b, err := os.ReadFile(filepath.Join(r.pipe, "nvidia-cuda-mps-control.pid"))
		text := fmt.Sprintf("%q", b)
		if err != nil {
			text = "absent"
		}
		r.record("pid file", text)
	case opWaitLog:
		ok := r.waitFor(ctx, st.timeout, func() bool {
			return strings.Count(r.readLog("control.log"), st.args[0]) >= st.n
		})
		r.record(fmt.Sprintf("wait for %d× %q in control.log", st.n, st.args[0]), strconv.FormatBool(ok))
	case opWaitFile:
		ok := r.waitFor(ctx, st.timeout, func() bool {
			_, err := os.Lstat(filepath.Join(r.pipe, st.args[0]))
			return err == nil
		})
		r.record("wait for pipe-dir file "+st.args[0], strconv.FormatBool(ok))
	case opKillDaemon:
		r.snapshotLog(ctx)
		r.stopping = true
		pid := r.daemonPID()
		if pid == 0 {
			r.record("kill daemon", "no daemon pid")
			return nil
		}
		err := syscall.Kill(pid, st.sig)
		r.record("kill daemon "+st.sig.String(), errText(err))
	case opKillServers:
		pids := r.liveServers()
		for _, pid := range pids {
			_ = syscall.Kill(pid, st.sig)
		}
		r.record("kill servers "+st.sig.String(), fmt.Sprintf("%d killed", len(pids)))
	case opWaitDaemonExit:
		pid := r.daemonPID()
		ok := pid != 0 && r.waitFor(ctx, st.timeout, func() bool { return !emutest.Alive(pid) })
		r.record("daemon exited", strconv.FormatBool(ok))
	case opServersAlive:
		r.record("live servers", strconv.Itoa(len(r.liveServers())))
	case opForeground:
		r.stopping = false
		return r.startForeground(st.args)
	case opStopForeground:
		return r.stopForeground(ctx, st)
	default:
		return fmt.Errorf("unknown step %d", st.op)
	}
	return nil
}

// own gives the scenario directory and the log directory to user (a
// daemon started as user creates its pipe directory and writes its logs
// there); "" leaves them root's.
func (r *runner) own(user string) error {
	if user == "" {
		return nil
	}
	cred, ok := r.t.Users[user]
	if !ok {
		return fmt.Errorf("daemon: no user %q on target %s", user, r.t.Name)
	}
	for _, d := range []string{r.dir, r.logs} {
		if err := os.Chown(d, int(cred.UID), int(cred.GID)); err != nil {
			return err
		}
	}
	return nil
}

// expand replaces {server} in a command with the newest live server's
// pid, and {daemon} with the daemon's (a live process that is no server);
// the recorded step name keeps the placeholder so it is the same on every
// target.
func (r *runner) expand(s string) string {
	if strings.Contains(s, "{daemon}") {
		s = strings.ReplaceAll(s, "{daemon}", strconv.Itoa(r.daemonPID()))
	}
	if !strings.Contains(s, "{server}") {
		return s
	}
	pid := 0
	if live := r.liveServers(); len(live) > 0 {
		pid = live[len(live)-1]
	}
	return strings.ReplaceAll(s, "{server}", strconv.Itoa(pid))
}

// fifoResult writes b into the FIFO at path without blocking and says how
// it went: "all written", "full" (the FIFO took part, or none), or the
// error number (no daemon reads it: ENXIO).
func fifoResult(path string, b []byte) string {
	n, err := mpslog.WriteRaw(path, b)
	var errno syscall.Errno
	switch {
	case err == nil && n == len(b):
		return "all written"
	case errors.Is(err, syscall.EAGAIN):
		return "full"
	case errors.As(err, &errno):
		return errno.Error()
	}
	return fmt.Sprintf("%d bytes written: %v", n, err)
}

func errText(err error) string {
	if err != nil {
		return err.Error()
	}
	return "ok"
}

func (r *runner) startForeground(args []string) error {
	f, err := os.CreateTemp(r.dir, "foreground-")
	if err != nil {
		return err
	}
	c := exec.Command(r.t.Control, args...)
	c.Env = r.env
	c.Dir = r.dir
	c.Stdout, c.Stderr = f, f
	if err := c.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s %v: %w", r.t.Control, args, err)
	}
	r.fg, r.fgOut, r.fgDone = c, f, make(chan struct{})
	go func() { _ = c.Wait(); close(r.fgDone) }()
	return nil
}

// stopForeground waits for the foreground daemon's listening socket, signals
// it, and records its exit and what it printed.
func (r *runner) stopForeground(ctx context.Context, st Step) error {
	if r.fg == nil {
		return errors.New("no foreground daemon")
	}
	if st.sig != 0 {
		_ = r.fg.Process.Signal(st.sig)
	}
	timeout := st.timeout
	if timeout == 0 {
		timeout = defaultTimeout
	}
	select {
	case <-r.fgDone:
	case <-time.After(timeout):
		_ = r.fg.Process.Kill()
		<-r.fgDone
	case <-ctx.Done():
		_ = r.fg.Process.Kill()
		<-r.fgDone
	}
	out, _ := os.ReadFile(r.fgOut.Name())
	r.fgOut.Close()
	r.record("foreground output", string(out)+"\n"+exitStatus(r.fg.ProcessState))
	r.fg = nil
	return nil
}

// waitFor polls cond until it holds or the deadline passes: the daemons are
// separate processes with no event the harness could subscribe to.
func (r *runner) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	if timeout == 0 {
		timeout = defaultTimeout
	}
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// snapshotLog records control.log while its daemon is alive, once the
// daemon's log thread has caught up: NVIDIA's daemon writes the log from a
// separate thread that can lag many lines behind under load, and loses what
// it had not written when the daemon exits. So the log is compared only at
// points where the daemon still runs (before quit, before it is killed, at
// the end) and only after every call that reached it is logged and closed,
// with no connection half logged.
func (r *runner) snapshotLog(ctx context.Context) {
	if r.stopping {
		return
	}
	if _, err := os.Stat(filepath.Join(r.logs, "control.log")); err != nil {
		r.record("control.log", "absent") // -f logs to stdout only
		return
	}
	if r.unsynced {
		r.waitStill(ctx, "control.log")
		r.record("control.log", r.readLog("control.log"))
		return
	}
	r.waitFor(ctx, 3*time.Second, func() bool {
		l := r.readLog("control.log")
		ui := strings.Count(l, "] NEW UI\n")
		return ui >= r.uiCalls &&
			ui == strings.Count(l, "] UI closed\n") &&
			strings.Count(l, "] Accepting connection...\n") == ui
	})
	r.record("control.log", r.readLog("control.log"))
}

// waitStill waits (at most 3 s) until the log has not grown for 200 ms.
func (r *runner) waitStill(ctx context.Context, name string) {
	const still = 200 * time.Millisecond
	last, since := -1, time.Now()
	r.waitFor(ctx, 3*time.Second, func() bool {
		if n := len(r.readLog(name)); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= still
	})
}

func (r *runner) readLog(name string) string {
	b, _ := os.ReadFile(filepath.Join(r.logs, name))
	return string(b)
}

// daemonStartLine is the last of the lines a daemon logs as it starts.
const daemonStartLine = "] To connect CUDA applications to this daemon"

var (
	reDaemonStart = regexp.MustCompile(`Control +(\d+)\] Starting control daemon`)
	reServerStart = regexp.MustCompile(`Starting new server (\d+) for user`)
	reServerExit  = regexp.MustCompile(`Server (\d+) exited with status`)
)

// daemonPID finds the daemon: the holder of the lock on control_lock (every
// generation takes it, and it goes away with the daemon), else the pid file,
// else (535 writes none) the last "Starting control daemon" line.
func (r *runner) daemonPID() int {
	if f, err := os.OpenFile(filepath.Join(r.pipe, "control_lock"), os.O_RDWR, 0); err == nil {
		lk := unix.Flock_t{Type: unix.F_WRLCK}
		err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk)
		f.Close()
		if err == nil && lk.Type != unix.F_UNLCK && lk.Pid > 0 {
			return int(lk.Pid)
		}
	}
	if b, err := os.ReadFile(filepath.Join(r.pipe, "nvidia-cuda-mps-control.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return pid
		}
	}
	m := reDaemonStart.FindAllStringSubmatch(r.readLog("control.log"), -1)
	if len(m) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(m[len(m)-1][1])
	return pid
}

// liveServers lists server pids the log says were started and that still run.
func (r *runner) liveServers() []int {
	l := r.readLog("control.log")
	var pids []int
	for _, m := range reServerStart.FindAllStringSubmatch(l, -1) {
		pid, _ := strconv.Atoi(m[1])
		if emutest.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func listDir(dir string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "absent"
		}
		return err.Error()
	}
	var b strings.Builder
	if fi, err := os.Stat(dir); err == nil {
		fmt.Fprintf(&b, ". %s\n", fi.Mode())
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "stdout-") || strings.HasPrefix(e.Name(), "stderr-") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s %s size=%d\n", e.Name(), fi.Mode(), sizeIn(dir, fi))
	}
	return b.String()
}

// reNumber is a run of digits: a log's pids and times, whose lengths vary
// from run to run (pids wrap at pid_max, here 32768: 4 or 5 digits).
var reNumber = regexp.MustCompile(`\d+`)

// sizeIn is sizeOf, but a log's size counts every number as one digit, so
// that two logs with the same lines have the same size whatever pids the
// processes that wrote them got.
func sizeIn(dir string, fi fs.FileInfo) int64 {
	if !fi.Mode().IsRegular() || !strings.HasSuffix(fi.Name(), ".log") {
		return sizeOf(fi)
	}
	b, err := os.ReadFile(filepath.Join(dir, fi.Name()))
	if err != nil {
		return sizeOf(fi)
	}
	return int64(len(reNumber.ReplaceAll(b, []byte("0"))))
}

// sizeOf reports sizes only for regular files; a socket's or FIFO's size
// means nothing, and the pid file's is the pid's number of digits (its
// content is compared, normalised, by the pid file step).
func sizeOf(fi fs.FileInfo) int64 {
	if fi.Mode().IsRegular() && fi.Name() != "nvidia-cuda-mps-control.pid" {
		return fi.Size()
	}
	return 0
}

// cleanup kills every process whose environment names this scenario's pipe
// directory: the daemon, its servers, orphans and hung callers alike.
func (r *runner) cleanup() {
	if r.fg != nil {
		_ = r.fg.Process.Kill()
		<-r.fgDone
		r.fgOut.Close()
	}
	emutest.KillByPipeDir(r.pipe)
}

var (
	reTimestamp = regexp.MustCompile(`\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (\w+) +(\d+)\]`)
	rePidFile   = regexp.MustCompile(`^"(\d+)"$`)
	reListed    = regexp.MustCompile(`(?m)^(\d+)$`)
)

// normalise replaces timestamps, the scenario directory and every pid with
// stable symbols (P1, P2, ... in order of first appearance), and orders log
// lines by the process that wrote them, keeping each process's own order:
// lines of different processes interleave by scheduling, not by behaviour.
func (r *runner) normalise() Transcript {
	syms := map[string]string{}
	sym := func(pid string) string {
		if s, ok := syms[pid]; ok {
			return s
		}
		s := fmt.Sprintf("P%d", len(syms)+1)
		syms[pid] = s
		return s
	}
	// First pass: learn pids in order of appearance.
	for _, e := range r.entries {
		switch {
		case e.What == "pid file":
			if m := rePidFile.FindStringSubmatch(e.Text); m != nil {
				sym(m[1])
			}
		case e.What == "control.log" || e.What == "server.log" || e.What == "foreground output":
			for _, m := range reTimestamp.FindAllStringSubmatch(e.Text, -1) {
				sym(m[2])
			}
			for _, re := range []*regexp.Regexp{reServerStart, reServerExit} {
				for _, m := range re.FindAllStringSubmatch(e.Text, -1) {
					sym(m[1])
				}
			}
		case strings.HasPrefix(e.What, "cmd "):
			out, _, _ := strings.Cut(e.Text, "\nstderr")
			out, _ = strconv.Unquote(strings.TrimPrefix(out, "stdout "))
			for _, m := range reListed.FindAllStringSubmatch(out, -1) {
				if isPidLike(m[1]) {
					sym(m[1])
				}
			}
		}
	}
	pidRe := regexp.MustCompile(`\b\d{2,7}\b`)
	out := make(Transcript, 0, len(r.entries))
	for _, e := range r.entries {
		text := strings.ReplaceAll(e.Text, r.dir, "<DIR>")
		text = reTimestamp.ReplaceAllString(text, "[TS $1 $2]")
		text = pidRe.ReplaceAllStringFunc(text, func(s string) string {
			if v, ok := syms[s]; ok {
				return v
			}
			return s
		})
		what := strings.ReplaceAll(e.What, r.dir, "<DIR>")
		if e.What == "control.log" || e.What == "server.log" {
			text = groupByProcess(text)
		}
		out = append(out, Entry{What: what, Text: text})
	}
	return out
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// isPidLike accepts numbers in the kernel's pid range; get_server_list prints
// nothing else, and a number that is not a pid is left alone by the caller.
func isPidLike(s string) bool { n := atoi(s); return n > 1 && n < 1<<22 }

var reLogProc = regexp.MustCompile(`^\[TS (\w+ \S+)\]`)

func groupByProcess(log string) string {
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	sort.SliceStable(lines, func(i, j int) bool { return procKey(lines[i]) < procKey(lines[j]) })
	return strings.Join(closeUIEarly(lines), "\n") + "\n"
}

// reAsync matches lines the daemon logs for server events, which race with
// the "UI closed" of the command that caused them (shutdown_server -f, quit):
// NVIDIA's daemon logs either order.
var reAsync = regexp.MustCompile(`\] (Server \S+ exited with status|Removed Shm file at|Starting new server )`)

// closeUIEarly moves each "UI closed" above the server-event lines just
// before it, so both orders of that race read the same. It only reorders
// lines of one process and never drops one.
func closeUIEarly(lines []string) []string {
	for i := range lines {
		if !strings.HasSuffix(lines[i], "] UI closed") {
			continue
		}
		for j := i; j > 0 && reAsync.MatchString(lines[j-1]) && procKey(lines[j-1]) == procKey(lines[j]); j-- {
			lines[j-1], lines[j] = lines[j], lines[j-1]
		}
	}
	return lines
}

// procKey is the process a normalised log line belongs to.
func procKey(l string) string {
	if m := reLogProc.FindStringSubmatch(l); m != nil {
		return m[1]
	}
	return ""
}

// String renders the transcript for people (and for dumps to compare by eye).
func (tr Transcript) String() string {
	var b strings.Builder
	for i, e := range tr {
		fmt.Fprintf(&b, "## %d %s\n%s\n", i+1, e.What, e.Text)
	}
	return b.String()
}

// Result of comparing two transcripts.
type Result struct {
	Identical bool
	// Diff describes the first difference.
	Diff string
}

// Compare compares a real daemon's transcript with the emulator's.
func Compare(real, emu Transcript) Result {
	res := Result{Identical: true}
	n := max(len(real), len(emu))
	for i := 0; i < n; i++ {
		var a, b Entry
		if i < len(real) {
			a = real[i]
		}
		if i < len(emu) {
			b = emu[i]
		}
		if a == b {
			continue
		}
		res.Identical = false
		res.Diff = fmt.Sprintf("step %d %q:\n--- real\n%s\n--- emulator (%q)\n%s", i+1, a.What, a.Text, b.What, b.Text)
		return res
	}
	return res
}
