package policy

import (
	"sort"
	"time"
)

// Version is the only config schema version this package reads.
const Version = 1

// MaxClientsLimit is the most clients MPS serves per GPU on Volta and
// newer, so the most max_clients may say.
const MaxClientsLimit = 48

// Config is a decoded and validated config file (docs/config.md). Values
// come from Parse, LoadFile or a Watcher and are shared between
// goroutines: treat them as read-only.
//
// Every field's default, when the key is absent, is stated on the field;
// the one table that applies them is in schema.go.
type Config struct {
	// Version of the schema; required, must be 1.
	Version int
	// Socket is the API socket. Default: /run/mpsd/mpsd.sock.
	Socket string
	// RunDir holds the instances' pipe directories. Default: /run/mpsd.
	RunDir string
	// StateDir holds leases, attempts and quarantines. Default: /var/lib/mpsd.
	StateDir string
	// LogDir holds the instances' MPS log directories. Default: /var/log/mpsd.
	LogDir string

	Cgroup   CgroupConfig
	Metrics  MetricsConfig
	MPS      MPSConfig
	Watchdog WatchdogConfig
	Limits   LimitsConfig
	History  HistoryConfig

	// Placement chooses among instances with room. Default: binpack.
	Placement Placement

	// Admins may use mpsctl's privileged commands (drain, resume, restart,
	// requeue, shutdown). Being an admin grants no group.
	Admins Members

	// Groups are the tenant groups, sorted by name. A config has at
	// least one.
	Groups []Group

	Simulate SimulateConfig

	// Access is Admins and each group's members resolved to uids and gids.
	Access Access
}

// CgroupConfig is the `cgroup` section.
type CgroupConfig struct {
	// Enabled puts every lease in its own cgroup; false means no isolation
	// (non-root simulation). Default: true.
	Enabled bool
	// Parent is the cgroup under which <instance-id>/<group>/<lease> are
	// made (the id is mpsd's, from state_dir/instance-id), a relative
	// path. Default: mpsd.
	Parent string
}

// MetricsConfig is the `metrics` section.
type MetricsConfig struct {
	// Listen is the host:port of the Prometheus listener; empty disables
	// it. Default: 127.0.0.1:9486.
	Listen string
	// PerLease adds series labelled by lease (mpsd_lease_memory_used_bytes_by_lease):
	// as many as running leases, so off by default. Default: false.
	PerLease bool
}

// HistoryConfig is the `history` section: state_dir/history.jsonl, the
// ended leases.
type HistoryConfig struct {
	// MaxSize bounds the live history file, in bytes; at it the file is
	// rotated to history.1.jsonl, and one uid's records take at most a
	// quarter of it. Default: 8M.
	MaxSize int64
}

// MPSConfig is the `mps` section.
type MPSConfig struct {
	// Control is nvidia-cuda-mps-control as a name looked up on Path or an
	// absolute path. Default: nvidia-cuda-mps-control.
	Control string
	// Path is the PATH given to the control daemons, which their servers
	// inherit. Default: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.
	Path string
	// ComputeMode says whether mpsd sets the GPUs' compute mode.
	// Default: leave.
	ComputeMode ComputeMode
}

// WatchdogConfig is the `watchdog` section.
type WatchdogConfig struct {
	// ProbeInterval is the time between probes of an instance. Default: 2s.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe may take; shorter than
	// ProbeInterval. Default: 1s.
	ProbeTimeout time.Duration
	// ProbeFailures failed probes in a row mark an instance failed.
	// Default: 3.
	ProbeFailures int
	// ProbeCommandEvery: one probe in this many sends the control daemon
	// a command, which NVIDIA's daemon logs (221 bytes); the others read
	// its process state only. Default: 1, every probe, which finds a
	// daemon that runs but no longer answers within ProbeFailures probes.
	ProbeCommandEvery int
	// BackoffInitial is the first delay before restarting a failed
	// server or daemon. Default: 200ms.
	BackoffInitial time.Duration
	// BackoffMax caps the doubling restart delay. Default: 30s.
	BackoffMax time.Duration
	// QuarantineAfter failures within QuarantineWindow quarantine an
	// instance until mpsctl resume. Default: 5.
	QuarantineAfter int
	// QuarantineWindow: see QuarantineAfter. Default: 10m.
	QuarantineWindow time.Duration
}

