package mpsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// Sentinel errors of the daemon.
var (
	// ErrConfig: the config file cannot be used; the daemon did not start.
	ErrConfig = errors.New("mpsd: invalid config")
	// ErrSocketInUse: another mpsd answers on the API socket.
	ErrSocketInUse = errors.New("mpsd: API socket in use")
)

// DefaultReconnectGrace is how long a lease re-adopted after a restart
// waits for its launcher to reconnect before it is released (its
// processes killed). Launchers retry for a minute (launcher's
// DefaultReconnectTimeout), so this outlasts them.
const DefaultReconnectGrace = 90 * time.Second

// Options configure a Daemon. Only ConfigPath is required; the rest are
// the seams tests and the command line use.
type Options struct {
	// ConfigPath is the YAML config (DESIGN.md §9), watched for edits.
	ConfigPath string
	// Simulate runs on go-nvml mock GPUs described by the config's
	// simulate section, with the MPS emulator's programs instead of
	// NVIDIA's (found in simulate.emulator_dir, next to the mpsd binary
	// or in bin/emu).
	Simulate bool
	// NVML overrides the NVML library (tests); nil means nvml.New(), or
	// the simulated one.
	NVML nvml.Interface
	// Users resolves names in the config; nil means the host's database.
	Users policy.Users
	// Cgroup chooses the cgroup backend and mounts; its Parent is taken
	// from the config.
	Cgroup cgroup.Config
	// Listener is the API socket when it is passed in (systemd socket
	// activation, tests); nil means listen on the config's socket.
	Listener net.Listener
	// PrivateShm, when set, reports whether a group's control daemons
	// run with a private /dev/shm (Layout.ShmDir, mps.PrivateShm): the
	// groups the kubelet device plugin serves, whose pods get that
	// directory as their /dev/shm. Clients on the host outside those pods
	// would no longer share memory with such a server.
	PrivateShm func(group string) bool
	// MetricsListener serves /metrics, /healthz and /readyz when given
	// (tests); nil means listen on metrics.listen, if it is set.
	MetricsListener net.Listener
	// ProcRoot is where /proc is mounted; default /proc.
	ProcRoot string
	// ReconnectGrace: see DefaultReconnectGrace.
	ReconnectGrace time.Duration
	// RequestTimeout bounds reading a request's headers and body, so a
	// slow or stuck client holds only its own connection; default 10s.
	RequestTimeout time.Duration
	// Logger receives the daemon's log; nil discards it.
	Logger *slog.Logger
	// Ready, if set, is called once, when the socket is served and every
	// instance is up (systemd's READY=1).
	Ready func()

	// faultHook, when set (tests, benchmarks), sees every fault as it is
	// reported.
	faultHook func(*instance, fault)
	// wrapCgroups, when set (tests), wraps the cgroup manager Run makes.
	wrapCgroups func(cgroup.Manager) cgroup.Manager
	// killRetryInitial, when set (tests), replaces killRetryInitial.
	killRetryInitial time.Duration
	// mpsRunner, when set (tests), starts every MPS control command.
	mpsRunner mps.Runner
	// attachSwap, when set (tests), is called in an attach after the pid's
	// checks and before the move, and returns the pid the move then
	// names: a stand-in for the pid being reused in between.
	attachSwap func(pid int) int
}

// Daemon is mpsd: one per host.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	host    *gpu.Host
	sim     *gpu.Sim
	watcher *policy.Watcher
	layout  Layout
	cg      cgroup.Manager
	// cgCfg is the cgroup backend New checked; Run makes the manager
	// once it knows the instance id (nil: cgroups are disabled).
	cgCfg *cgroup.Config
	// instanceID names this mpsd (its state directory) among the users
	// of one cgroup parent: its lease cgroups are <parent>/<id>/...
	instanceID string
	mpsBase    mps.Config // control path and environment shared by every instance
	proc       string
	store      *store
	ln         net.Listener
	srv        *http.Server

	// ctx is the daemon's life. Every goroutine started on its behalf
	// (instance starts, lease releases, event readers, API handlers) goes
	// through spawn or enter, which refuse once Run has begun waiting.
	ctx     context.Context
	cancel  context.CancelFunc
	gmu     sync.Mutex
	gclosed bool
	wg      sync.WaitGroup

	// stopping is closed when Run begins to stop, before connections
	// close, so lease handlers tell mpsd's own stop (keep the lease) from
	// a launcher going away (release it).
	stopping chan struct{}
	serving  atomic.Bool
	// crashStop (tests): stop as a SIGKILL would leave things: no state
	// write once asked to stop, no final snapshot.
	crashStop atomic.Bool
	ready     atomic.Bool // every instance was up once (READY=1, /readyz)
	metrics   *metrics
	res       *resources // connection caps, mpsd's own exhaustion

	mu        sync.Mutex
	cfg       *policy.Config
	instances map[string]*instance
	xidAt     map[int]time.Time   // GPU index → its last Xid (verify.go)
	queues    map[string][]*lease // queued leases per group, arrival order
	leases    map[string]*lease   // every lease, queued or running
	seq       uint64
}

