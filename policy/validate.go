package policy

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/mpsd/mpsd/internal/gpusel"
	"github.com/mpsd/mpsd/internal/units"
)

// simulateModels are the mock GPU models mpsd --simulate offers.
var simulateModels = []string{"a100-40g", "h100-80g", "h200-141g", "b200-180g"}

// validate checks every value on its own and against the others.
func (d *decoder) validate(c *Config) {
	d.check("version", c.Version == Version, "unsupported version %d; this mpsd reads version %d", c.Version, Version)
	for _, p := range []struct {
		key, val string
	}{{"socket", c.Socket}, {"run_dir", c.RunDir}, {"state_dir", c.StateDir}, {"log_dir", c.LogDir}} {
		d.absPath(p.key, p.val)
	}
	d.overlappingDirs(c)
	d.cgroupParent(c.Cgroup.Parent)
	d.listen("metrics.listen", c.Metrics.Listen)

	d.check("mps.control", c.MPS.Control != "", "empty; name nvidia-cuda-mps-control or give its absolute path")
	d.check("mps.control", !strings.Contains(c.MPS.Control, "/") || filepath.IsAbs(c.MPS.Control),
		"%q: give a name looked up on mps.path or an absolute path", c.MPS.Control)
	d.check("mps.path", c.MPS.Path != "", "empty; the daemons need a PATH to find nvidia-cuda-mps-server")
	for _, dir := range filepath.SplitList(c.MPS.Path) {
		d.check("mps.path", filepath.IsAbs(dir),
			"element %q is not an absolute directory; a relative PATH entry lets the working directory choose the programs root runs", dir)
	}
	d.check("mps.compute_mode", c.MPS.ComputeMode == ComputeLeave || c.MPS.ComputeMode == ComputeExclusiveProcess,
		"%q: want %s or %s", c.MPS.ComputeMode, ComputeLeave, ComputeExclusiveProcess)

	w := c.Watchdog
	d.positive("watchdog.probe_interval", w.ProbeInterval)
	d.positive("watchdog.probe_timeout", w.ProbeTimeout)
	if d.ok("watchdog.probe_interval") && w.ProbeInterval > 0 {
		d.check("watchdog.probe_timeout", w.ProbeTimeout < w.ProbeInterval,
			"%v is not shorter than watchdog.probe_interval (%v); probes would overlap", w.ProbeTimeout, w.ProbeInterval)
	}
	d.check("watchdog.probe_failures", w.ProbeFailures >= 1, "%d: want at least 1", w.ProbeFailures)
	d.check("watchdog.probe_command_every", w.ProbeCommandEvery >= 1 && w.ProbeCommandEvery <= 1000, "%d: want 1 (every probe) to 1000", w.ProbeCommandEvery)
	d.positive("watchdog.backoff_initial", w.BackoffInitial)
	if d.ok("watchdog.backoff_initial") && w.BackoffInitial > 0 {
		d.check("watchdog.backoff_max", w.BackoffMax >= w.BackoffInitial,
			"%v is shorter than watchdog.backoff_initial (%v)", w.BackoffMax, w.BackoffInitial)
	}
	d.check("watchdog.quarantine_after", w.QuarantineAfter >= 1, "%d: want at least 1", w.QuarantineAfter)
	d.positive("watchdog.quarantine_window", w.QuarantineWindow)

	lim := c.Limits
	d.check("limits.connections", lim.Connections >= 1, "%d: want at least 1", lim.Connections)
	d.check("limits.connections_per_user", lim.ConnectionsPerUser >= 1, "%d: want at least 1", lim.ConnectionsPerUser)
	if d.ok("limits.connections") && lim.Connections >= 1 {
		d.check("limits.connections_per_user", lim.ConnectionsPerUser <= lim.Connections,
			"%d is more than limits.connections (%d)", lim.ConnectionsPerUser, lim.Connections)
	}
	d.check("limits.queued_per_user", lim.QueuedPerUser >= 1, "%d: want at least 1", lim.QueuedPerUser)
	d.check("limits.metrics_connections", lim.MetricsConnections >= 1, "%d: want at least 1", lim.MetricsConnections)
	d.check("limits.metrics_connections_per_user", lim.MetricsConnectionsPerUser >= 1, "%d: want at least 1", lim.MetricsConnectionsPerUser)
	d.check("limits.running_per_user", 0 <= lim.RunningPerUser && lim.RunningPerUser <= MaxClientsLimit,
		"%d: want 0 (half of each group's max_clients) to %d", lim.RunningPerUser, MaxClientsLimit)

	d.check("history.max_size", c.History.MaxSize >= 64*units.KiB && c.History.MaxSize <= units.GiB,
		"%s: want 64K to 1G (the live history file's bound; a uid's records take at most a quarter of it)", units.FormatSize(c.History.MaxSize))

	d.check("placement", c.Placement == Binpack || c.Placement == Spread, "%q: want %s or %s", c.Placement, Binpack, Spread)
	d.members("admins.users", c.Admins.Users)
	d.members("admins.unix_groups", c.Admins.UnixGroups)

	d.check("simulate.gpus", c.Simulate.GPUs >= 1, "%d: want at least 1", c.Simulate.GPUs)
	d.check("simulate.model", slices.Contains(simulateModels, c.Simulate.Model),
		"%q: want one of %s", c.Simulate.Model, strings.Join(simulateModels, ", "))

	for i := range c.Groups {
		d.validateGroup(&c.Groups[i])
		// MPS puts sockets in the pipe directory
		// <run_dir>/<group>/GPU-<uuid>/pipe; the longest,
		// control_privileged, must fit a unix socket address (107 bytes),
		// or the control daemon fails with nothing but "Internal error".
		if g := &c.Groups[i]; d.ok("run_dir") && len(c.RunDir)+len(g.Name)+pipeSocketOverhead > maxSocketPath {
			d.problem("run_dir", "%q is too long for group %s: its MPS sockets (%s/%s/GPU-<uuid>/pipe/control_privileged) would be %d bytes, more than the %d a unix socket path may have; use a shorter run_dir (or group name)",
				c.RunDir, g.Name, c.RunDir, g.Name, len(c.RunDir)+len(g.Name)+pipeSocketOverhead, maxSocketPath)
		}
	}
}

