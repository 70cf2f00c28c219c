package mps

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Capabilities are what this daemon's driver generation offers, detected at
// start or adoption.
type Capabilities struct {
	// PIDFile: the daemon writes nvidia-cuda-mps-control.pid (550+).
	PIDFile bool
	// ServerStatus: get_server_status exists (550+); without it
	// ServerStatus infers the state from get_server_list and control.log.
	ServerStatus bool
}

// Daemon is a handle on one running control daemon. Its methods are safe for
// concurrent use. Close releases the handle (watchers, event stream) without
// touching the daemon; Stop stops the daemon.
type Daemon struct {
	cfg       Config
	log       *slog.Logger
	pid       int
	foundBy   string
	caps      Capabilities
	clientEnv []string

	stopFD    int
	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	events    *eventQueue
	// serverLogStart is where the follower began reading server.log;
	// serverLogEnd its size then: lines before it were written while no
	// handle watched (see WrittenUnwatched).
	serverLogStart int64
	serverLogEnd   int64
	daemon         *proc
	exitedCh       chan struct{} // closed when the daemon process is gone

	// id is the daemon's identity, verified at start or adoption.
	id DaemonIdentity

	mu        sync.Mutex
	closed    bool
	servers   map[int]*proc // verified servers, watched through their pidfds
	verifying map[int]chan struct{}
	// The rate limit of UnverifiedRecord events (watch.go).
	unverifiedTokens     float64
	unverifiedAt         time.Time
	unverifiedSuppressed int
	// exited: when each verified server's pidfd told of its exit.
	exited         map[int]time.Time
	ready          map[int]bool
	lastExitStatus int
	// echo: whether control.log carries the probes back (loglive.go).
	echo logEcho
	// binaryVersion: the version line the daemon logged at its start
	// (version.go), 0 until read or when it logs none.
	binaryVersion int
}

// startWaitDelay bounds how long a finished control process may hold the
// output pipes (a forked daemon inheriting them) before Wait gives up on them.
const startWaitDelay = 200 * time.Millisecond

// Start starts a control daemon (`-d`) for cfg and returns once it answers a
// probe and cfg's defaults are applied. ctx bounds the start only; the handle
// lives until Close. Stale pipe-directory files are removed first, but only
// when no verified daemon owns them: if one does, Start returns
// ErrAlreadyRunning (use Adopt). A lock on control_lock held by any other
// process (a local user can take it on a dead daemon's file) does not stop
// it: the files are taken as stale, that process is logged and left alone.
// If applying defaults fails the new daemon is killed. The new daemon's
// identity is Daemon.Identity.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	for _, dir := range []string{cfg.LogDir, cfg.PipeDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("mps: start: create %s: %w", dir, err)
		}
	}
	fd, id, holder, err := lockedDaemon(cfg, nil)
	switch {
	case err == nil:
		unix.Close(fd)
		return nil, fmt.Errorf("%w: pid %d (holds %s) on %s", ErrAlreadyRunning, id.PID, lockFileName, cfg.PipeDir)
	case errors.Is(err, ErrUnverifiedDaemon):
		cfg.Logger.Warn("mps: control_lock is held by a process that is no verified control daemon; taking the pipe directory's files as stale (that process is not touched)",
			"pipe_dir", cfg.PipeDir, "pid", holder, "reason", err)
	case !errors.Is(err, ErrNoDaemon):
		return nil, fmt.Errorf("mps: start: %w", err)
	}
	if err := removeStale(cfg.PipeDir); err != nil {
		return nil, err
	}
	var logOff int64
	if fi, err := os.Stat(filepath.Join(cfg.LogDir, controlLog)); err == nil {
		logOff = fi.Size()
	}

	args := []string{"-d"}
	if cfg.Multiuser {
		args = append(args, "-multiuser-server")
	}
	cmd := exec.CommandContext(ctx, cfg.ControlPath, args...)
	cmd.Env = daemonEnv(cfg)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = startWaitDelay
	if err := cfg.Runner.Start(cmd); err != nil {
		return nil, localResources(fmt.Errorf("mps: start %s on %s: %w", cfg.ControlPath, cfg.PipeDir, err))
	}
	if err := cmd.Wait(); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("mps: start on %s: %w: %w", cfg.PipeDir, ErrTimeout, ctx.Err())
		}
		if strings.Contains(out.String(), "already running") {
			return nil, fmt.Errorf("%w: %s on %s", ErrAlreadyRunning, strings.TrimSpace(out.String()), cfg.PipeDir)
		}
		return nil, fmt.Errorf("mps: start %s -d on %s: %w (output %q)", cfg.ControlPath, cfg.PipeDir, err, strings.TrimSpace(out.String()))
	}

	// The parent exits once the daemon listens; the lock may lag a moment
	// behind.
	fd, id, err = waitDaemon(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d, err := attach(ctx, cfg, fd, id, lockFileName, logOff, false, true, true)
	if err != nil {
		return nil, err
	}
	if err := d.applyDefaults(ctx); err != nil {
		d.daemon.signal(unix.SIGKILL)
		d.Close()
		return nil, err
	}
	d.log.Info("mps: control daemon started", "pid", id.PID, "start_time", id.StartTime, "pid_file", d.caps.PIDFile, "server_status", d.caps.ServerStatus)
	return d, nil
}