// New loads the config, takes the GPU inventory and prepares the cgroup
// backend. It starts nothing; Run does.
func New(opts Options) (*Daemon, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 10 * time.Second
	}
	if opts.ReconnectGrace <= 0 {
		opts.ReconnectGrace = DefaultReconnectGrace
	}
	d := &Daemon{opts: opts, log: log, proc: opts.ProcRoot, stopping: make(chan struct{}), res: newResources(log)}

	// The simulate section decides the GPUs, which the full check needs:
	// read the file once without them first.
	pre, err := policy.LoadFile(opts.ConfigPath, policy.Host{Users: opts.Users})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	lib := opts.NVML
	if lib == nil && opts.Simulate {
		d.sim, err = gpu.NewSim(gpu.SimSpec{GPUs: pre.Simulate.GPUs, Model: pre.Simulate.Model})
		if err != nil {
			return nil, fmt.Errorf("%w: simulate: %w", ErrConfig, err)
		}
		lib = d.sim.NVML()
	}
	if lib == nil {
		lib = nvml.New()
	}
	d.host, err = gpu.New(lib, log.With("component", "gpu"))
	if err != nil {
		return nil, fmt.Errorf("GPU inventory: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = d.host.Close()
		}
	}()

	d.metrics = newMetrics(d)
	d.watcher, err = policy.NewWatcher(opts.ConfigPath, policy.Host{GPUs: policyGPUs(d.host.GPUs()), Users: opts.Users}, policy.WatchOptions{OnReload: d.onReload})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg := d.watcher.Config()
	// mpsd writes these directories as root: refuse ones that anyone else
	// could change (or replace) before a byte is written.
	if err := policy.CheckDirs(cfg, os.Geteuid()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.setConfigLocked(cfg)
	d.layout = Layout{RunDir: cfg.RunDir, LogDir: cfg.LogDir, StateDir: cfg.StateDir}

	d.mpsBase, err = mpsBase(cfg, opts.Simulate)
	if err != nil {
		return nil, err
	}
	d.mpsBase.Runner = opts.mpsRunner
	if d.sim != nil {
		// The emulated daemons behave as the simulated driver's do
		// (MPSEMU_DRIVER, passed through, still overrides).
		d.mpsBase.Env = append(d.mpsBase.Env, gpu.EnvXidSocket+"="+d.simXidSocket(), gpu.EnvDriverVersion+"="+d.sim.DriverVersion())
	}
	if cfg.Cgroup.Enabled {
		cc := opts.Cgroup
		cc.Parent = cfg.Cgroup.Parent
		cc.Logger = log.With("component", "cgroup")
		// Checked now, made by Run under this mpsd's instance id.
		if _, err := cgroup.New(cc); err != nil {
			return nil, fmt.Errorf("cgroups (set cgroup.enabled: false to run without isolation): %w", err)
		}
		d.cgCfg = &cc
	} else {
		d.cg = cgroup.NewDisabled(log)
	}
	d.store = newStore(d.layout.StateFile(), d.snapshot, log)
	ok = true
	return d, nil
}

// simXidSocket is where the simulated GPUs hear the emulated daemons'
// Xid reports.
func (d *Daemon) simXidSocket() string { return filepath.Join(d.layout.StateDir, "sim-xid.sock") }