// A unix socket path holds at most 107 bytes; the pipe directory adds
// "/<group>/GPU-" + 36-byte UUID + "/pipe/control_privileged" to run_dir.
const (
	maxSocketPath      = 107
	pipeSocketOverhead = len("/") + len("/GPU-") + 36 + len("/pipe/control_privileged")
)

func (d *decoder) validateGroup(g *Group) {
	k := func(key string) string { return groupsKey + "." + g.Name + "." + key }

	d.members(k("users"), g.Users)
	d.members(k("unix_groups"), g.UnixGroups)
	d.members(k("default_for"), g.DefaultFor)
	if d.ok(k("users"), k("unix_groups")) {
		d.check(k("users"), len(g.Users)+len(g.UnixGroups) > 0, "empty, and so is unix_groups: nobody could use the group")
	}

	if d.ok(k("gpus")) {
		d.check(k("gpus"), len(g.GPUs) > 0, "empty; select GPUs with [all], indexes or UUIDs")
		seen := map[string]int{}
		for i, s := range g.GPUs {
			key := fmt.Sprintf("%s[%d]", k("gpus"), i)
			sel, err := gpusel.Parse(s)
			var e *gpusel.Error
			if errors.As(err, &e) {
				d.fail(key, "%q: %s", s, e.Reason)
				continue
			}
			if sel.Kind() == gpusel.All && len(g.GPUs) > 1 {
				d.problem(key, `"all" selects every GPU; it cannot be combined with other entries`)
			}
			norm := strings.ToLower(s)
			if j, dup := seen[norm]; dup {
				d.problem(key, "%q repeats entry %d", s, j)
			}
			seen[norm] = i
		}
	}
	d.check(k("gpus_per_instance"), g.GPUsPerInstance >= 1, "%d: want at least 1", g.GPUsPerInstance)

	d.check(k("sm_percent"), 1 <= g.SMPercent && g.SMPercent <= 100, "%d: want 1-100 (percent of each GPU's SMs)", g.SMPercent)
	d.check(k("memory"), g.Memory >= units.MiB, "%s: want at least 1M", units.FormatSize(g.Memory))
	d.check(k("max_clients"), 1 <= g.MaxClients && g.MaxClients <= MaxClientsLimit,
		"%d: want 1-%d (MPS serves at most %d clients per GPU)", g.MaxClients, MaxClientsLimit, MaxClientsLimit)

	d.check(k("max_sm"), g.MaxSM >= 1, "%d: want at least 1", g.MaxSM)
	if d.ok(k("sm_percent")) {
		d.check(k("max_sm"), g.MaxSM <= g.SMPercent, "%d exceeds sm_percent (%d)", g.MaxSM, g.SMPercent)
	}
	d.check(k("default_sm"), g.DefaultSM >= 1, "%d: want at least 1", g.DefaultSM)
	if d.ok(k("max_sm")) {
		d.check(k("default_sm"), g.DefaultSM <= g.MaxSM, "%d exceeds max_sm (%d)", g.DefaultSM, g.MaxSM)
	}
	d.check(k("max_mem"), g.MaxMem >= units.MiB, "%s: want at least 1M", units.FormatSize(g.MaxMem))
	if d.ok(k("memory")) {
		d.check(k("max_mem"), g.MaxMem <= g.Memory, "%s exceeds memory (%s)", units.FormatSize(g.MaxMem), units.FormatSize(g.Memory))
	}
	d.check(k("default_mem"), g.DefaultMem >= units.MiB,
		"%s: want at least 1M, the smallest limit MPS enforces", units.FormatSize(g.DefaultMem))
	if d.ok(k("max_mem")) {
		d.check(k("default_mem"), g.DefaultMem <= g.MaxMem, "%s exceeds max_mem (%s)", units.FormatSize(g.DefaultMem), units.FormatSize(g.MaxMem))
	}
	d.check(k("requeue_attempts"), g.RequeueAttempts >= 0, "%d: want 0 (never requeue) or more", g.RequeueAttempts)
	d.check(k("memory_grace"), g.MemoryGrace >= 0, "%s: want 0 (no check) or more", g.MemoryGrace)
	d.check(k("shm_size"), g.ShmSize >= units.MiB, "%s: want at least 1M (the private /dev/shm of each instance the kubelet device plugin serves)", units.FormatSize(g.ShmSize))
	d.check(k("reconcile"), g.Reconcile == ReconcileReport || g.Reconcile == ReconcileTerminate,
		"%q: want %s or %s", g.Reconcile, ReconcileReport, ReconcileTerminate)
}