// LimitsConfig is the `limits` section: caps on what local users can make
// mpsd hold, so no one of them can exhaust its file descriptors or memory.
type LimitsConfig struct {
	// Connections caps the open connections on the API socket, everyone's;
	// mpsd lowers it to fit its file descriptor limit. Default: 1024.
	Connections int
	// ConnectionsPerUser caps one uid's open API connections (uid 0 is
	// exempt); at most Connections. Default: 128.
	ConnectionsPerUser int
	// QueuedPerUser caps one uid's lease requests waiting in queues (uid 0
	// is exempt). Default: 64.
	QueuedPerUser int
	// MetricsConnections caps the open connections of the metrics
	// listener. Default: 32.
	MetricsConnections int
	// MetricsConnectionsPerUser caps the metrics connections of one peer:
	// one uid (a unix socket's peer credentials, or the owner of a
	// loopback TCP peer's socket), else one remote address; uid 0 is
	// exempt. mpsd lowers it to MetricsConnections. Default: 8.
	MetricsConnectionsPerUser int
	// RunningPerUser caps the MPS clients that one uid's running leases
	// hold on one instance (a lease counts its procs, at least 1); uid 0
	// is exempt. A uid with no lease on an instance may always start one
	// there (max_clients bounds a lease). 0 means half the group's
	// max_clients, rounded up. A request over the cap waits, it is never
	// refused. Default: 0.
	RunningPerUser int
}

// UserClients is the cap RunningPerUser puts on one uid's clients on an
// instance of maxClients clients.
func (l LimitsConfig) UserClients(maxClients int) int {
	if l.RunningPerUser > 0 {
		return l.RunningPerUser
	}
	return (maxClients + 1) / 2
}

// SimulateConfig is the `simulate` section, read only by mpsd --simulate.
type SimulateConfig struct {
	// GPUs is the number of mock GPUs. Default: 2.
	GPUs int
	// Model of the mock GPUs: a100-40g, h100-80g, h200-141g or b200-180g.
	// Default: a100-40g.
	Model string
	// EmulatorDir holds the mpsemu programs; empty means next to the mpsd
	// binary, then bin/emu. Default: "".
	EmulatorDir string
}

// Members names who belongs to a group or to the admins: user names or
// numeric uids, and unix group names or numeric gids, as written.
type Members struct {
	// Users: names or numeric uids. Default: [] ([root] for admins).
	Users []string
	// UnixGroups: names or numeric gids. Default: [].
	UnixGroups []string
}

