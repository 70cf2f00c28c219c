package mpsd

import (
	"cmp"
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
	"github.com/mpsd/mpsd/internal/clock"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// Sentinel errors of the daemon.
var (
	// ErrConfig: the config file cannot be used; the daemon did not start.
	ErrConfig = errors.New("mpsd: invalid config")
	// ErrSocketInUse: another mpsd answers on the API socket.
	ErrSocketInUse = errors.New("mpsd: API socket in use")
	// ErrStateInUse: another mpsd holds the state directory's lock.
	ErrStateInUse = errors.New("mpsd: state directory in use")
)

// DefaultReconnectGrace is how long a lease re-adopted after a restart
// waits for its launcher to reconnect before it is released (its
// processes killed). Launchers retry for a minute (launcher's
// DefaultReconnectTimeout), so this outlasts them.
const DefaultReconnectGrace = 90 * time.Second

// Options configure a Daemon. Only ConfigPath is required; the rest are
// the seams tests and the command line use.
type Options struct {
	// ConfigPath is the YAML config (docs/config.md), watched for edits.
	ConfigPath string
	// NVML is the GPUs' library; nil means the host's (nvml.New()).
	// `mpsd --simulate` gives its simulated GPUs' here (cmd/mpsd).
	NVML nvml.Interface
	// MPS, when set, changes the control daemons' program and environment
	// from those the config gives them (mps.control; PATH from mps.path,
	// and HOME, LANG, TZ, LD_LIBRARY_PATH and LC_* of mpsd's environment),
	// knowing the daemon's Layout: `mpsd --simulate` puts the MPS
	// emulator's programs in place of NVIDIA's this way. An error stops
	// New.
	MPS func(base mps.Config, l Layout) (mps.Config, error)
	// Beside, when set, is started by Run once the daemon's directories
	// are made and checked, before any instance starts, and stopped (the
	// function it returns) when Run ends: a service the control daemons
	// use, such as the simulated GPUs' socket for the emulated daemons'
	// Xid reports. An error stops Run.
	Beside func(l Layout) (stop func(), err error)
	// XidInjector serves `mpsctl inject-xid`; nil (real GPUs) refuses it.
	XidInjector XidInjector
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
	// eventHook, when set (tests), sees every MPS event of an instance
	// before it is handled, and may hold it back.
	eventHook func(*instance, mps.Event)
	// clock, when set (tests), is the clock the core runs on.
	clock clock.Clock
	// writeHook, when set (tests), runs in the state writer before each
	// state write.
	writeHook func()
	// wrapCgroups, when set (tests), wraps the cgroup manager Run makes.
	wrapCgroups func(cgroup.Manager) cgroup.Manager
	// historyMaxBytes, when set (tests), replaces history.max_size.
	historyMaxBytes int64
	// killRetryInitial, when set (tests), replaces killRetryInitial.
	killRetryInitial time.Duration
	// mpsRunner, when set (tests), starts every MPS control command.
	mpsRunner mps.Runner
	// attachSwap, when set (tests), is called in an attach after the pid's
	// checks and before the move, and returns the pid the move then
	// names: a stand-in for the pid being reused in between.
	attachSwap func(pid int) int
	// attachMoved, when set (tests), is called in an attach right after
	// the move into the lease's cgroup, with the lease's cgMu held.
	attachMoved func(l *lease)
	// killLocking, when set (tests), is called by a lease's kill just
	// before it takes the lease's cgMu.
	killLocking func(l *lease)
}

// An XidInjector raises Xid xid on the GPU of index gpu, naming process
// pid (0: none), as the driver would on a hardware fault: the simulated
// GPUs do.
type XidInjector interface {
	InjectXid(gpu int, xid uint64, pid int) error
}

// Daemon is mpsd: one per host.
type Daemon struct {
	opts Options
	log  *slog.Logger
	// starter brings each instance's control daemon up (control.go).
	starter starter
	// clock is the time the core reads and waits on: the wall clock, a
	// fake in a test (Options.clock).
	clock   clock.Clock
	host    *gpu.Host
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
	// procs looks up processes mpsd did not start, by pid (processes.go).
	procs processes
	store *store
	ln    net.Listener
	srv   *http.Server
	// socket is the API socket mpsd listens on itself and sockFile the
	// file listen made there ("" and nil under socket activation):
	// mpsctl shutdown removes that file, and only while it is that one.
	socket   string
	sockFile os.FileInfo

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
	// storeRunning is closed once the state writer runs (a revocation
	// waits for its record to be written only then).
	storeRunning chan struct{}

	serving atomic.Bool
	// crashStop (tests): stop as a SIGKILL would leave things: no state
	// write once asked to stop, no final snapshot.
	crashStop atomic.Bool
	// supervisors counts the instances' supervisor goroutines running
	// (supervisor.go): one per instance.
	supervisors atomic.Int32
	// probes times every instance's probes (supervisor.go).
	probes  probeClock
	ready   atomic.Bool // every instance was up once (READY=1, /readyz)
	metrics *metrics
	res     *resources // connection caps, mpsd's own exhaustion
	dur     durability // the state file's health (durability.go)
	users   userNames  // uid → name, for the lease log lines

	// hist writes the ended leases to state_dir's history file
	// (history.go); set by Run before anything can end, nil before.
	hist *history
	// shutdownDone is closed once mpsctl shutdown has ended the MPS
	// service: Run stops then.
	shutdownDone chan struct{}
	shutOnce     sync.Once

	mu        coreMu // logAfter: lines written once it is let go
	cfg       *policy.Config
	instances map[string]*instance
	// byGroup is every group's instances in key order, built from
	// instances when nil (groupInstancesLocked); whoever adds or removes
	// an instance sets it to nil (setInstanceLocked, dropInstanceLocked).
	byGroup map[string][]*instance
	xidAt   map[int]time.Time   // GPU index → its last Xid (verify.go)
	queues  map[string][]*lease // queued leases per group, arrival order
	leases  map[string]*lease   // every lease, queued or running
	// awayEnds: how leases ended while their launchers were away, for
	// their resumes (awayend.go).
	awayEnds map[string]awayEnd
	seq      uint64
	// leaseID names a new lease; nil: newLeaseID (random). The
	// simulation names its leases in order, so that its seeds replay.
	leaseID func(group string) string
	// reconSeen: reconciliation's findings reported so far and still
	// there (reconcile.go).
	reconSeen map[reconKey]bool
	// reconLeased: the processes of placed leases as reconciliation last
	// read them from the cgroups, and when. Guarded by reconMu (never
	// held with mu).
	reconMu     sync.Mutex
	reconLeased leasedSnapshot
	// pods: the device plugin's leases bound to their pods' containers
	// (podprocs.go). It locks itself, never before mu.
	pods podTable
	// shuttingDown: mpsctl shutdown is under way; nothing is admitted or
	// granted any more.
	shuttingDown bool
	// lateStops are the control daemons a bring-up under way when the
	// shutdown began started and stopped again (lateProblems, what did
	// not go cleanly): the shutdown's answer counts them.
	lateStops    int
	lateProblems []string
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
	d := &Daemon{opts: opts, log: log, starter: mpsStarter{}, clock: cmp.Or[clock.Clock](opts.clock, clock.Real{}), proc: opts.ProcRoot, procs: procFS{root: opts.ProcRoot}, stopping: make(chan struct{}), shutdownDone: make(chan struct{}), storeRunning: make(chan struct{}), res: newResources(log)}

	// The full check needs the GPUs: read the file once without them
	// first, so a config that cannot be used is told before a GPU
	// inventory that fails.
	pre, err := policy.LoadFile(opts.ConfigPath, policy.Host{Users: opts.Users})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	// The cgroup check (a cgroup made and removed in every hierarchy, the
	// slowest part of New) needs only the cgroup section, which the GPUs
	// do not change: it runs while they are inventoried and the config is
	// checked against them. Its result is used where it was always
	// taken, below; New never returns while it runs.
	var cgCheck <-chan cgroupCheck
	if pre.Cgroup.Enabled {
		ch := make(chan cgroupCheck, 1)
		cgCheck = ch
		go func() { ch <- checkCgroups(opts.Cgroup, pre.Cgroup, log) }()
		defer func() {
			if cgCheck != nil {
				<-cgCheck
			}
		}()
	}
	lib := opts.NVML
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
	d.watcher, err = policy.NewWatcher(opts.ConfigPath, policy.Host{GPUs: policyGPUs(d.host.GPUs()), Users: opts.Users, Driver: d.host.DriverVersion()}, policy.WatchOptions{OnReload: d.onReload})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg := d.watcher.Config()
	// mpsd writes these directories as root: refuse ones that anyone else
	// could change (or replace) before a byte is written. The socket's
	// directory among them: its owner could put their own socket in
	// mpsd's place and answer every launcher as mpsd.
	if err := policy.CheckDirs(cfg, os.Geteuid()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	// A socket systemd passed (socket activation) is checked too, where
	// it is not the config's: systemd made it, but whoever may change its
	// directory may still replace it after.
	if ln := opts.Listener; ln != nil {
		if p := ln.Addr().String(); p != cfg.Socket {
			if err := policy.CheckSocketDir(p, os.Geteuid()); err != nil {
				return nil, fmt.Errorf("%w: the socket systemd passed (ListenStream= of mpsd.socket): %w", ErrConfig, err)
			}
		}
	}
	d.setConfigLocked(cfg)
	d.layout = Layout{RunDir: cfg.RunDir, LogDir: cfg.LogDir, StateDir: cfg.StateDir}
	if err := d.layout.checkWritable(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}

	d.mpsBase = mpsBase(cfg)
	if opts.MPS != nil {
		if d.mpsBase, err = opts.MPS(d.mpsBase, d.layout); err != nil {
			return nil, err
		}
	}
	d.mpsBase.Runner = opts.mpsRunner
	if cfg.Cgroup.Enabled {
		var c cgroupCheck
		if cgCheck != nil {
			c = <-cgCheck
			cgCheck = nil
		}
		if c.section != cfg.Cgroup {
			// The file changed between the two reads: checked again.
			c = checkCgroups(opts.Cgroup, cfg.Cgroup, log)
		}
		if c.newErr != nil {
			return nil, fmt.Errorf("cgroups (set cgroup.enabled: false to run without isolation): %w", c.newErr)
		}
		if c.createErr != nil {
			return nil, fmt.Errorf("%w: cgroup.enabled is true but mpsd cannot create cgroups under %s (%s): run mpsd as root, or set cgroup.enabled: false (no isolation)", ErrConfig, c.parentDir, errnoText(c.createErr))
		}
		d.cgCfg = &c.cfg
	} else {
		d.cg = cgroup.NewDisabled(log)
	}
	d.store = newStore(d.layout.StateFile(), d.snapshot, log)
	d.store.beforeWrite = d.opts.writeHook
	d.initDurability()
	ok = true
	return d, nil
}

// cgroupCheck is the outcome of checkCgroups.
type cgroupCheck struct {
	section   policy.CgroupConfig // the config's cgroup section checked
	cfg       cgroup.Config       // the backend's, for Run
	newErr    error               // cgroup.New's
	createErr error               // CheckCreate's
	parentDir string
}

// checkCgroups checks the cgroup backend of a config's cgroup section as
// New requires: the hierarchies are there (cgroup.New; Run makes the
// manager under this mpsd's instance id), and mpsd may make cgroups under
// the parent (CheckCreate), so that a user that may not is told at start,
// not by every launch after READY.
func checkCgroups(base cgroup.Config, section policy.CgroupConfig, log *slog.Logger) cgroupCheck {
	cc := base
	cc.Parent = section.Parent
	cc.Logger = log.With("component", "cgroup")
	c := cgroupCheck{section: section, cfg: cc}
	m, err := cgroup.New(cc)
	if err != nil {
		c.newErr = err
		return c
	}
	c.parentDir = m.ParentDir()
	c.createErr = m.CheckCreate()
	return c
}

// Close releases what New took (the GPUs' library) when Run is not to
// be called: the command's error paths. Run releases it itself; Close
// after Run does nothing.
func (d *Daemon) Close() error { return d.host.Close() }

// mpsBase is the control program and the daemons' environment the config
// gives them (Options.MPS may change them).
func mpsBase(cfg *policy.Config) mps.Config {
	env := []string{"PATH=" + cfg.MPS.Path}
	// Locale, home and the library path (a container may reach libcuda
	// only through it) pass through; nothing else of mpsd's environment
	// reaches the daemons, so a server never depends on how mpsd itself
	// was started.
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "HOME", k == "LANG", k == "TZ", k == "LD_LIBRARY_PATH", strings.HasPrefix(k, "LC_"):
			env = append(env, kv)
		}
	}
	return mps.Config{ControlPath: cfg.MPS.Control, Env: env}
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
	// The state directory's lock is let go last, once everything else of
	// this mpsd is done (the GPUs' compute modes put back among it), so
	// the next mpsd starts after it, never beside it.
	var stateLock *os.File
	defer func() {
		if stateLock != nil {
			_ = stateLock.Close()
		}
	}()
	defer d.cancel()
	defer func() { _ = d.Close() }()
	// The config as Run found it: once the watcher runs, d.cfg is read
	// only under d.mu.
	d.mu.Lock()
	cfg := d.cfg
	d.mu.Unlock()

	// Only directories that are missing are made here: nothing that is
	// there is changed.
	if err := d.layout.makeDirs(); err != nil {
		return err
	}
	// Checked again now that they exist: one made by someone else between
	// New's check and here is refused, not adopted.
	if err := policy.CheckDirs(cfg, os.Geteuid()); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	// Before anything in them is touched (the instance id, the cgroups,
	// the simulated GPUs' socket, the state file's leftovers, the API
	// socket): no other mpsd may serve this state or this socket.
	var err error
	if stateLock, err = d.claim(cfg.Socket); err != nil {
		return err
	}
	if err := d.openCgroups(); err != nil {
		return err
	}
	if d.opts.Beside != nil {
		stop, err := d.opts.Beside(d.layout)
		if err != nil {
			return err
		}
		defer stop()
	}
	// Before any lease can end (the adoption below may end some).
	if d.hist, err = openHistory(d.layout.StateDir, cmp.Or(d.opts.historyMaxBytes, cfg.History.MaxSize), d.log); err != nil {
		// The history is a record, not a condition: mpsd serves without
		// it, and its writer opens the file again at each write.
		d.log.Error("history: the history file cannot be opened; ended leases are not recorded until it can be (mpsd_history_writable)", "err", err)
	}
	d.hist.start()
	defer d.hist.close()
	saved, err := d.store.load()
	if err != nil {
		// A state file that cannot be read must not stop the host's GPUs
		// from being served; it is kept aside for a person to look at.
		d.log.Error("persisted state unreadable; starting without it", "err", err)
	}

	ln := d.opts.Listener
	if ln == nil {
		ln, err = listen(cfg.Socket)
		if err != nil {
			return err
		}
		d.socket = cfg.Socket
		if d.sockFile, err = os.Lstat(cfg.Socket); err != nil {
			_ = ln.Close()
			return fmt.Errorf("listen on %s: %w", cfg.Socket, err)
		}
	}
	d.ln = ln

	d.mu.Lock()
	d.instances = map[string]*instance{}
	d.queues = map[string][]*lease{}
	d.leases = map[string]*lease{}
	d.reconcileLocked(cfg)
	insts := d.instanceList()
	d.mu.Unlock()

	if err := d.prepareGroupDirs(cfg); err != nil {
		_ = ln.Close()
		return err
	}
	// From here on goroutines run: every error goes through the stop
	// sequence below.
	if cfg.MPS.ComputeMode == policy.ComputeExclusiveProcess {
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
	d.adoptLeases(saved)
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
	case <-d.after(10 * time.Second):
		d.log.Warn("the GPUs' Xid events are not registered after 10s; starting the instances anyway")
	}
	d.spawn(d.runProbeClock)
	for _, in := range insts {
		d.spawn(func() { d.supervise(in) })
	}
	firstTry := d.after(2 * time.Minute)
	for _, in := range insts {
		select {
		case <-in.tried:
		case <-firstTry:
		case <-ctx.Done():
		}
	}

	if d.spawn(func() { d.store.run(d.ctx) }) {
		close(d.storeRunning)
	}
	watchErr := make(chan error, 1)
	d.spawn(func() { watchErr <- d.watcher.Run(d.ctx) })
	var runErr error
	var msrv *http.Server
	if mln := d.opts.MetricsListener; mln != nil || cfg.Metrics.Listen != "" {
		if mln == nil {
			if mln, err = net.Listen("tcp", cfg.Metrics.Listen); err != nil {
				runErr = fmt.Errorf("metrics listener (metrics.listen %s): %w", cfg.Metrics.Listen, err)
			}
		}
		if runErr == nil {
			msrv = d.serveMetrics(mln)
			d.log.Info("metrics served", "address", mln.Addr().String())
		}
	}
	serveErr := make(chan error, 1)
	served := runErr == nil
	if served {
		d.srv = d.newHTTPServer()
		lln := d.limitListener(ln, listenerAPI)
		go func() { serveErr <- d.srv.Serve(lln) }()
		d.serving.Store(true)
		d.markLive()
		d.log.Info("mpsd serving", "socket", ln.Addr().String(), "instances", len(insts), "leases", len(saved.Leases))
		d.spawn(d.announceReady)
		select {
		case <-ctx.Done():
		case <-d.shutdownDone:
		case err := <-serveErr:
			runErr = fmt.Errorf("serve API: %w", err)
		}
	} else {
		_ = ln.Close()
	}
	crash := d.crashStop.Load()
	if crash {
		d.store.freeze()
	}
	select {
	case <-d.shutdownDone:
		d.log.Info("mpsd stopping after mpsctl shutdown; MPS daemons and workloads are gone")
	default:
		d.log.Info("mpsd stopping; MPS daemons and workloads keep running", "as_if_killed", crash)
	}
	d.serving.Store(false)
	close(d.stopping)
	if d.srv != nil {
		_ = d.srv.Close()
	}
	if msrv != nil {
		_ = msrv.Close()
	}
	if served && runErr == nil {
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
	d.store.close()
	d.log.Info("mpsd stopped")
	return runErr
}

// announceReady calls Options.Ready once every instance is up.
func (d *Daemon) announceReady() {
	t := d.clock.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		d.mu.Lock()
		up := true
		for _, in := range d.instances {
			up = up && in.daemonUp()
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
		case <-t.C():
		}
	}
}