func (d *decoder) positive(key string, v time.Duration) {
	d.check(key, v > 0, "%v: want a positive duration", v)
}

func (d *decoder) absPath(key, p string) {
	if !d.ok(key) {
		return
	}
	switch {
	case p == "":
		d.problem(key, "empty; want an absolute path")
	case !filepath.IsAbs(p):
		d.problem(key, "%q is not an absolute path", p)
	case filepath.Clean(p) != p:
		d.problem(key, "%q is not a clean path; write %q", p, filepath.Clean(p))
	}
}

func (d *decoder) cgroupParent(p string) {
	const key = "cgroup.parent"
	if !d.ok(key) {
		return
	}
	if p == "" || filepath.IsAbs(p) {
		d.problem(key, "%q: want a relative cgroup path such as mpsd or mpsd.slice/leases", p)
		return
	}
	for _, e := range strings.Split(p, "/") {
		if e == "" || e == "." || e == ".." || strings.ContainsFunc(e, func(r rune) bool {
			return !(r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_' || r == '.' || r == '@'))
		}) {
			d.problem(key, "%q: element %q is not a plain cgroup name", p, e)
			return
		}
	}
}

func (d *decoder) listen(key, addr string) {
	if addr == "" || !d.ok(key) {
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		d.problem(key, "%q: want host:port such as 127.0.0.1:9486, or empty to disable metrics", addr)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > math.MaxUint16 {
		d.problem(key, "%q: port %q is not a number from 0 to 65535", addr, port)
	}
}

// members checks a list of user or unix group names and numeric ids.
func (d *decoder) members(key string, list []string) {
	if !d.ok(key) {
		return
	}
	seen := map[string]int{}
	for i, s := range list {
		ekey := fmt.Sprintf("%s[%d]", key, i)
		if why := memberProblem(s); why != "" {
			d.fail(ekey, "%q: %s", s, why)
			continue
		}
		if j, dup := seen[s]; dup {
			d.problem(ekey, "%q repeats entry %d", s, j)
		}
		seen[s] = i
	}
}

// memberProblem says why s is neither a name nor a numeric id, or "".
func memberProblem(s string) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > 256:
		return "longer than 256 bytes"
	case isDigits(s):
		if n, err := strconv.ParseUint(s, 10, 32); err != nil || n == math.MaxUint32 {
			return "not a valid numeric id"
		}
		return ""
	case strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == ':' || r == ',' || r == '/' || r == unicode.ReplacementChar
	}):
		return "not a name: no spaces, control characters, ':', ',' or '/'"
	}
	return ""
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// validateDriver checks the config against what the host's driver's MPS
// can run: a multiuser group needs a control daemon that takes
// -multiuser-server. An empty or unparsable driver version checks
// nothing.
func (d *decoder) validateDriver(c *Config, driver string) {
	major := DriverMajor(driver)
	if major == 0 || major >= MultiuserDriver {
		return
	}
	for i := range c.Groups {
		g := &c.Groups[i]
		d.check(groupsKey+"."+g.Name+".multiuser", !g.Multiuser,
			"true needs NVIDIA driver %d or newer (its MPS control daemon's -multiuser-server); this host runs %s",
			MultiuserDriver, driver)
	}
}