// Sim returns the simulated GPUs when the daemon runs with Simulate, else
// nil: tests and `mpsctl inject-xid` raise faults through it.
func (d *Daemon) Sim() *gpu.Sim { return d.sim }

// mpsBase resolves the control program and the daemons' environment.
// Simulation only changes where the programs are found: the emulator's
// directory goes first on the daemons' PATH, so the control daemon starts
// the emulated server exactly as NVIDIA's starts the real one.
func mpsBase(cfg *policy.Config, simulate bool) (mps.Config, error) {
	control, path := cfg.MPS.Control, cfg.MPS.Path
	if simulate {
		dir, err := emulatorDir(cfg.Simulate.EmulatorDir)
		if err != nil {
			return mps.Config{}, err
		}
		control = filepath.Join(dir, mps.DefaultControl)
		path = dir + ":" + path
	}
	env := []string{"PATH=" + path}
	// Locale, home, the library path (a container may reach libcuda only
	// through it) and the emulator's knobs pass through; nothing else of
	// mpsd's environment reaches the daemons, so a server never depends on
	// how mpsd itself was started.
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "HOME", k == "LANG", k == "TZ", k == "LD_LIBRARY_PATH", strings.HasPrefix(k, "LC_"), strings.HasPrefix(k, "MPSEMU_"):
			env = append(env, kv)
		}
	}
	return mps.Config{ControlPath: control, Env: env}, nil
}

// emulatorDir finds the emulator's programs: the configured directory,
// else next to the mpsd binary (or in its emu/ subdirectory, as make
// build lays them out), else bin/emu under the working directory.
func emulatorDir(configured string) (string, error) {
	var tried []string
	has := func(dir string) bool {
		tried = append(tried, dir)
		st, err := os.Stat(filepath.Join(dir, mps.DefaultControl))
		return err == nil && !st.IsDir()
	}
	if configured != "" {
		if has(configured) {
			return filepath.Abs(configured)
		}
		return "", fmt.Errorf("%w: simulate.emulator_dir %s has no %s", ErrConfig, configured, mps.DefaultControl)
	}
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		for _, c := range []string{dir, filepath.Join(dir, "emu")} {
			if has(c) {
				return c, nil
			}
		}
	}
	if has("bin/emu") {
		return filepath.Abs("bin/emu")
	}
	return "", fmt.Errorf("%w: no MPS emulator found for --simulate (looked in %s); run make build or set simulate.emulator_dir", ErrConfig, strings.Join(tried, ", "))
}

func policyGPUs(inv []gpu.Info) []policy.GPU {
	out := make([]policy.GPU, len(inv))
	for i, g := range inv {
		out[i] = policy.GPU{Index: g.Index, UUID: g.UUID, Memory: int64(g.MemoryTotalBytes)}
	}
	return out
}