// SocketPath is the API socket mpsd serves: the one passed in (systemd
// socket activation) or the config's.
func (d *Daemon) SocketPath() string {
	if ln := d.opts.Listener; ln != nil {
		return ln.Addr().String()
	}
	return d.ConfigSocket()
}

// ConfigSocket is the API socket the config names, where mps-launch and
// mpsctl look for mpsd.
func (d *Daemon) ConfigSocket() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cfg.Socket
}

// Summary is a one-line account of the daemon for systemd's STATUS= and
// logs: instances by state, leases running and queued.
func (d *Daemon) Summary() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	states := map[string]int{}
	for _, in := range d.instances {
		states[in.shownState()]++
	}
	var parts []string
	for _, st := range []string{"ready", "starting", "recovering", "draining", "drained", "retiring", "quarantined"} {
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
	sum := fmt.Sprintf("%s; leases: %d running, %d queued", inst, running, queued)
	if held := d.heldReasonLocked(); held != "" {
		sum += "; grants held: " + held
	}
	return sum
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
// The file is left in place when mpsd stops (SIGTERM, a crash), with its
// api.LiveMarker: a launcher that connects meanwhile is refused and
// retries within its outage window (mpsd is restarting); mpsctl shutdown
// removes both, and a socket that is not there, or refuses with no
// marker beside it, means no mpsd is coming and fails at once. A
// directory someone else may change is refused (policy.CheckSocketDir)
// before anything in it is touched.
func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	// Checked again now that it exists, before anything is removed or
	// bound in it: one made by someone else since New's check (in a
	// sticky directory such as /tmp, anyone may make it) is refused.
	if err := policy.CheckSocketDir(path, os.Geteuid()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := socketFree(path); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
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
// directories, and of the directories of its instances below them (made
// here where missing, before their daemons start): the GPU and pipe
// directories, and each instance's log directory. Those of an instance
// the config no longer has get the same ACL. A group the kubelet device
// plugin serves keeps its pipe directories open (guardInstanceDir).
func (d *Daemon) prepareGroupDirs(cfg *policy.Config) error {
	d.mu.Lock()
	pipes := map[string][]string{} // group -> pipe directories of its instances
	logs := map[string][]string{}
	for _, in := range d.instances {
		pipes[in.group] = append(pipes[in.group], in.pipeDir)
		logs[in.group] = append(logs[in.group], in.logDir)
	}
	d.mu.Unlock()
	for _, g := range cfg.Groups {
		uids, gids, _ := cfg.Access.Members(g.Name)
		// The log directories too: control.log names the group's users,
		// pids and limits, which are none of another tenant's business.
		runDir, logDir := d.layout.GroupRunDir(g.Name), d.layout.GroupLogDir(g.Name)
		for _, dir := range []string{runDir, logDir} {
			if err := prepareGroupDir(dir, uids, gids); err != nil {
				return fmt.Errorf("group %s: %w", g.Name, err)
			}
		}
		open := d.opts.PrivateShm != nil && d.opts.PrivateShm(g.Name)
		guard := func(dir string, open bool) error {
			if err := guardInstanceDir(dir, uids, gids, open); err != nil {
				return fmt.Errorf("group %s: %w", g.Name, err)
			}
			return nil
		}
		for _, pipe := range pipes[g.Name] {
			if err := guard(filepath.Dir(pipe), false); err != nil {
				return err
			}
			if err := guard(pipe, open); err != nil {
				return err
			}
		}
		for _, dir := range logs[g.Name] {
			if err := guard(dir, false); err != nil {
				return err
			}
		}
		// Directories of instances mpsd no longer runs (prepareGroupDir
		// has checked that they are its own).
		for _, top := range []struct {
			dir  string
			pipe bool
		}{{runDir, true}, {logDir, false}} {
			ents, err := os.ReadDir(top.dir)
			if err != nil {
				return fmt.Errorf("group %s: read %s: %w", g.Name, top.dir, err)
			}
			for _, e := range ents {
				if !e.IsDir() {
					continue
				}
				sub := filepath.Join(top.dir, e.Name())
				if err := guard(sub, false); err != nil {
					return err
				}
				if !top.pipe {
					continue
				}
				pipe := filepath.Join(sub, "pipe")
				if _, err := os.Lstat(pipe); err != nil {
					continue
				}
				if err := guard(pipe, open); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