// Adopt attaches to a daemon already running on cfg.PipeDir, e.g. after
// mpsd restarted: the holder of the lock on control_lock, verified through
// a pidfd (it runs cfg.ControlPath, as root or this process's uid), and
// exactly cfg.Expect when that is set; then probed. It disturbs no server
// or client. Returns an error wrapping ErrNoDaemon when none runs, with
// ErrUnverifiedDaemon too when the lock holder is not such a daemon (or
// not the expected one).
func Adopt(ctx context.Context, cfg Config) (*Daemon, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	fd, id, _, err := lockedDaemon(cfg, cfg.Expect)
	if err != nil {
		return nil, fmt.Errorf("mps: adopt: %w", err)
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mps: adopt: create %s: %w", cfg.LogDir, err)
	}
	var logOff int64
	if fi, err := os.Stat(filepath.Join(cfg.LogDir, controlLog)); err == nil {
		logOff = fi.Size()
	}
	d, err := attach(ctx, cfg, fd, id, lockFileName, logOff, true, true, false)
	if err != nil {
		return nil, err
	}
	d.log.Info("mps: control daemon adopted", "pid", id.PID, "start_time", id.StartTime, "expected", cfg.Expect != nil)
	return d, nil
}

// Reclaim stops the control daemon on cfg.PipeDir that Adopt could not
// take over because it does not answer (stopped, hung), with Stop's
// escalation (its verified servers included), so a new one can be started
// there. It finds and verifies the daemon as Adopt does (cfg.Expect
// included) and signals nothing else. Returns an error wrapping
// ErrNoDaemon when no verified daemon runs.
func Reclaim(ctx context.Context, cfg Config) (StopReport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return StopReport{}, err
	}
	fd, id, _, err := lockedDaemon(cfg, cfg.Expect)
	if err != nil {
		return StopReport{}, fmt.Errorf("mps: reclaim: %w", err)
	}
	var logOff int64
	if fi, err := os.Stat(filepath.Join(cfg.LogDir, controlLog)); err == nil {
		logOff = fi.Size()
	}
	d, err := attach(ctx, cfg, fd, id, lockFileName, logOff, true, false, false)
	if err != nil {
		return StopReport{}, err
	}
	defer d.Close()
	d.log.Warn("mps: reclaiming a control daemon that does not answer", "pid", id.PID, "start_time", id.StartTime)
	return d.Stop(ctx)
}

func daemonEnv(cfg Config) []string {
	env := setEnv(cfg.Env, "CUDA_MPS_PIPE_DIRECTORY", cfg.PipeDir)
	env = setEnv(env, "CUDA_MPS_LOG_DIRECTORY", cfg.LogDir)
	if len(cfg.VisibleDevices) > 0 {
		env = setEnv(env, "CUDA_VISIBLE_DEVICES", strings.Join(cfg.VisibleDevices, ","))
	}
	return env
}