// Run starts or re-adopts the instances and the leases of the persisted
// state, serves the API and watches the config until ctx ends. Stopping
// kills nothing: MPS daemons, servers and workloads run on, and the next
// mpsd adopts them.
func (d *Daemon) Run(ctx context.Context) error {
	d.ctx, d.cancel = context.WithCancel(context.Background())
	defer d.cancel()
	defer func() { _ = d.host.Close() }()

	if err := d.layout.makeDirs(); err != nil {
		return err
	}
	// Checked again now that they exist: one made by someone else between
	// New's check and here is refused, not adopted.
	if err := policy.CheckDirs(d.cfg, os.Geteuid()); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := d.openCgroups(); err != nil {
		return err
	}
	if d.sim != nil {
		// The emulated daemons report their clients' faults as the
		// driver reports Xids; mpsd's root-only state directory keeps
		// the socket from tenants (ServeXidReports also checks the uid).
		stop, err := d.sim.ServeXidReports(d.simXidSocket(), d.log.With("component", "sim"))
		if err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		defer stop()
	}
	_, statErr := os.Lstat(d.layout.StateFile())
	saved, err := d.store.load()
	// Only a state file that is there and read proves which of the lease
	// cgroups under this mpsd's id are leftovers.
	stateKnown := statErr == nil && err == nil
	if err != nil {
		// A state file that cannot be read must not stop the host's GPUs
		// from being served; it is kept aside for a person to look at.
		d.log.Error("persisted state unreadable; starting without it", "err", err)
	}

	ln := d.opts.Listener
	if ln == nil {
		ln, err = listen(d.cfg.Socket)
		if err != nil {
			return err
		}
	}
	d.ln = ln

	d.mu.Lock()
	d.instances = map[string]*instance{}
	d.queues = map[string][]*lease{}
	d.leases = map[string]*lease{}
	d.reconcileLocked(d.cfg)
	insts := d.instanceList()
	d.mu.Unlock()

	if err := d.prepareGroupDirs(d.cfg); err != nil {
		_ = ln.Close()
		return err
	}
	if d.cfg.MPS.ComputeMode == policy.ComputeExclusiveProcess {
		// Only the MPS server may then open a context: no CUDA program
		// can bypass MPS and its limits. Host.Close puts the modes back.
		var idx []int
		for _, in := range insts {
			idx = append(idx, in.p.GPUs...)
		}
		slices.Sort(idx)
		if err := d.host.SetExclusive(slices.Compact(idx)); err != nil {
			d.log.Error("set EXCLUSIVE_PROCESS compute mode", "err", err)
		}
	}
	d.adoptLeases(saved, stateKnown)
	// Instances come up (or are adopted) in parallel. The API is served
	// once each has had its first try: one that fails keeps retrying in
	// the background while the others take clients.
	// Xid events come from NVML's event set; a host whose GPUs cannot
	// deliver them is told about once, and MPS's own signals remain. The
	// GPUs are registered before the instances come up: an Xid is what
	// confirms an MPS fault record (verify.go), and one raised before the
	// registration would be lost.
	xidRegistered := make(chan struct{})
	d.spawn(func() {
		if err := d.host.WatchXidThen(d.ctx, d.onXid, func() { close(xidRegistered) }); err != nil {
			d.log.Warn("no Xid events; GPU faults are seen only through MPS", "err", err)
		}
	})
	select {
	case <-xidRegistered:
	case <-time.After(10 * time.Second):
		d.log.Warn("the GPUs' Xid events are not registered after 10s; starting the instances anyway")
	}
	for _, in := range insts {
		d.spawn(func() { d.bringUp(in, true) })
	}
	firstTry := time.After(2 * time.Minute)
	for _, in := range insts {
		select {
		case <-in.tried:
		case <-firstTry:
		case <-ctx.Done():
		}
	}

	d.spawn(func() { d.store.run(d.ctx) })
	d.spawn(d.probeLoop)
	watchErr := make(chan error, 1)
	d.spawn(func() { watchErr <- d.watcher.Run(d.ctx) })
	var msrv *http.Server
	if mln := d.opts.MetricsListener; mln != nil || d.cfg.Metrics.Listen != "" {
		if mln == nil {
			if mln, err = net.Listen("tcp", d.cfg.Metrics.Listen); err != nil {
				_ = ln.Close()
				return fmt.Errorf("metrics listener (metrics.listen %s): %w", d.cfg.Metrics.Listen, err)
			}
		}
		msrv = d.serveMetrics(mln)
		d.log.Info("metrics served", "address", mln.Addr().String())
	}
	d.srv = d.newHTTPServer()
	serveErr := make(chan error, 1)
	lln := d.limitListener(ln, listenerAPI)
	go func() { serveErr <- d.srv.Serve(lln) }()
	d.serving.Store(true)
	d.log.Info("mpsd serving", "socket", ln.Addr().String(), "instances", len(insts), "leases", len(saved.Leases))
	d.spawn(d.announceReady)

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("serve API: %w", err)
	}
	crash := d.crashStop.Load()
	if crash {
		d.store.freeze()
	}
	d.log.Info("mpsd stopping; MPS daemons and workloads keep running", "as_if_killed", crash)
	d.serving.Store(false)
	close(d.stopping)
	_ = d.srv.Close()
	if msrv != nil {
		_ = msrv.Close()
	}
	if runErr == nil {
		<-serveErr
	}
	d.cancel()
	// Closing the handles (not the daemons) ends their event readers.
	d.mu.Lock()
	for _, in := range d.instances {
		if in.daemon != nil {
			_ = in.daemon.Close()
		}
	}
	for _, l := range d.leases {
		if l.grace != nil {
			l.grace.Stop()
		}
	}
	d.mu.Unlock()
	d.gmu.Lock()
	d.gclosed = true
	d.gmu.Unlock()
	d.wg.Wait()
	select {
	case err := <-watchErr:
		if err != nil {
			d.log.Warn("config watch ended", "err", err)
		}
	default:
	}
	if !crash {
		d.store.request()
		if err := d.store.flush(); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	d.log.Info("mpsd stopped")
	return runErr
}