// Group is one tenant group (`groups.<name>`). Budgets are per GPU: a
// client of an instance spanning several GPUs is charged its sm and mem on
// each of them, since it sees all of them.
type Group struct {
	// Name is the key under `groups`: lower-case letters, digits, "-" and
	// "_", starting with a letter or digit, at most 32 bytes, because it
	// becomes a directory and a cgroup name.
	Name string

	// Members may use the group. Users default: []; UnixGroups default: [].
	Members
	// DefaultFor names the users (names or numeric uids, each one of
	// Users) whose request without a group runs in this group, when they
	// may use several: a user in more than one group must otherwise name
	// one. A user is the default of at most one group. Default: [].
	DefaultFor []string

	// GPUs selects the group's GPUs: "all", NVML indexes, GPU UUIDs or
	// UUID prefixes (with or without "GPU-"). Default: [all].
	GPUs []string
	// GPUsPerInstance is the size of each instance's GPU set; the selected
	// GPUs, in index order, are cut into sets of this size. Default: 1.
	GPUsPerInstance int
	// SMPercent is the per-GPU budget of the sum of the clients' sm, 1-100.
	// Default: 100.
	SMPercent int
	// Memory is the per-GPU budget of the sum of the clients' mem, at
	// least 1 MiB. Required.
	Memory int64
	// MaxClients is the per-instance client limit, 1-48. Default: 48.
	MaxClients int
	// DefaultSM is the sm of a request that gives none.
	// Default: a quarter of MaxSM, at least 1.
	DefaultSM int
	// DefaultMem is the mem of a request that gives none.
	// Default: a quarter of MaxMem, in whole MiB, at least 1 MiB.
	DefaultMem int64
	// MaxSM is the most sm one client may ask for. Default: SMPercent.
	MaxSM int
	// MaxMem is the most mem one client may ask for. Default: Memory.
	MaxMem int64
	// Priority orders the group's queue: higher first. Default: 0.
	Priority int
	// RequeueAttempts is how often a lease revoked by a fault is requeued
	// before it fails; 0 never requeues. Default: 3.
	RequeueAttempts int
	// Multiuser runs the group's servers with -multiuser-server (as root),
	// so clients of every uid share one server. Default: false.
	Multiuser bool
	// Reconcile is what mpsd does with a process it finds using one of
	// the group's instances without a lease of it (docs/alerts.md,
	// MPSUnreconciledClient): report, or terminate. Default: report.
	Reconcile ReconcilePolicy
	// MemoryGrace is how long a lease's processes may hold more device
	// memory on a GPU, as NVML reports it summed over them, than the
	// lease's mem before the lease is revoked for good (not requeued).
	// 0 disables the check. Default: 30s.
	MemoryGrace time.Duration
	// ShmSize bounds each of the group's instances' private /dev/shm, a
	// tmpfs of its own, in bytes, when the kubelet device plugin serves
	// the group (mpsd --kubelet-device-plugin): what the instance's MPS
	// servers, clients and pods may write there together. Unused for a
	// group not served to the kubelet. Default: 64M.
	ShmSize int64

	// Instances are the GPU index sets of the group's instances, resolved
	// against the host's GPUs; nil when the config was read without them.
	Instances [][]int
}

// Budget is the group's per-GPU budget, what each of its instances may
// hand out.
func (g *Group) Budget() Usage {
	return Usage{SM: g.SMPercent, Mem: g.Memory, Clients: g.MaxClients}
}

// Group returns the group with that name.
func (c *Config) Group(name string) (*Group, bool) {
	i := sort.Search(len(c.Groups), func(i int) bool { return c.Groups[i].Name >= name })
	if i < len(c.Groups) && c.Groups[i].Name == name {
		return &c.Groups[i], true
	}
	return nil, false
}

// Placement is the config's `placement`: how an instance is chosen among
// those with room.
type Placement string

const (
	// Binpack fills the fullest instance first, keeping others free for
	// large requests.
	Binpack Placement = "binpack"
	// Spread uses the emptiest instance first, so clients interfere least.
	Spread Placement = "spread"
)

// ReconcilePolicy is a group's `reconcile`: what mpsd does with a GPU
// process it cannot account to a lease (a client without a lease, a lease
// process on another instance's server, a process beside MPS).
type ReconcilePolicy string

const (
	// ReconcileReport logs and counts each finding and leaves the process.
	ReconcileReport ReconcilePolicy = "report"
	// ReconcileTerminate also ends it: terminate_client for an MPS client,
	// then a kill, of a process proven through a pidfd.
	ReconcileTerminate ReconcilePolicy = "terminate"
)

// ComputeMode is `mps.compute_mode`.
type ComputeMode string

const (
	// ComputeLeave leaves the GPUs' compute mode as the host has it.
	ComputeLeave ComputeMode = "leave"
	// ComputeExclusiveProcess sets EXCLUSIVE_PROCESS on the group's GPUs,
	// as NVIDIA recommends for MPS, so only the MPS server can use them.
	ComputeExclusiveProcess ComputeMode = "exclusive_process"
)