// removeStale deletes a dead daemon's pipe-directory files; the caller
// made sure no verified daemon owns them.
func removeStale(pipeDir string) error {
	for _, name := range staleFiles {
		p := filepath.Join(pipeDir, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("mps: start: remove stale %s: %w", p, err)
		}
	}
	return nil
}

// waitDaemon waits for the daemon just started to take control_lock and
// returns its verified pidfd and identity.
func waitDaemon(ctx context.Context, cfg Config) (int, DaemonIdentity, error) {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		fd, id, _, err := lockedDaemon(cfg, nil)
		if err == nil {
			return fd, id, nil
		}
		if errors.Is(err, ErrLocalResources) {
			return -1, DaemonIdentity{}, err
		}
		last = err
		select {
		case <-ctx.Done():
			return -1, DaemonIdentity{}, fmt.Errorf("mps: start on %s: no verified daemon holds %s (%v): %w: %w", cfg.PipeDir, lockFileName, last, ErrTimeout, ctx.Err())
		case <-t.C:
		}
	}
}

func killPID(pid int) {
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
	}
}

// attach builds the handle on the verified daemon behind pidfd fd (owned
// from now on): watchers first (so nothing is missed), then a probe and
// capability detection. killOnFail: a failure kills the daemon (Start's).
func attach(ctx context.Context, cfg Config, fd int, id DaemonIdentity, how string, logOff int64, adopted, probe, killOnFail bool) (*Daemon, error) {
	stopFD, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		if killOnFail {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		unix.Close(fd)
		return nil, localResources(fmt.Errorf("mps: eventfd: %w", err))
	}
	log := cfg.Logger.With("pipe_dir", cfg.PipeDir)
	pid := id.PID
	d := &Daemon{
		cfg:              cfg,
		log:              log,
		pid:              pid,
		id:               id,
		foundBy:          how,
		clientEnv:        setEnv(cfg.Env, "CUDA_MPS_PIPE_DIRECTORY", cfg.PipeDir),
		stopFD:           stopFD,
		stop:             make(chan struct{}),
		events:           newEventQueue(log),
		exitedCh:         make(chan struct{}),
		servers:          map[int]*proc{},
		verifying:        map[int]chan struct{}{},
		exited:           map[int]time.Time{},
		ready:            map[int]bool{},
		lastExitStatus:   -1,
		unverifiedTokens: unverifiedBurst,
		unverifiedAt:     time.Now(),
	}
	d.wg.Add(1)
	go func() { defer d.wg.Done(); d.events.run(d.stop) }()

	d.daemon = d.watchFD(pid, fd, nil, func(p *proc) {
		d.mu.Lock()
		status := p.status
		if status < 0 && p.sig == 0 {
			status = d.lastExitStatus
		}
		d.mu.Unlock()
		close(d.exitedCh)
		d.events.push(Event{Kind: DaemonExited, Time: time.Now(), PID: p.pid, UID: -1, ExitStatus: status, Signal: p.sig, Source: SourcePidfd})
	})
	fail := func(err error) (*Daemon, error) {
		if killOnFail {
			d.daemon.signal(unix.SIGKILL)
		}
		d.Close()
		return nil, err
	}

	logPath := filepath.Join(cfg.LogDir, controlLog)
	if adopted && probe {
		// Up to logOff: the follower reads from there on.
		d.loadReady(logPath, pid, logOff)
	}
	ready := make(chan error, 1)
	lf := newLogFollower(logPath, logOff, log, d.onControlLine)
	d.wg.Add(1)
	go func() { defer d.wg.Done(); lf.run(d.stop, ready) }()
	if err := <-ready; err != nil {
		return fail(localResources(err))
	}
	// server.log tells of faults the server survives; only lines written
	// from now on matter (from the offset given, on adoption). Its
	// follower starts after the probe has learned the running servers, so
	// that a fault read again names a server already verified; nothing is
	// missed, the offset is fixed now.
	serverPath := filepath.Join(cfg.LogDir, serverLog)
	var serverOff int64
	if fi, err := os.Stat(serverPath); err == nil {
		serverOff = fi.Size()
		d.serverLogEnd = fi.Size()
		if adopted && cfg.ResumeServerLog {
			serverOff = cfg.ServerLogOffset
			if serverOff < 0 || serverOff > fi.Size() {
				serverOff = 0
			}
		}
	}
	d.serverLogStart = serverOff
	startServerLog := func() error {
		sready := make(chan error, 1)
		sf := newLogFollower(serverPath, serverOff, log, d.onServerLogLine)
		d.wg.Add(1)
		go func() { defer d.wg.Done(); sf.run(d.stop, sready) }()
		return localResources(<-sready)
	}

	if !probe {
		if err := startServerLog(); err != nil {
			return fail(err)
		}
		return d, nil
	}
	// Each call to the daemon gets AnswerTimeout of its own; the
	// handle's own reading between them (server.log since the offset) is
	// not charged to it.
	answer := func() (context.Context, context.CancelFunc) {
		if cfg.AnswerTimeout > 0 {
			return context.WithTimeout(ctx, cfg.AnswerTimeout)
		}
		return ctx, func() {}
	}
	pctx, cancel := answer()
	err = d.probeUntilUp(pctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	if err := startServerLog(); err != nil {
		return fail(err)
	}
	d.caps.PIDFile = fileExists(filepath.Join(cfg.PipeDir, pidFileName))
	pctx, cancel = answer()
	defer cancel()
	if _, err := d.Command(pctx, "get_server_status"); errors.Is(err, ErrUnknownCommand) {
		d.caps.ServerStatus = false
	} else if errors.Is(err, ErrInvalidValue) || err == nil {
		d.caps.ServerStatus = true // "A server PID is required"
	} else {
		return fail(err)
	}
	return d, nil
}

// loadReady marks servers of this daemon that logged Ready before adoption,
// for the ServerStatus fallback on daemons without get_server_status.
//
// The log is read as a stream, a line at a time: it is as long as the
// daemon's life (anyone may write lines to it through the world-writable
// log FIFO), so neither its size nor one long line may decide how much
// memory mpsd takes. A line over maxReadyLine is not a log line the
// daemon wrote and is skipped.
func (d *Daemon) loadReady(logPath string, pid int, end int64) {
	f, err := os.Open(logPath)
	if err != nil {
		return
	}
	defer f.Close()
	mine := false
	// The budget is checked at every read, so no line, however long,
	// outlasts it.
	r := bufio.NewReaderSize(&deadlineReader{r: io.LimitReader(f, end), deadline: time.Now().Add(loadReadyBudget)}, 64<<10)
	for {
		line, err := readBoundedLine(r, maxReadyLine)
		if errors.Is(err, errReadBudget) {
			d.log.Warn("mps: adopt: control log too long to read to its end; servers it told of before are learned from the daemon", "path", logPath, "read_for", loadReadyBudget)
			return
		}
		if err != nil {
			return
		}
		l, ok := ParseLogLine(line)
		if !ok {
			continue
		}
		if strings.HasPrefix(l.Message, "Starting control daemon") {
			mine = l.PID == pid
			clear(d.ready)
			d.binaryVersion = 0
			continue
		}
		if !mine {
			continue
		}
		if v, ok := scanBinaryVersion(l.Message); ok && l.Source == "Control" {
			d.noteBinaryVersion(l.PID, v)
			continue
		}
		if ev, ok := logEvent(l); ok {
			switch ev.Kind {
			case ServerReady:
				d.ready[ev.PID] = true
			case ServerExited:
				delete(d.ready, ev.PID)
			}
		}
	}
}

// maxReadyLine bounds a control.log line loadReady parses;
// loadReadyBudget how long it reads (a variable for tests).
const maxReadyLine = 16 << 10

var loadReadyBudget = 5 * time.Second

// errReadBudget ends a deadlineReader's reading.
var errReadBudget = errors.New("mps: read budget spent")

// deadlineReader reads r until deadline, then fails with errReadBudget.
type deadlineReader struct {
	r        io.Reader
	deadline time.Time
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if time.Now().After(d.deadline) {
		return 0, errReadBudget
	}
	return d.r.Read(p)
}

// readBoundedLine returns r's next line without its newline (and CRs or
// NULs at either end, as the log follower trims them); a line longer than
// limit is skipped whole and returned as "". It returns io.EOF at the end
// (a last line without its newline is dropped: it may still be being
// written).
func readBoundedLine(r *bufio.Reader, limit int) (string, error) {
	var line []byte
	over := false
	for {
		chunk, err := r.ReadSlice('\n')
		switch {
		case err == nil:
			if over || len(line)+len(chunk) > limit+1 {
				return "", nil
			}
			line = append(line, chunk[:len(chunk)-1]...)
			return string(bytes.Trim(line, "\x00\r")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			if !over && len(line)+len(chunk) <= limit {
				line = append(line, chunk...)
			} else {
				over, line = true, nil
			}
		default:
			return "", err
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (d *Daemon) probeUntilUp(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		err := d.Probe(ctx)
		if err == nil || !errors.Is(err, ErrNoDaemon) || d.Exited() {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-t.C:
		}
	}
}

// applyDefaults sets cfg's defaults (setDefaults).
func (d *Daemon) applyDefaults(ctx context.Context) error {
	return d.setDefaults(ctx, d.cfg.DefaultThreadPercentage, d.cfg.DefaultPinnedMem)
}

// SetDefaults sets the daemon's defaults, which the servers it starts
// from now on take: thread percentage p and a pinned memory limit of
// memBytes on each of its devices 0..devices-1.
func (d *Daemon) SetDefaults(ctx context.Context, p float64, memBytes int64, devices int) error {
	if math.IsNaN(p) || !(p > 0 && p <= 100) || devices < 1 || devices > maxServerDevices {
		return &CommandError{Command: "set_default_active_thread_percentage", PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: %v%% on %d devices", ErrInvalidValue, p, devices)}
	}
	mem := make(map[int]int64, devices)
	for dev := range devices {
		mem[dev] = memBytes
	}
	return d.setDefaults(ctx, p, mem)
}

// setDefaults sets the defaults with one call of the control program
// (the daemon answers the commands of one session in order): the thread
// percentage p when > 0, which the daemon echoes with the value it now
// holds (its old one when it refused the new), then the pinned memory
// limit of each device of mem, which print nothing.
func (d *Daemon) setDefaults(ctx context.Context, p float64, mem map[int]int64) error {
	var lines []string
	if p > 0 {
		lines = append(lines, "set_default_active_thread_percentage "+formatPercent(p))
	}
	for _, dev := range slices.Sorted(maps.Keys(mem)) {
		v, err := memValue(dev, mem[dev])
		if err != nil {
			return fmt.Errorf("mps: apply default pinned memory of device %d: %w", dev, &CommandError{Command: "set_default_device_pinned_mem_limit", PipeDir: d.cfg.PipeDir, Err: err})
		}
		lines = append(lines, fmt.Sprintf("set_default_device_pinned_mem_limit %d %s", dev, v))
	}
	if len(lines) == 0 {
		return nil
	}
	out, err := d.commands(ctx, lines...)
	if err != nil {
		return fmt.Errorf("mps: apply defaults: %w", err)
	}
	got := outputLines(out)
	if p > 0 {
		if len(got) == 0 {
			return fmt.Errorf("mps: apply default thread percentage: %w", &CommandError{Command: lines[0], PipeDir: d.cfg.PipeDir, Output: out, Err: fmt.Errorf("%w: no percentage echoed", ErrUnexpectedOutput)})
		}
		held, err := parsePercent(got[0])
		if err != nil {
			return fmt.Errorf("mps: apply default thread percentage: %w", &CommandError{Command: lines[0], PipeDir: d.cfg.PipeDir, Output: out, Err: err})
		}
		if !SamePercent(held, p) {
			return fmt.Errorf("mps: apply default thread percentage: %w", &CommandError{Command: lines[0], PipeDir: d.cfg.PipeDir, Output: got[0], Err: fmt.Errorf("%w: daemon kept %.1f", ErrInvalidValue, held)})
		}
		got = got[1:]
	}
	if len(got) != 0 {
		return fmt.Errorf("mps: apply default pinned memory: %w", &CommandError{Command: strings.Join(lines, "; "), PipeDir: d.cfg.PipeDir, Output: out, Err: ErrUnexpectedOutput})
	}
	return nil
}

// PID is the control daemon's pid.
func (d *Daemon) PID() int { return d.pid }

// Identity is the daemon's pid and start time, verified through a pidfd
// when it was started or adopted. Keep it to pass as Config.Expect to the
// next Adopt (after a restart), so that only this daemon is taken over.
func (d *Daemon) Identity() DaemonIdentity { return d.id }

// PipeDir is the daemon's CUDA_MPS_PIPE_DIRECTORY.
func (d *Daemon) PipeDir() string { return d.cfg.PipeDir }

// Capabilities reports what this daemon's generation offers.
func (d *Daemon) Capabilities() Capabilities { return d.caps }

// Events is the daemon's event stream. It is closed by Close. Events are
// queued (up to 4096, then the oldest are dropped), so a slow reader never
// delays exit detection; read it continuously.
func (d *Daemon) Events() <-chan Event { return d.events.out }

// Exited reports whether the daemon process is gone.
func (d *Daemon) Exited() bool {
	select {
	case <-d.exitedCh:
		return true
	default:
		return false
	}
}

// Done is closed when the daemon process exits.
func (d *Daemon) Done() <-chan struct{} { return d.exitedCh }

// Probe checks that the daemon is alive and answers a command before ctx
// ends: nil, or an error wrapping ErrNoDaemon, ErrDaemonQuitting or
// ErrTimeout (a hung daemon), or ErrLocalResources (this process could not
// start the control client; the daemon's health is unknown, not bad). It
// also learns servers it had not seen yet (verified, see ServerList).
func (d *Daemon) Probe(ctx context.Context) error {
	if d.Exited() {
		return fmt.Errorf("mps: probe %s: daemon pid %d exited: %w", d.cfg.PipeDir, d.pid, ErrNoDaemon)
	}
	d.probeSent(time.Now())
	_, err := d.ServerList(ctx)
	return err
}

// Check is the probe that asks the daemon nothing: it reads the daemon
// process's state under Config.ProcRoot, so NVIDIA's daemon logs nothing
// for it (each control command costs four records in control.log, some
// 220 bytes). It returns nil while the process runs or waits, as a daemon
// serving its pipe does; an error wrapping ErrNoDaemon once it has exited
// (its pidfd said so, or its /proc entry is gone or a zombie's); or one
// wrapping ErrTimeout while it is stopped (SIGSTOP, a tracer), which no
// command could get an answer from. A nil Check says nothing of a daemon
// that runs but no longer answers: only Probe finds that.
func (d *Daemon) Check() error {
	if d.Exited() {
		return fmt.Errorf("mps: check %s: daemon pid %d exited: %w", d.cfg.PipeDir, d.pid, ErrNoDaemon)
	}
	st, err := readProcStat(d.cfg.ProcRoot, d.pid)
	switch {
	case d.Exited() || errors.Is(err, os.ErrNotExist) || err == nil && (st.state == 'Z' || st.state == 'X'):
		return fmt.Errorf("mps: check %s: daemon pid %d exited: %w", d.cfg.PipeDir, d.pid, ErrNoDaemon)
	case err != nil:
		return fmt.Errorf("mps: check %s: daemon pid %d: %w", d.cfg.PipeDir, d.pid, err)
	case st.state == 'T' || st.state == 't':
		return fmt.Errorf("mps: check %s: daemon pid %d is stopped (state %c): %w", d.cfg.PipeDir, d.pid, st.state, ErrTimeout)
	}
	return nil
}

// Barrier queues a Barrier event behind every event found so far and
// returns a channel closed when the reader Acks it, or when the handle is
// closed before delivering it.
func (d *Daemon) Barrier() <-chan struct{} {
	ack := make(chan struct{})
	// A push after finish releases the barrier at once, so a Close racing
	// this call leaves nobody waiting.
	d.events.push(Event{Kind: Barrier, Time: time.Now(), UID: -1, ExitStatus: -1, ack: &barrierAck{ch: ack}})
	return ack
}

// ServerLogStart is where this handle began reading server.log: before it,
// every line was someone else's to handle.
func (d *Daemon) ServerLogStart() int64 { return d.serverLogStart }

// WrittenUnwatched reports whether the server.log line at offset was in
// the file before this handle began following it: written while nobody
// watched the daemon (mpsd was down), so nothing seen live (an Xid, a
// process) can be matched with it any more.
func (d *Daemon) WrittenUnwatched(offset int64) bool { return offset < d.serverLogEnd }

// Close stops the handle's goroutines and closes the event stream. It does
// not stop the daemon (a restarted mpsd adopts it). Idempotent.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		d.mu.Unlock()
		close(d.stop)
		var one [8]byte
		one[0] = 1 // little-endian uint64 1 for the eventfd
		_, _ = unix.Write(d.stopFD, one[:])
		d.wg.Wait()
		d.events.finish()
		unix.Close(d.stopFD)
	})
	return nil
}

// Command sends one raw command line and returns the daemon's output. The
// error is a *CommandError wrapping ErrNoDaemon, ErrDaemonQuitting,
// ErrUnknownCommand, ErrServerNotFound, ErrInvalidValue, ErrPermission or
// ErrTimeout (ctx ended: the client process is killed, so a hung daemon
// never blocks the caller), or ErrLocalResources when this process could
// not start the client at all (out of file descriptors, processes or
// memory: EMFILE, ENFILE, EAGAIN, ENOMEM), which says nothing about the
// daemon and never wraps the others. Prefer the typed methods.
func (d *Daemon) Command(ctx context.Context, line string) (string, error) {
	return d.commands(ctx, line)
}

// commands sends several command lines in one call of the control
// program, which answers them in order (one session reads stdin to EOF);
// the output is theirs together. Errors are Command's, their Command the
// lines joined by "; ".
func (d *Daemon) commands(ctx context.Context, lines ...string) (string, error) {
	line := strings.Join(lines, "; ")
	for _, l := range lines {
		if strings.ContainsAny(l, "\n\r") {
			return "", &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Err: fmt.Errorf("%w: command contains a newline", ErrInvalidValue)}
		}
	}
	select {
	case <-d.stop:
		return "", &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Err: ErrClosed}
	default:
	}
	// Always stdin: 555 rejects commands given as arguments.
	cmd := exec.CommandContext(ctx, d.cfg.ControlPath)
	cmd.Env = d.clientEnv
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = startWaitDelay
	cerr := func(err error) error {
		return &CommandError{Command: line, PipeDir: d.cfg.PipeDir, Output: strings.TrimSpace(stdout.String() + stderr.String()), Err: err}
	}
	if err := d.cfg.Runner.Start(cmd); err != nil {
		if lerr := localResources(err); errors.Is(lerr, ErrLocalResources) {
			// mpsd's own exhaustion (no fd for a pipe, no process): the
			// daemon was never asked, so this is no timeout of it.
			return "", cerr(fmt.Errorf("run %s: %w", d.cfg.ControlPath, lerr))
		}
		if ctx.Err() != nil {
			return "", cerr(fmt.Errorf("%w: %w", ErrTimeout, ctx.Err()))
		}
		return "", cerr(fmt.Errorf("run %s: %w", d.cfg.ControlPath, err))
	}
	err := cmd.Wait()
	if ctx.Err() != nil {
		return "", cerr(fmt.Errorf("%w: %w", ErrTimeout, ctx.Err()))
	}
	if cls := classifyOutput(stdout.String(), stderr.String()); cls != nil {
		return stdout.String(), cerr(cls)
	}
	if err != nil {
		return stdout.String(), cerr(fmt.Errorf("control exited: %w", err))
	}
	return stdout.String(), nil
}