// announceReady calls Options.Ready once every instance is up.
func (d *Daemon) announceReady() {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		d.mu.Lock()
		up := true
		for _, in := range d.instances {
			up = up && in.up
		}
		d.mu.Unlock()
		if up {
			d.ready.Store(true)
			d.log.Info("mpsd ready: every instance is up")
			if d.opts.Ready != nil {
				d.opts.Ready()
			}
			return
		}
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Summary is a one-line account of the daemon for systemd's STATUS= and
// logs: instances by state, leases running and queued.
func (d *Daemon) Summary() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	states := map[string]int{}
	for _, in := range d.instances {
		states[in.p.State.String()]++
	}
	var parts []string
	for _, st := range []string{"ready", "starting", "recovering", "draining", "quarantined"} {
		if n := states[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	running, queued := 0, 0
	for _, l := range d.leases {
		if l.running() {
			running++
		} else {
			queued++
		}
	}
	inst := "no instances"
	if len(parts) > 0 {
		inst = "instances: " + strings.Join(parts, ", ")
	}
	return fmt.Sprintf("%s; leases: %d running, %d queued", inst, running, queued)
}

// Healthy reports whether the daemon's core works: its state lock can be
// taken and it is serving, within ctx. systemd's watchdog pings only while
// it holds, so a deadlocked daemon is restarted (and, with
// KillMode=process, re-adopts everything).
func (d *Daemon) Healthy(ctx context.Context) error {
	ok := make(chan struct{})
	go func() {
		d.mu.Lock()
		// Something every admission decision reads, so the lock is not
		// merely taken but the state behind it is reachable.
		_ = len(d.instances)
		d.mu.Unlock()
		close(ok)
	}()
	select {
	case <-ok:
	case <-ctx.Done():
		return fmt.Errorf("mpsd: state lock not taken within the deadline: %w", ctx.Err())
	}
	select {
	case <-d.stopping:
		return errors.New("mpsd: stopping")
	default:
	}
	if !d.serving.Load() {
		return errors.New("mpsd: not serving")
	}
	return nil
}

// spawn runs f in a goroutine Run waits for; after Run has begun its final
// wait it runs nothing and reports false.
func (d *Daemon) spawn(f func()) bool {
	if !d.enter() {
		return false
	}
	go func() {
		defer d.leave()
		f()
	}()
	return true
}

func (d *Daemon) enter() bool {
	d.gmu.Lock()
	defer d.gmu.Unlock()
	if d.gclosed {
		return false
	}
	d.wg.Add(1)
	return true
}

func (d *Daemon) leave() { d.wg.Done() }

// listen opens the API socket: mode 0666 because authorization is by peer
// credentials. A stale socket file is replaced; a live one is an error.
func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("%w: %s answers; is another mpsd running?", ErrSocketInUse, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// setConfigLocked puts cfg in force.
func (d *Daemon) setConfigLocked(cfg *policy.Config) {
	d.cfg = cfg
	d.res.apply(cfg.Limits)
	d.metrics.groupsChangedLocked(cfg)
}

// prepareGroupDirs (re)writes the ACLs of every group's run and log
// directories.
func (d *Daemon) prepareGroupDirs(cfg *policy.Config) error {
	for _, g := range cfg.Groups {
		uids, gids, _ := cfg.Access.Members(g.Name)
		// The log directories too: control.log names the group's users,
		// pids and limits, which are none of another tenant's business.
		for _, dir := range []string{d.layout.GroupRunDir(g.Name), d.layout.GroupLogDir(g.Name)} {
			if err := prepareGroupDir(dir, uids, gids); err != nil {
				return fmt.Errorf("group %s: %w", g.Name, err)
			}
		}
	}
	return nil
}
