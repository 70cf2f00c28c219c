package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mpsd/mpsd/internal/units"
)

// field is one key of the schema: where it lives, its default and the Go
// value it decodes into. The tables below are the one place that knows
// the keys and their defaults; decoding, defaults and Diff all read them.
type field[T any] struct {
	// key is the dotted path below the table's root (the file, or one
	// group): "watchdog.probe_interval", "memory".
	key string
	// def is the value taken when the key is absent, written as the YAML
	// decoder would produce it; or required; or a derivedFrom.
	def any
	// ref returns the Go value the key decodes into, a pointer whose type
	// selects the decoding (see decodeLeaf).
	ref func(*T) any
}

// marker is a def that is not a value.
type marker int

// required: the key must be present.
const required marker = 1

// derivedFrom is the def of a key whose default is computed from the key it
// names, by deriveGroupDefaults.
type derivedFrom string

// size marks an int64 field holding bytes, written as a size ("8G").
type size int64

// configFields is the schema of the file outside `groups`.
var configFields = []field[Config]{
	{"version", required, func(c *Config) any { return &c.Version }},
	{"socket", "/run/mpsd/mpsd.sock", func(c *Config) any { return &c.Socket }},
	{"run_dir", "/run/mpsd", func(c *Config) any { return &c.RunDir }},
	{"state_dir", "/var/lib/mpsd", func(c *Config) any { return &c.StateDir }},
	{"log_dir", "/var/log/mpsd", func(c *Config) any { return &c.LogDir }},
	{"cgroup.enabled", true, func(c *Config) any { return &c.Cgroup.Enabled }},
	{"cgroup.parent", "mpsd", func(c *Config) any { return &c.Cgroup.Parent }},
	{"metrics.listen", "127.0.0.1:9486", func(c *Config) any { return &c.Metrics.Listen }},
	{"metrics.per_lease", false, func(c *Config) any { return &c.Metrics.PerLease }},
	{"mps.control", "nvidia-cuda-mps-control", func(c *Config) any { return &c.MPS.Control }},
	{"mps.path", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", func(c *Config) any { return &c.MPS.Path }},
	{"mps.compute_mode", "leave", func(c *Config) any { return (*string)(&c.MPS.ComputeMode) }},
	{"watchdog.probe_interval", "2s", func(c *Config) any { return &c.Watchdog.ProbeInterval }},
	{"watchdog.probe_timeout", "1s", func(c *Config) any { return &c.Watchdog.ProbeTimeout }},
	{"watchdog.probe_failures", 3, func(c *Config) any { return &c.Watchdog.ProbeFailures }},
	{"watchdog.probe_command_every", 1, func(c *Config) any { return &c.Watchdog.ProbeCommandEvery }},
	{"watchdog.backoff_initial", "200ms", func(c *Config) any { return &c.Watchdog.BackoffInitial }},
	{"watchdog.backoff_max", "30s", func(c *Config) any { return &c.Watchdog.BackoffMax }},
	{"watchdog.quarantine_after", 5, func(c *Config) any { return &c.Watchdog.QuarantineAfter }},
	{"watchdog.quarantine_window", "10m", func(c *Config) any { return &c.Watchdog.QuarantineWindow }},
	{"limits.connections", 1024, func(c *Config) any { return &c.Limits.Connections }},
	{"limits.connections_per_user", 128, func(c *Config) any { return &c.Limits.ConnectionsPerUser }},
	{"limits.queued_per_user", 64, func(c *Config) any { return &c.Limits.QueuedPerUser }},
	{"limits.metrics_connections", 32, func(c *Config) any { return &c.Limits.MetricsConnections }},
	{"limits.metrics_connections_per_user", 8, func(c *Config) any { return &c.Limits.MetricsConnectionsPerUser }},
	{"limits.running_per_user", 0, func(c *Config) any { return &c.Limits.RunningPerUser }},
	{"history.max_size", "8M", func(c *Config) any { return (*size)(&c.History.MaxSize) }},
	{"placement", "binpack", func(c *Config) any { return (*string)(&c.Placement) }},
	{"admins.users", []any{"root"}, func(c *Config) any { return &c.Admins.Users }},
	{"admins.unix_groups", []any{}, func(c *Config) any { return &c.Admins.UnixGroups }},
	{"simulate.gpus", 2, func(c *Config) any { return &c.Simulate.GPUs }},
	{"simulate.model", "a100-40g", func(c *Config) any { return &c.Simulate.Model }},
	{"simulate.emulator_dir", "", func(c *Config) any { return &c.Simulate.EmulatorDir }},
}

// groupsKey is the mapping of group name to groupFields.
const groupsKey = "groups"

// groupFields is the schema of one `groups.<name>` mapping.
var groupFields = []field[Group]{
	{"users", []any{}, func(g *Group) any { return &g.Users }},
	{"unix_groups", []any{}, func(g *Group) any { return &g.UnixGroups }},
	{"default_for", []any{}, func(g *Group) any { return &g.DefaultFor }},
	{"gpus", []any{"all"}, func(g *Group) any { return &g.GPUs }},
	{"gpus_per_instance", 1, func(g *Group) any { return &g.GPUsPerInstance }},
	{"sm_percent", 100, func(g *Group) any { return &g.SMPercent }},
	{"memory", required, func(g *Group) any { return (*size)(&g.Memory) }},
	{"max_clients", MaxClientsLimit, func(g *Group) any { return &g.MaxClients }},
	// Derived keys come after the keys they derive from.
	{"max_sm", derivedFrom("sm_percent"), func(g *Group) any { return &g.MaxSM }},
	{"max_mem", derivedFrom("memory"), func(g *Group) any { return (*size)(&g.MaxMem) }},
	{"default_sm", derivedFrom("max_sm"), func(g *Group) any { return &g.DefaultSM }},
	{"default_mem", derivedFrom("max_mem"), func(g *Group) any { return (*size)(&g.DefaultMem) }},
	{"priority", 0, func(g *Group) any { return &g.Priority }},
	{"requeue_attempts", 3, func(g *Group) any { return &g.RequeueAttempts }},
	{"multiuser", false, func(g *Group) any { return &g.Multiuser }},
	{"reconcile", "report", func(g *Group) any { return (*string)(&g.Reconcile) }},
	{"memory_grace", "30s", func(g *Group) any { return &g.MemoryGrace }},
	{"shm_size", "64M", func(g *Group) any { return (*size)(&g.ShmSize) }},
}

// deriveGroupDefaults fills the derived keys the file left out (present
// says which keys it gave): the per-client maximums are the whole budget
// and a request that names nothing gets a quarter of the maximum, so four
// default clients fill a group in both dimensions. Keys that failed to
// decode are left alone.
func deriveGroupDefaults(g *Group, present func(key string) bool) {
	if !present("max_sm") {
		g.MaxSM = g.SMPercent
	}
	if !present("max_mem") {
		g.MaxMem = g.Memory
	}
	if !present("default_sm") {
		g.DefaultSM = max(1, g.MaxSM/4)
	}
	if !present("default_mem") {
		g.DefaultMem = max(units.MiB, g.MaxMem/4/units.MiB*units.MiB)
	}
}

// describe names the YAML kind of a decoded value for error messages.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "nothing"
	case string:
		return strconv.Quote(v)
	case bool:
		return strconv.FormatBool(v)
	case int, int64, uint64:
		return fmt.Sprint(v)
	case float64:
		f := strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.ContainsAny(f, ".eEnN") { // 48.0 must not read as 48
			f += ".0"
		}
		return f
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	case time.Time:
		return "a timestamp"
	default:
		return fmt.Sprintf("a %T", v)
	}
}