// validateHost checks the config against the host's GPUs and records each
// group's instance GPU sets.
func (d *decoder) validateHost(c *Config, gpus []GPU) {
	byIndex := map[int]*GPU{}
	indexes := make([]int, 0, len(gpus))
	for i := range gpus {
		byIndex[gpus[i].Index] = &gpus[i]
		indexes = append(indexes, gpus[i].Index)
	}
	slices.Sort(indexes)

	onGPU := map[int][]*Group{} // GPU index -> groups whose memory counts there
	for gi := range c.Groups {
		g := &c.Groups[gi]
		key := groupsKey + "." + g.Name + ".gpus"
		if !d.ok(key) {
			continue
		}
		selected := d.resolveGPUs(key, g.GPUs, gpus, indexes)
		if selected == nil {
			continue
		}
		if len(selected) == 0 {
			d.problem(key, "selects no GPU of this host (it has %s)", describeIndexes(indexes))
			continue
		}
		if n := g.GPUsPerInstance; n >= 1 && d.ok(groupsKey+"."+g.Name+".gpus_per_instance") {
			if len(selected)%n != 0 {
				d.problem(groupsKey+"."+g.Name+".gpus_per_instance",
					"%d: the %d selected GPUs (%s) do not divide into sets of %d", n, len(selected), describeIndexes(selected), n)
			} else {
				for i := 0; i < len(selected); i += n {
					g.Instances = append(g.Instances, slices.Clone(selected[i:i+n]))
				}
			}
		}
		if d.ok(groupsKey + "." + g.Name + ".memory") {
			for _, idx := range selected {
				onGPU[idx] = append(onGPU[idx], g)
			}
		}
	}

	// EXCLUSIVE_PROCESS admits one process per GPU, and every group runs its
	// own MPS server: groups sharing a GPU would lock each other out.
	if c.MPS.ComputeMode == ComputeExclusiveProcess && d.ok("mps.compute_mode") {
		for _, idx := range indexes {
			if gs := onGPU[idx]; len(gs) > 1 {
				names := make([]string, len(gs))
				for i, g := range gs {
					names[i] = g.Name
				}
				d.problem("mps.compute_mode", "exclusive_process lets one process (one MPS server) use a GPU, but GPU %d is shared by groups %s, each with its own server; use leave, or give each GPU to one group",
					idx, strings.Join(names, ", "))
				break
			}
		}
	}

	// Report each over-committed combination of groups once, with every
	// GPU it over-commits, on the memory key of its largest budget.
	type overcommit struct {
		groups string
		total  int64
	}
	var order []overcommit
	where := map[overcommit][]int{}
	byOver := map[overcommit][]*Group{}
	for _, idx := range indexes {
		var sum int64
		names := make([]string, 0, len(onGPU[idx]))
		for _, g := range onGPU[idx] {
			sum += g.Memory
			names = append(names, g.Name)
		}
		if sum <= byIndex[idx].Memory {
			continue
		}
		o := overcommit{strings.Join(names, ","), byIndex[idx].Memory}
		if _, seen := where[o]; !seen {
			order = append(order, o)
			byOver[o] = onGPU[idx]
		}
		where[o] = append(where[o], idx)
	}
	for _, o := range order {
		gs := slices.Clone(byOver[o])
		slices.SortStableFunc(gs, func(a, b *Group) int { return cmp.Compare(b.Memory, a.Memory) })
		var msg strings.Builder
		sum := gs[0].Memory
		msg.WriteString(units.FormatSize(gs[0].Memory))
		for i, g := range gs[1:] {
			if i == 0 {
				msg.WriteString(" together with ")
			} else {
				msg.WriteString(", ")
			}
			fmt.Fprintf(&msg, "%s.%s.memory (%s)", groupsKey, g.Name, units.FormatSize(g.Memory))
			sum += g.Memory
		}
		if len(gs) > 1 {
			fmt.Fprintf(&msg, " is %s,", units.FormatSize(sum))
		}
		fmt.Fprintf(&msg, " more than the %s memory of %s", units.FormatSize(o.total), describeGPUs(where[o]))
		d.problem(groupsKey+"."+gs[0].Name+".memory", "%s", msg.String())
	}
}

