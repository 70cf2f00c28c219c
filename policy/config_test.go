package policy

import (
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/units"
)

func TestParseDesignExample(t *testing.T) {
	f, err := os.Open("testdata/design.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := Parse(f, Host{GPUs: testGPUs[:2], Users: testUsers})
	if err != nil {
		t.Fatalf("the full example (testdata/design.yaml, every key of docs/config.md) does not parse: %v", err)
	}
	want := Config{
		Version:  1,
		Socket:   "/run/mpsd/mpsd.sock",
		RunDir:   "/run/mpsd",
		StateDir: "/var/lib/mpsd",
		LogDir:   "/var/log/mpsd",
		Cgroup:   CgroupConfig{Enabled: true, Parent: "mpsd"},
		Metrics:  MetricsConfig{Listen: "127.0.0.1:9486"},
		MPS: MPSConfig{
			Control:     "nvidia-cuda-mps-control",
			Path:        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			ComputeMode: ComputeLeave,
		},
		Watchdog: WatchdogConfig{
			ProbeInterval: 2 * time.Second, ProbeTimeout: time.Second, ProbeFailures: 3, ProbeCommandEvery: 1,
			BackoffInitial: 200 * time.Millisecond, BackoffMax: 30 * time.Second,
			QuarantineAfter: 5, QuarantineWindow: 10 * time.Minute,
		},
		Limits:    LimitsConfig{Connections: 1024, ConnectionsPerUser: 128, QueuedPerUser: 64, MetricsConnections: 32, MetricsConnectionsPerUser: 8},
		History:   HistoryConfig{MaxSize: 8 << 20},
		Placement: Binpack,
		Admins:    Members{Users: []string{"root"}, UnixGroups: []string{}},
		Groups: []Group{{
			Name:            "inference",
			Members:         Members{Users: []string{"svc-infer", "1001"}, UnixGroups: []string{"ml"}},
			DefaultFor:      []string{"svc-infer"},
			GPUs:            []string{"all"},
			GPUsPerInstance: 1,
			SMPercent:       100,
			Memory:          40 * gib,
			MaxClients:      48,
			DefaultSM:       25,
			DefaultMem:      8 * gib,
			MaxSM:           100,
			MaxMem:          40 * gib,
			Priority:        0,
			RequeueAttempts: 3,
			Multiuser:       false,
			Reconcile:       ReconcileReport,
			MemoryGrace:     30 * time.Second,
			ShmSize:         64 << 20,
			Instances:       [][]int{{0}, {1}},
		}},
		Simulate: SimulateConfig{GPUs: 2, Model: "a100-40g", EmulatorDir: ""},
	}
	got := *cfg
	got.Access = Access{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if !cfg.Access.Admin(Credentials{UID: 0}) {
		t.Error("root is not an admin")
	}
	for _, c := range []Credentials{{UID: 1500}, {UID: 1001}, {UID: 4242, GIDs: []uint32{3000}}} {
		if g := cfg.Access.Groups(c); !slices.Equal(g, []string{"inference"}) {
			t.Errorf("Groups(%+v) = %v, want [inference]", c, g)
		}
	}
}

// TestDefaults pins the default of every key, as documented on Config.
func TestDefaults(t *testing.T) {
	cfg := mustParse(t, minimal, Host{})
	want := &Config{
		Version: 1, Socket: "/run/mpsd/mpsd.sock", RunDir: "/run/mpsd", StateDir: "/var/lib/mpsd", LogDir: "/var/log/mpsd",
		Cgroup:  CgroupConfig{Enabled: true, Parent: "mpsd"},
		Metrics: MetricsConfig{Listen: "127.0.0.1:9486"},
		MPS:     MPSConfig{Control: "nvidia-cuda-mps-control", Path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", ComputeMode: ComputeLeave},
		Watchdog: WatchdogConfig{ProbeInterval: 2 * time.Second, ProbeTimeout: time.Second, ProbeFailures: 3, ProbeCommandEvery: 1,
			BackoffInitial: 200 * time.Millisecond, BackoffMax: 30 * time.Second, QuarantineAfter: 5, QuarantineWindow: 10 * time.Minute},
		Limits:    LimitsConfig{Connections: 1024, ConnectionsPerUser: 128, QueuedPerUser: 64, MetricsConnections: 32, MetricsConnectionsPerUser: 8},
		History:   HistoryConfig{MaxSize: 8 << 20},
		Placement: Binpack,
		Admins:    Members{Users: []string{"root"}, UnixGroups: []string{}},
		Groups: []Group{{Name: "inference", Members: Members{Users: []string{"alice"}, UnixGroups: []string{}}, DefaultFor: []string{},
			GPUs: []string{"all"}, GPUsPerInstance: 1, SMPercent: 100, Memory: 16 * gib, MaxClients: 48,
			DefaultSM: 25, DefaultMem: 4 * gib, MaxSM: 100, MaxMem: 16 * gib, Priority: 0, RequeueAttempts: 3, Reconcile: ReconcileReport, MemoryGrace: 30 * time.Second, ShmSize: 64 << 20}},
		Simulate: SimulateConfig{GPUs: 2, Model: "a100-40g"},
	}
	cfg.Access = Access{}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("defaults\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestDerivedDefaults(t *testing.T) {
	for _, tc := range []struct {
		name                string
		group               string
		maxSM, defSM        int
		maxMem, defMem      int64
		instancesWithoutGPU bool
	}{
		{"from budgets", "memory: 40G\nsm_percent: 60", 60, 15, 40 * gib, 10 * gib, false},
		{"from maximums", "memory: 40G\nmax_sm: 10\nmax_mem: 2G", 10, 2, 2 * gib, gib / 2, false},
		{"at least 1 SM", "memory: 40G\nsm_percent: 3", 3, 1, 40 * gib, 10 * gib, false},
		{"whole MiB", "memory: 10M", 100, 25, 10 * units.MiB, 2 * units.MiB, false},
		{"at least 1 MiB", "memory: 2M", 100, 25, 2 * units.MiB, units.MiB, false},
		{"explicit kept", "memory: 40G\ndefault_sm: 50\ndefault_mem: 1G", 100, 50, 40 * gib, gib, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := "version: 1\ngroups:\n  g:\n    users: [alice]\n    " + strings.ReplaceAll(tc.group, "\n", "\n    ") + "\n"
			g := mustParse(t, yaml, Host{}).Groups[0]
			if g.MaxSM != tc.maxSM || g.DefaultSM != tc.defSM || g.MaxMem != tc.maxMem || g.DefaultMem != tc.defMem {
				t.Errorf("max_sm %d default_sm %d max_mem %d default_mem %d; want %d %d %d %d",
					g.MaxSM, g.DefaultSM, g.MaxMem, g.DefaultMem, tc.maxSM, tc.defSM, tc.maxMem, tc.defMem)
			}
			if g.Instances != nil {
				t.Errorf("Instances = %v without an inventory, want nil", g.Instances)
			}
		})
	}
}

// problemsOf returns the problems of a *ConfigError as "key: message".
func problemsOf(t *testing.T, err error) []string {
	t.Helper()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *ConfigError", err, err)
	}
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("error %v does not match ErrInvalidConfig", err)
	}
	out := make([]string, len(ce.Problems))
	for i, p := range ce.Problems {
		out[i] = p.String()
	}
	return out
}

// group wraps group settings into a config with one group "g".
func group(settings string) string {
	return "version: 1\ngroups:\n  g:\n    users: [alice]\n    " + strings.ReplaceAll(strings.TrimSpace(settings), "\n", "\n    ") + "\n"
}

func TestParseProblems(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		gpus []GPU
		// want are the problems, in order, each as "key: message start".
		want []string
	}{
		{"unknown top-level key", minimal + "sockett: /x\n", nil,
			[]string{"sockett: unknown key (did you mean socket?)"}},
		{"unknown nested key", minimal + "watchdog:\n  probe_intervall: 2s\n", nil,
			[]string{"watchdog.probe_intervall: unknown key (did you mean watchdog.probe_interval?)"}},
		{"unknown group key names the full path", group("memroy: 8G"), nil,
			[]string{"groups.g.memory: required", "groups.g.memroy: unknown key (did you mean groups.g.memory?)"}},
		{"group names differ only in case", "version: 1\ngroups:\n  inference:\n    users: [root]\n    memory: 1G\n  Inference:\n    users: [root]\n    memory: 2G\n", nil,
			[]string{`groups.Inference: line 6: "Inference" and "inference" (line 3) differ only in case`}},
		{"keys differ only in case", group("memory: 1G\nMemory: 2G"), nil,
			[]string{`groups.g.Memory: line 6: "Memory" and "memory" (line 5) differ only in case`}},
		{"top-level keys differ only in case", minimal + "Version: 1\n", nil,
			[]string{`Version: line 6: "Version" and "version" (line 1) differ only in case`}},
		{"unknown key far from any", minimal + "frobnicate: 1\n", nil, []string{"frobnicate: unknown key"}},
		{"unknown section key", minimal + "cgroup:\n  enabled: true\n  weight: 5\n", nil, []string{"cgroup.weight: unknown key"}},
		{"missing version", strings.TrimPrefix(minimal, "version: 1\n"), nil, []string{"version: required"}},
		{"wrong version", strings.Replace(minimal, "version: 1", "version: 2", 1), nil,
			[]string{"version: unsupported version 2; this mpsd reads version 1"}},
		{"version as string", strings.Replace(minimal, "version: 1", `version: "1"`, 1), nil,
			[]string{`version: want a whole number, got "1"`}},
		{"no groups", "version: 1\n", nil, []string{"groups: no groups"}},
		{"empty groups", "version: 1\ngroups: {}\n", nil, []string{"groups: no groups"}},
		{"groups not a mapping", "version: 1\ngroups: [a]\n", nil, []string{"groups: want a mapping of group name to settings, got a list"}},
		{"group not a mapping", "version: 1\ngroups:\n  g: 5\n", nil, []string{"groups.g: want a mapping of the group's settings, got 5"}},
		{"empty group", "version: 1\ngroups:\n  g:\n", nil,
			[]string{"groups.g.memory: required", "groups.g.users: empty, and so is unix_groups"}},
		{"bad group names", "version: 1\ngroups:\n  -x: {memory: 1G}\n  a.b: {memory: 1G}\n  a b: {memory: 1G}\n  " +
			strings.Repeat("x", 33) + ": {memory: 1G}\n", nil,
			[]string{"groups.-x: group names are", "groups.a b: group names are", "groups.a.b: group names are",
				"groups." + strings.Repeat("x", 33) + ": group names are"}},
		{"section not a mapping", minimal + "watchdog: 5\n", nil, []string{"watchdog: want a mapping, got 5"}},
		{"null section takes defaults", minimal + "watchdog:\n", nil, nil},
		{"bool as string", minimal + "cgroup:\n  enabled: \"yes\"\n", nil, []string{`cgroup.enabled: want true or false, got "yes"`}},
		{"float count", group("memory: 1G\nmax_clients: 48.0"), nil, []string{"groups.g.max_clients: want a whole number, got 48.0"}},
		{"duration as number", minimal + "watchdog:\n  probe_timeout: 5\n", nil,
			[]string{"watchdog.probe_timeout: want a duration such as 2s or 500ms, got 5"}},
		{"duration as words", minimal + "watchdog:\n  probe_timeout: 2 seconds\n", nil,
			[]string{`watchdog.probe_timeout: "2 seconds" is not a duration`}},
		{"bad size unit", group("memory: 8X"), nil, []string{`groups.g.memory: invalid size "8X": unknown unit`}},
		{"size in bits", group("memory: 8Gb"), nil, []string{`groups.g.memory: invalid size "8Gb": "Gb" means bits`}},
		{"negative size", group("memory: -1"), nil, []string{"groups.g.memory: want a size such as 8G, 512M or a number of bytes, got -1"}},
		{"float size", group("memory: 1.5"), nil, []string{"groups.g.memory: want a size such as 8G, 512M or a number of bytes, got 1.5"}},
		{"null value", group("memory:"), nil, []string{"groups.g.memory: want a size such as 8G, 512M or a number of bytes, got nothing"}},
		{"list as scalar", "version: 1\ngroups:\n  g:\n    users: alice\n    memory: 1G\n", nil,
			[]string{`groups.g.users: want a list such as [a, b], got "alice"`}},
		{"nested list entry", "version: 1\ngroups:\n  g:\n    users: [alice, [x]]\n    memory: 1G\n", nil,
			[]string{"groups.g.users[1]: want a name or number, got a list"}},
		{"timestamp", minimal + "simulate:\n  model: 2024-01-01\n", nil, []string{"simulate.model: want a string, got a timestamp"}},
		{"bad memory hides what derives from it", group("memory: lots"), nil, []string{`groups.g.memory: invalid size "lots"`}},
		{"budget ranges", group("memory: 512K\nsm_percent: 0\nmax_clients: 49\ngpus_per_instance: 0\nrequeue_attempts: -1\nmax_sm: 10\ndefault_mem: 1M\nmax_mem: 1M"), nil,
			[]string{
				"groups.g.gpus_per_instance: 0: want at least 1",
				"groups.g.max_clients: 49: want 1-48",
				"groups.g.max_mem: 1M exceeds memory (512K)",
				"groups.g.max_sm: 10 exceeds sm_percent (0)",
				"groups.g.memory: 512K: want at least 1M",
				"groups.g.requeue_attempts: -1: want 0",
				"groups.g.sm_percent: 0: want 1-100",
			}},
		{"reconcile", group("memory: 1G\nreconcile: kill"), nil, []string{`groups.g.reconcile: "kill": want report or terminate`}},
		{"memory grace", group("memory: 1G\nmemory_grace: -1s"), nil, []string{"groups.g.memory_grace: -1s: want 0"}},
		{"tiny shm", group("memory: 1G\nshm_size: 512K"), nil, []string{"groups.g.shm_size: 512K: want at least 1M"}},
		{"sm over 100", group("memory: 1G\nsm_percent: 101"), nil, []string{"groups.g.sm_percent: 101: want 1-100"}},
		{"per-client limits", group("memory: 8G\nmax_sm: 50\ndefault_sm: 60\nmax_mem: 4G\ndefault_mem: 5G"), nil,
			[]string{"groups.g.default_mem: 5G exceeds max_mem (4G)", "groups.g.default_sm: 60 exceeds max_sm (50)"}},
		{"max over budget", group("memory: 8G\nsm_percent: 50\nmax_sm: 60\nmax_mem: 9G"), nil,
			[]string{"groups.g.max_mem: 9G exceeds memory (8G)", "groups.g.max_sm: 60 exceeds sm_percent (50)"}},
		{"tiny default mem", group("memory: 8G\ndefault_mem: 512K"), nil, []string{"groups.g.default_mem: 512K: want at least 1M"}},
		{"gpu selectors", group("memory: 1G\ngpus: [all, 0, MIG-abc, xyz, 0]"), nil,
			[]string{
				`groups.g.gpus[0]: "all" selects every GPU`,
				`groups.g.gpus[2]: "MIG-abc": MIG devices cannot be selected`,
				`groups.g.gpus[3]: "xyz": want "all"`,
				`groups.g.gpus[4]: "0" repeats entry 1`,
			}},
		{"no gpus", group("memory: 1G\ngpus: []"), nil, []string{"groups.g.gpus: empty"}},
		{"members", "version: 1\nadmins:\n  users: [root, root, '4294967295', 'a:b']\ngroups:\n  g:\n    users: ['', 'x y', 99999999999]\n    memory: 1G\n", nil,
			[]string{
				`admins.users[1]: "root" repeats entry 0`,
				`admins.users[2]: "4294967295": not a valid numeric id`,
				`admins.users[3]: "a:b": not a name`,
				`groups.g.users[0]: "": empty`,
				`groups.g.users[1]: "x y": not a name`,
				`groups.g.users[2]: "99999999999": not a valid numeric id`,
			}},
		{"default_for", "version: 1\ngroups:\n  a:\n    users: [alice, bob, '4242']\n    unix_groups: [ml]\n    default_for: [alice, '4242', carol, mallory, '', alice]\n    memory: 1G\n" +
			"  b:\n    users: [alice, '1002']\n    default_for: [alice, bob]\n    memory: 1G\n", nil,
			[]string{
				`groups.a.default_for[2]: "carol" is not one of the group's users`,
				`groups.a.default_for[3]: unknown user "mallory"`,
				`groups.a.default_for[4]: "": empty`,
				`groups.a.default_for[5]: "alice" repeats entry 0`,
				`groups.b.default_for[0]: "alice" is already in the default_for of group a: a user has one default group`,
			}},
		{"unknown names", "version: 1\nadmins:\n  unix_groups: [nogroup]\ngroups:\n  g:\n    users: [alice, mallory, '4242']\n    memory: 1G\n", nil,
			[]string{`admins.unix_groups[0]: unknown unix group "nogroup"`, `groups.g.users[1]: unknown user "mallory"`}},
		{"paths", minimal + "socket: run/mpsd.sock\nrun_dir: /run/mpsd/\nstate_dir: ''\nlog_dir: /var/../log\n", nil,
			[]string{
				`log_dir: "/var/../log" is not a clean path; write "/log"`,
				`run_dir: "/run/mpsd/" is not a clean path; write "/run/mpsd"`,
				`socket: "run/mpsd.sock" is not an absolute path`,
				"state_dir: empty; want an absolute path",
			}},
		{"cgroup parent absolute", minimal + "cgroup:\n  parent: /mpsd\n", nil, []string{`cgroup.parent: "/mpsd": want a relative cgroup path`}},
		{"cgroup parent escapes", minimal + "cgroup:\n  parent: a/../b\n", nil, []string{`cgroup.parent: "a/../b": element ".." is not a plain cgroup name`}},
		{"metrics listen", minimal + "metrics:\n  listen: localhost\n", nil, []string{`metrics.listen: "localhost": want host:port`}},
		{"metrics port", minimal + "metrics:\n  listen: ':99999'\n", nil, []string{`metrics.listen: ":99999": port "99999" is not a number`}},
		{"metrics disabled", minimal + "metrics:\n  listen: ''\n", nil, nil},
		{"mps", minimal + "mps:\n  control: bin/mps\n  path: bin:/usr/bin\n  compute_mode: exclusive\n", nil,
			[]string{
				`mps.compute_mode: "exclusive": want leave or exclusive_process`,
				`mps.control: "bin/mps": give a name looked up on mps.path or an absolute path`,
				`mps.path: element "bin" is not an absolute directory`,
			}},
		{"mps empty", minimal + "mps:\n  control: ''\n  path: ''\n", nil,
			[]string{"mps.control: empty", "mps.path: empty"}},
		{"watchdog", minimal + "watchdog:\n  probe_interval: 1s\n  probe_timeout: 1s\n  probe_failures: 0\n  backoff_initial: 1s\n  backoff_max: 500ms\n  quarantine_after: 0\n  quarantine_window: -1m\n", nil,
			[]string{
				"watchdog.backoff_max: 500ms is shorter than watchdog.backoff_initial (1s)",
				"watchdog.probe_failures: 0: want at least 1",
				"watchdog.probe_timeout: 1s is not shorter than watchdog.probe_interval (1s)",
				"watchdog.quarantine_after: 0: want at least 1",
				"watchdog.quarantine_window: -1m0s: want a positive duration",
			}},
		{"probe_command_every", minimal + "watchdog:\n  probe_command_every: 0\n", nil,
			[]string{"watchdog.probe_command_every: 0: want 1 (every probe) to 1000"}},
		{"zero durations", minimal + "watchdog:\n  probe_interval: 0s\n  backoff_initial: 0s\n", nil,
			[]string{"watchdog.backoff_initial: 0s: want a positive duration", "watchdog.probe_interval: 0s: want a positive duration"}},
		{"limits", minimal + "limits:\n  connections: 0\n  connections_per_user: 0\n  queued_per_user: -1\n  metrics_connections: 0\n", nil,
			[]string{
				"limits.connections: 0: want at least 1",
				"limits.connections_per_user: 0: want at least 1",
				"limits.metrics_connections: 0: want at least 1",
				"limits.queued_per_user: -1: want at least 1",
			}},
		{"limits of one user's leases and metrics", minimal + "limits:\n  running_per_user: 49\n  metrics_connections_per_user: 0\n", nil,
			[]string{
				"limits.metrics_connections_per_user: 0: want at least 1",
				"limits.running_per_user: 49: want 0 (half of each group's max_clients) to 48",
			}},
		{"limits running per user negative", minimal + "limits:\n  running_per_user: -1\n", nil,
			[]string{"limits.running_per_user: -1: want 0 (half of each group's max_clients) to 48"}},
		{"limits per user above all", minimal + "limits:\n  connections: 10\n  connections_per_user: 11\n", nil,
			[]string{"limits.connections_per_user: 11 is more than limits.connections (10)"}},
		{"history bound", minimal + "history:\n  max_size: 1K\n", nil,
			[]string{"history.max_size: 1K: want 64K to 1G (the live history file's bound; a uid's records take at most a quarter of it)"}},
		{"placement", minimal + "placement: random\n", nil, []string{`placement: "random": want binpack or spread`}},
		{"simulate", minimal + "simulate:\n  gpus: 0\n  model: v100\n", nil,
			[]string{"simulate.gpus: 0: want at least 1", `simulate.model: "v100": want one of a100-40g, h100-80g, h200-141g, b200-180g`}},
		{"yaml syntax", "version: 1\ngroups: {\n", nil, []string{"yaml: line"}},
		{"duplicate key", minimal + "version: 1\n", nil, []string{`yaml: unmarshal errors:`}},
		{"second document", minimal + "---\nversion: 1\n", nil, []string{"line 6: a second YAML document"}},
		{"leading marker is fine", "---\n" + minimal, nil, nil},
		{"document end marker", minimal + "...\nextra: 1\n", nil, []string{"line 6: a second YAML document"}},
		{"not a mapping", "- a\n- b\n", nil, []string{"yaml: unmarshal errors:"}},
		{"too large", minimal + "# " + strings.Repeat("x", MaxConfigBytes) + "\n", nil, []string{"file is larger than"}},

		{"host: selectors resolved", group("memory: 1G\ngpus: [gpu-0AAAAAAA, 1bbb, GPU-2cdddddd-1111-2222-3333-444444444444]"), testGPUs, nil},
		{"host: unknown index", group("memory: 1G\ngpus: [0, 9]"), testGPUs,
			[]string{"groups.g.gpus[1]: no GPU with index 9 (this host has GPUs 0, 1, 2, 3)"}},
		{"host: ambiguous prefix", group("memory: 1G\ngpus: [GPU-2c]"), testGPUs,
			[]string{`groups.g.gpus[0]: "GPU-2c" matches GPUs 2, 3; give more of the UUID`}},
		{"host: prefix matches nothing", group("memory: 1G\ngpus: [GPU-ffff]"), testGPUs,
			[]string{`groups.g.gpus[0]: "GPU-ffff" matches no GPU of this host`}},
		{"host: same GPU twice", group("memory: 1G\ngpus: [0, gpu-0aaa]"), testGPUs,
			[]string{`groups.g.gpus[1]: "gpu-0aaa" selects GPU 0, already selected by entry 0`}},
		{"host: other entries still checked", group("memory: 1G\ngpus: [xyz!, 7]"), testGPUs,
			[]string{`groups.g.gpus[0]: "xyz!": want "all"`, "groups.g.gpus[1]: no GPU with index 7"}},
		{"host: sets do not divide", group("memory: 1G\ngpus_per_instance: 3"), testGPUs,
			[]string{"groups.g.gpus_per_instance: 3: the 4 selected GPUs (GPUs 0, 1, 2, 3) do not divide into sets of 3"}},
		{"host: no GPUs", group("memory: 1G"), []GPU{}, []string{"groups.g.gpus: selects no GPU of this host (it has no GPUs)"}},
		{"host: one group over a card", group("memory: 50G\ngpus: [0, 2]"), testGPUs,
			[]string{"groups.g.memory: 50G more than the 40G memory of GPU 0"}},
		{"host: groups together over cards", "version: 1\ngroups:\n  batch:\n    users: [bob]\n    memory: 20G\n  inference:\n    users: [alice]\n    memory: 30G\n    gpus: [0, 1, 2]\n", testGPUs,
			[]string{"groups.inference.memory: 30G together with groups.batch.memory (20G) is 50G, more than the 40G memory of GPUs 0, 1"}},
		{"host: exactly the card", "version: 1\ngroups:\n  batch:\n    users: [bob]\n    memory: 20G\n  inference:\n    users: [alice]\n    memory: 20G\n", testGPUs, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.yaml), Host{GPUs: tc.gpus, Users: testUsers})
			if tc.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			got := problemsOf(t, err)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("problem %d = %q\nwant prefix %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestInstances(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  string
		want [][]int
	}{
		{"one GPU each", "gpus: [all]", [][]int{{0}, {1}, {2}, {3}}},
		{"pairs", "gpus: [all]\ngpus_per_instance: 2", [][]int{{0, 1}, {2, 3}}},
		{"index order, not entry order", "gpus: [3, 1]\ngpus_per_instance: 2", [][]int{{1, 3}}},
		{"by UUID", "gpus: [GPU-2cdd, 1bbbbbbb]", [][]int{{1}, {3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustParse(t, group("memory: 1G\n"+tc.set), Host{GPUs: testGPUs})
			if got := cfg.Groups[0].Instances; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Instances = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestProblemsReportedAllAtOnce(t *testing.T) {
	yaml := "version: 3\nplacement: random\nwatchdog:\n  probe_failures: 0\ngroups:\n  a:\n    memory: 1X\n  b:\n    users: [alice]\n    memory: 1G\n    sm_percent: 200\n    typo: 1\n"
	_, err := Parse(strings.NewReader(yaml), Host{Users: testUsers})
	got := problemsOf(t, err)
	want := []string{"groups.a.memory", "groups.a.users", "groups.b.sm_percent", "groups.b.typo", "placement", "version", "watchdog.probe_failures"}
	var keys []string
	var ce *ConfigError
	errors.As(err, &ce)
	for _, p := range ce.Problems {
		keys = append(keys, p.Key)
	}
	if !slices.Equal(keys, want) {
		t.Errorf("problem keys %v, want %v\n%s", keys, want, strings.Join(got, "\n"))
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "policy: invalid config: 7 problems\n  groups.a.memory: ") {
		t.Errorf("error text %q", msg)
	}
}

func TestGroupLookup(t *testing.T) {
	cfg := mustParse(t, "version: 1\ngroups:\n  b:\n    users: [bob]\n    memory: 1G\n  a:\n    users: [alice]\n    memory: 1G\n", Host{})
	if names := []string{cfg.Groups[0].Name, cfg.Groups[1].Name}; !slices.Equal(names, []string{"a", "b"}) {
		t.Errorf("groups in order %v, want by name", names)
	}
	if g, ok := cfg.Group("b"); !ok || g.Name != "b" {
		t.Errorf("Group(b) = %v, %v", g, ok)
	}
	if _, ok := cfg.Group("c"); ok {
		t.Error("Group(c) found")
	}
}

func TestLoadFileAndCheckFile(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", minimal)
	bad := writeFile(t, dir, "bad.yaml", "version: 1\n")
	cfg, err := LoadFile(good, Host{Users: testUsers})
	if err != nil || cfg.Groups[0].Name != "inference" {
		t.Fatalf("LoadFile(good) = %v, %v", cfg, err)
	}
	if err := CheckFile(good, Host{Users: testUsers, GPUs: testGPUs}); err != nil {
		t.Errorf("CheckFile(good) = %v", err)
	}
	err = CheckFile(bad, Host{Users: testUsers})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "invalid config "+bad+": groups: no groups") {
		t.Errorf("CheckFile(bad) = %v; want the path and the problem", err)
	}
	if err := CheckFile(dir+"/missing.yaml", Host{}); !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrInvalidConfig) {
		t.Errorf("CheckFile(missing) = %v; want a not-exist error", err)
	}
	if err := CheckFile(dir, Host{}); err == nil || errors.Is(err, ErrInvalidConfig) {
		t.Errorf("CheckFile(directory) = %v; want a read error", err)
	}
}

func TestParseReadError(t *testing.T) {
	_, err := Parse(errReader{}, Host{})
	if !errors.Is(err, errRead) || errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Parse(failing reader) = %v; want the read error", err)
	}
}

var errRead = errors.New("disk on fire")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errRead }

func TestSystemUsers(t *testing.T) {
	// Every Linux host has root (uid 0) and group root or wheel (gid 0).
	if uid, err := (SystemUsers{}).UserID("root"); err != nil || uid != 0 {
		t.Errorf("UserID(root) = %d, %v", uid, err)
	}
	if _, err := (SystemUsers{}).UserID("no-such-user-mpsd-test"); err == nil {
		t.Error("UserID of a missing user succeeded")
	}
	if _, err := (SystemUsers{}).GroupID("no-such-group-mpsd-test"); err == nil {
		t.Error("GroupID of a missing group succeeded")
	}
}

func FuzzParse(f *testing.F) {
	design, err := os.ReadFile("testdata/design.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(design), minimal, "", "{", "version: 1\n", "- a\n", "version: 1\n---\nx: 1\n",
		group("memory: 8G\ngpus: [0, GPU-2c, all]\ngpus_per_instance: 2"),
		group("memory: 1.5G\nmax_mem: 1G\ndefault_mem: 512M\nusers: [1001, alice, '']"),
		"version: 1\ngroups:\n  A.B: {}\n  c:\n  d: 5\nwatchdog: 3\n",
		"version: 1\ngroups:\n  g:\n    memory: [1]\n    users: {a: b}\n    multiuser: 1\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, yaml string) {
		cfg, err := Parse(strings.NewReader(yaml), Host{GPUs: testGPUs, Users: testUsers})
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) || len(ce.Problems) == 0 {
				t.Fatalf("error %v is not a *ConfigError with problems", err)
			}
			return
		}
		// What Parse accepts is consistent.
		if cfg.Version != Version || len(cfg.Groups) == 0 {
			t.Fatalf("accepted version %d with %d groups", cfg.Version, len(cfg.Groups))
		}
		for _, g := range cfg.Groups {
			if !(1 <= g.DefaultSM && g.DefaultSM <= g.MaxSM && g.MaxSM <= g.SMPercent && g.SMPercent <= 100) ||
				!(units.MiB <= g.DefaultMem && g.DefaultMem <= g.MaxMem && g.MaxMem <= g.Memory) ||
				!(1 <= g.MaxClients && g.MaxClients <= MaxClientsLimit) || len(g.Instances) == 0 ||
				groupNameProblem(g.Name) != "" {
				t.Fatalf("accepted inconsistent group %+v", g)
			}
		}
		if _, err := Parse(strings.NewReader(yaml), Host{GPUs: testGPUs, Users: testUsers}); err != nil {
			t.Fatalf("second parse of the same text failed: %v", err)
		}
	})
}