// StopReport says how Stop ended the daemon.
type StopReport struct {
	DaemonPID int
	// Graceful: the daemon exited after `quit -t` without any SIGKILL.
	Graceful bool
	// AlreadyExited: the daemon was gone before Stop.
	AlreadyExited bool
	// KilledServers are the servers Stop SIGKILLed (they ignored SIGINT, or
	// were orphaned by a dead daemon).
	KilledServers []int
	// KilledDaemon: the daemon itself had to be SIGKILLed.
	KilledDaemon bool
}

// Escalation waits in Stop after `quit -t N`'s N seconds.
const (
	quitGrace     = 500 * time.Millisecond
	afterKillWait = 500 * time.Millisecond
	daemonKillMax = 2 * time.Second
)

// Stop stops the daemon: `quit -t N` (N = QuitTimeout), then SIGKILL of
// servers that ignored the daemon's SIGINT, then SIGKILL of the daemon, then
// of orphaned servers. It is bounded by QuitTimeout plus a few seconds, or by
// ctx, whichever is shorter (a dead ctx escalates at once). The handle stays
// open (Events still delivers the exits); call Close afterwards.
func (d *Daemon) Stop(ctx context.Context) (StopReport, error) {
	rep := StopReport{DaemonPID: d.pid}
	if d.Exited() {
		rep.AlreadyExited = true
		rep.KilledServers = d.killServers()
		return rep, nil
	}
	// Learn servers not yet seen in the log, briefly: a hung daemon must not
	// delay the stop.
	lctx, lcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, _ = d.ServerList(lctx)
	lcancel()

	secs := int(math.Ceil(d.cfg.QuitTimeout.Seconds()))
	qctx, qcancel := context.WithCancel(ctx)
	quitDone := make(chan error, 1)
	go func() {
		_, err := d.Command(qctx, "quit -t "+strconv.Itoa(secs))
		quitDone <- err
	}()
	defer func() { qcancel(); <-quitDone }()

	if d.waitExit(ctx, time.Duration(secs)*time.Second+quitGrace) {
		rep.Graceful = true
		return rep, nil
	}
	rep.KilledServers = d.killServers()
	if len(rep.KilledServers) > 0 && d.waitExit(ctx, afterKillWait) {
		return rep, nil
	}
	rep.KilledDaemon = d.daemon.signal(unix.SIGKILL)
	// SIGKILL is not ignorable; the bound only covers a broken kernel or D state.
	kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), daemonKillMax)
	defer kcancel()
	if !d.waitExit(kctx, daemonKillMax) {
		return rep, fmt.Errorf("mps: stop %s: daemon pid %d survived SIGKILL: %w", d.cfg.PipeDir, d.pid, ErrTimeout)
	}
	rep.KilledServers = append(rep.KilledServers, d.killServers()...)
	if ctx.Err() != nil {
		return rep, fmt.Errorf("mps: stop %s: escalated early: %w: %w", d.cfg.PipeDir, ErrTimeout, ctx.Err())
	}
	return rep, nil
}

// waitExit waits up to max (and ctx) for the daemon to exit.
func (d *Daemon) waitExit(ctx context.Context, max time.Duration) bool {
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-d.exitedCh:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return d.Exited()
}

// killServers SIGKILLs every live watched server and waits (briefly) for
// them to go, returning their pids.
func (d *Daemon) killServers() []int {
	var killed []int
	var procs []*proc
	for _, p := range d.liveServers() {
		if p.signal(unix.SIGKILL) {
			killed = append(killed, p.pid)
			procs = append(procs, p)
		}
	}
	t := time.NewTimer(afterKillWait)
	defer t.Stop()
	for _, p := range procs {
		select {
		case <-p.done:
		case <-t.C:
			return killed
		}
	}
	return killed
}