// resolveGPUs returns the sorted indexes a group's gpus select, or nil
// after reporting a problem.
func (d *decoder) resolveGPUs(key string, sels []string, gpus []GPU, indexes []int) []int {
	if len(sels) > 1 && slices.ContainsFunc(sels, func(s string) bool { return strings.EqualFold(s, "all") }) {
		return nil // reported by validateGroup
	}
	inv := make([]gpusel.GPU, len(gpus))
	for i, g := range gpus {
		inv[i] = gpusel.GPU{Index: g.Index, UUID: g.UUID}
	}
	picked := map[int]int{} // GPU index -> entry
	okAll := true
	for i, s := range sels {
		ekey := fmt.Sprintf("%s[%d]", key, i)
		sel, err := gpusel.Parse(s)
		if err != nil { // reported by validateGroup; check the others
			okAll = false
			continue
		}
		pos, err := sel.Resolve(inv)
		if err != nil {
			// "all" fails only on a host without GPUs, which validateHost
			// reports for the whole group.
			if sel.Kind() != gpusel.All {
				d.unresolved(ekey, sel, err, indexes)
				okAll = false
			}
			continue
		}
		for _, p := range pos {
			idx := gpus[p].Index
			if j, dup := picked[idx]; dup {
				if !strings.EqualFold(sels[j], s) { // else reported by validateGroup
					d.problem(ekey, "%q selects GPU %d, already selected by entry %d", s, idx, j)
				}
				okAll = false
			}
			picked[idx] = i
		}
	}
	if !okAll {
		return nil
	}
	out := make([]int, 0, len(picked))
	for idx := range picked {
		out = append(out, idx)
	}
	slices.Sort(out)
	return out
}

// unresolved reports why a well-formed entry selects no GPU, in policy's
// words: the host's indexes rather than a count, and what to do about an
// ambiguous prefix.
func (d *decoder) unresolved(key string, sel gpusel.Selector, err error, indexes []int) {
	var e *gpusel.Error
	switch {
	case errors.Is(err, gpusel.ErrUnknownIndex):
		d.problem(key, "no GPU with index %d (this host has %s)", sel.Index(), describeIndexes(indexes))
	case errors.Is(err, gpusel.ErrAmbiguous) && errors.As(err, &e):
		match := make([]int, len(e.Matches))
		for i, g := range e.Matches {
			match[i] = g.Index
		}
		d.problem(key, "%q matches %s; give more of the UUID", sel, describeGPUs(match))
	default:
		d.problem(key, "%q matches no GPU of this host", sel)
	}
}

func describeIndexes(idx []int) string {
	if len(idx) == 0 {
		return "no GPUs"
	}
	parts := make([]string, len(idx))
	for i, n := range idx {
		parts[i] = strconv.Itoa(n)
	}
	return "GPUs " + strings.Join(parts, ", ")
}

func describeGPUs(idx []int) string {
	if len(idx) == 1 {
		return "GPU " + strconv.Itoa(idx[0])
	}
	return describeIndexes(idx)
}
