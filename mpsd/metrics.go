package mpsd

import (
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/buildinfo"
	"github.com/mpsd/mpsd/policy"
)

// Metric descriptors (docs/architecture.md#metrics-and-systemd). The instance metrics are labelled by
// the first GPU of the instance's set (gpu = UUID, gpu_index) and group;
// nothing is labelled per lease, so the series count follows the host's
// instances, not its workload.
var (
	instLabels = []string{"gpu", "gpu_index", "group"}
	gpuLabels  = []string{"gpu", "gpu_index"}

	descMPSInfo       = gaugeFamily("mpsd_mps_info", "The NVIDIA driver and the MPS control binary version (the CUDA version of the driver, from 580 on; empty before), both as NVML reports them, of the instance; always 1.", append(instLabels[:3:3], "driver_version", "mps_version"))
	descInstanceUp    = gaugeFamily("mpsd_instance_up", "1 when the instance's MPS control daemon is up and takes clients.", instLabels)
	descInstanceState = gaugeFamily("mpsd_instance_state", "1 for the instance's current state, 0 for the others.", append(instLabels[:3:3], "state"))
	descRestarts      = counterFamily("mpsd_server_restarts_total", "Recoveries of the instance (revoke, restart, requeue), by the fault that caused them.", append(instLabels[:3:3], "reason"))
	descFaults        = counterFamily("mpsd_faults_total", "Faults reported for the instance, by kind.", append(instLabels[:3:3], "kind"))
	descQuarantined   = gaugeFamily("mpsd_quarantined", "1 while the instance is quarantined (mpsctl resume lifts it).", instLabels)
	descLogLost       = gaugeFamily("mpsd_mps_log_lost", "1 while the instance's control daemon no longer logs mpsd's probes (its log FIFO may have been poisoned); it is replaced once no lease runs on it.", instLabels)
	descClients       = gaugeFamily("mpsd_clients", "Running leases on the instance.", instLabels)
	descSM            = gaugeFamily("mpsd_sm_allocated_percent", "Sum of the running leases' SM percentage, per GPU of the instance.", instLabels)
	descMem           = gaugeFamily("mpsd_memory_allocated_bytes", "Sum of the running leases' pinned device memory, per GPU of the instance.", instLabels)
	descQueue         = gaugeFamily("mpsd_queue_length", "Requests waiting in the group's queue.", []string{"group"})
	descGranted       = counterFamily("mpsd_leases_granted_total", "Leases granted in the group, requeued runs included.", []string{"group"})
	descRequeues      = counterFamily("mpsd_requeues_total", "Leases revoked by a fault and put back in the group's queue.", []string{"group"})
	descKillFailures  = counterFamily("mpsd_cgroup_kill_failures_total", "Kills of a lease's cgroup that failed (its processes would not die); the kill is retried.", []string{"group"})
	descKillStuck     = gaugeFamily("mpsd_leases_kill_stuck", "Leases whose processes would not die, holding their capacity while mpsd retries the kill.", nil)
	descXid           = counterFamily("mpsd_gpu_xid_errors_total", "Xid errors NVML reported for the GPU.", append(gpuLabels[:2:2], "xid"))
	descGPUMem        = gaugeFamily("mpsd_gpu_memory_used_bytes", "GPU memory in use, as NVML reports it.", gpuLabels)
	descGPUUtil       = gaugeFamily("mpsd_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the GPU (0-1).", gpuLabels)
	descUnverified    = counterFamily("mpsd_unverified_mps_records_total", "MPS log records (or server list entries) that named a process which is no verified server of the instance's daemon, and were ignored: forged by a local user who can reach the pipe directory, or about a server gone before it could be checked.", instLabels)
	descUnreconciled  = counterFamily("mpsd_unreconciled_clients_total", "GPU processes found on an instance that no lease of it accounts for, by kind: unleased (an MPS client without a lease), wrong_instance (a lease's process on another instance's server), bypass (a compute process beside MPS). group is the group it was found in (for bypass, the group its owner belongs to; empty for none).", []string{"group", "kind"})
	descReconKilled   = counterFamily("mpsd_unreconciled_clients_terminated_total", "Processes of mpsd_unreconciled_clients_total that mpsd ended (the group's reconcile: terminate), by kind.", []string{"group", "kind"})
	descPodMemExceed  = counterFamily("mpsd_pod_memory_exceeded_total", "Containers of pods (kubelet device-plugin leases) whose CUDA processes mpsd ended because they held more device memory than their lease for longer than the group's memory_grace (the lease ends, not requeued; the kubelet restarts the container).", []string{"group"})
	descLeaseMemUsed  = gaugeFamily("mpsd_lease_memory_used_bytes", "Device memory NVML reports for the group's running leases' processes, summed per lease on its GPU where it is highest, and over the group's leases.", []string{"group"})
	descLeaseMemByID  = gaugeFamily("mpsd_lease_memory_used_bytes_by_lease", "Device memory NVML reports for one running lease's processes, summed on its GPU where it is highest (metrics.per_lease: true only).", []string{"group", "lease"})
	descCapDrift      = counterFamily("mpsd_mps_cap_drift_total", "Times a cap of an MPS server of the instance (cap: thread_percentage, pinned_memory) was found off the group's max_sm or max_mem and set back: its owner changed it, or the server started with other defaults.", append(instLabels[:3:3], "cap"))
	descShmUsed       = gaugeFamily("mpsd_shm_used_bytes", "Bytes the files in the instance's private /dev/shm hold (a tmpfs of its own, for a group the kubelet device plugin serves; absent otherwise).", instLabels)
	descShmSize       = gaugeFamily("mpsd_shm_size_bytes", "Size of the instance's private /dev/shm (the group's shm_size).", instLabels)
	descShmFull       = gaugeFamily("mpsd_shm_full", "1 while the instance's private /dev/shm is full (no byte or no inode left): shared memory allocations of its MPS servers, clients and pods fail until it is emptied, once no lease of the instance runs.", instLabels)
	descShmCleaned    = counterFamily("mpsd_shm_cleaned_total", "Times mpsd emptied the instance's full private /dev/shm, no lease of the instance running.", instLabels)
	descReloadOK      = gaugeFamily("mpsd_config_last_reload_success", "1 if the last config reload (or the initial load) succeeded.", nil)
	descReloadTime    = gaugeFamily("mpsd_config_last_reload_timestamp_seconds", "When the config was last loaded or reload attempted.", nil)
)

var faultKinds = []string{faultDaemonExit, faultServerExit, faultFatalException, faultServerFault, faultHung, faultXid, faultAdmin}

// instanceStates are the states of mpsd_instance_state, as status shows
// them (instance.shownState): drained and retiring told apart from
// draining.
var instanceStates = []string{api.InstanceStarting, api.InstanceReady, api.InstanceRecovering, api.InstanceQuarantined, api.InstanceDraining, api.InstanceDrained, api.InstanceRetiring}

// The orders the exposition sorts the kinds of faultKinds, instanceStates,
// capKinds and reconKinds in. A scrape emits its series in the exposition's
// order (instances by GPU and group, then these): the sort of a
// family's series (ownScrape.families) then finds them sorted.
var (
	faultOrder = sortedOrder(faultKinds)
	stateOrder = sortedOrder(instanceStates)
	capOrder   = sortedOrder(capKinds)
	reconOrder = sortedOrder(reconKinds)
)

// sortedOrder is the indexes of names, in the order of the names.
func sortedOrder(names []string) []int {
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(names[a], names[b]) })
	return order
}

// metrics is the daemon's counters that live outside instances, and its
// registry. Guarded by Daemon.mu except the histogram, which locks itself.
type metrics struct {
	reg      *prometheus.Registry
	wait     *prometheus.HistogramVec
	granted  map[string]uint64
	requeues map[string]uint64
	// killFailures counts failed kills of lease cgroups per group.
	killFailures map[string]uint64
	// podMemExceeded counts pods' containers ended for their lease's
	// memory, by group (podprocs.go).
	podMemExceeded map[string]uint64
	// unreconciled and reconTerminated count reconciliation's findings
	// and the processes it ended, by (group, kind).
	unreconciled    map[[2]string]uint64
	reconTerminated map[[2]string]uint64
	xids            map[[2]uint64]uint64 // (gpu index, xid) → count
	reloadOK        bool
	reloadAt        time.Time
	gpuUUIDs        []string
	gpuIndexStr     []string
	// gpuLabels are each GPU's label pairs (gpu, gpu_index), by index;
	// groupLabels each group's of the config groupLabelsOf.
	gpuLabels     [][]*dto.LabelPair
	groupLabels   map[string]*groupLabels
	groupLabelsOf *policy.Config
	// instances is a scrape's list of the instances, kept for the next.
	instances []*instance
	// reconRuns counts the reconciliations run, by instance key (not
	// exported: the pacing of reconcileSoon is tested by it).
	reconRuns map[string]uint64

	// What outsiders make mpsd hold and mpsd's own exhaustion; these lock
	// themselves.
	connOpen     *prometheus.GaugeVec
	connRefused  *prometheus.CounterVec
	queueRefused prometheus.Counter
	localErrors  *prometheus.CounterVec
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mpsd_admission_wait_seconds",
			Help:    "Time a lease waited in its group's queue before its grant.",
			Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10, 60, 300, 1800, 7200},
		}, []string{"group"}),
		granted:         map[string]uint64{},
		requeues:        map[string]uint64{},
		killFailures:    map[string]uint64{},
		unreconciled:    map[[2]string]uint64{},
		reconTerminated: map[[2]string]uint64{},
		podMemExceeded:  map[string]uint64{},
		reconRuns:       map[string]uint64{},
		xids:            map[[2]uint64]uint64{},
		reloadOK:        true,
		reloadAt:        time.Now(),
	}
	var gpus []gpu.Info
	if d.host != nil { // nil: the simulation's daemon, which has no host
		gpus = d.host.GPUs()
	}
	for _, g := range gpus {
		m.gpuUUIDs = append(m.gpuUUIDs, g.UUID)
		m.gpuIndexStr = append(m.gpuIndexStr, strconv.Itoa(g.Index))
		m.gpuLabels = append(m.gpuLabels, []*dto.LabelPair{labelPair("gpu", g.UUID), labelPair("gpu_index", strconv.Itoa(g.Index))})
	}
	// The build as mpsd --version says it (internal/buildinfo); commit is
	// its 12 hex digits, "+dirty" for a modified work tree, or "unknown".
	bi := buildinfo.Read()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "mpsd_build_info",
		Help:        "Build of the running mpsd; always 1.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.ShortCommit(), "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	m.newResourceMetrics()
	m.reg.MustRegister(
		buildInfo,
		m.connOpen,
		m.connRefused,
		m.queueRefused,
		m.localErrors,
		m.wait,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		(*stateCollector)(d),
		(*historyCollector)(d), // history.go
	)
	return m
}

// daemonCollector builds the daemon's metrics from its state at scrape
// time, so they can never disagree with mpsctl status.
type daemonCollector Daemon

// labelPair is one label of a series.
func labelPair(name, value string) *dto.LabelPair {
	return &dto.LabelPair{Name: &name, Value: &value}
}

// instanceLabels are an instance's label pairs, made once: a scrape of
// many instances then allocates little beyond the values.
type instanceLabels struct {
	base     []*dto.LabelPair
	states   [][]*dto.LabelPair // by instanceStates
	restarts [][]*dto.LabelPair // by faultKinds, label reason
	faults   [][]*dto.LabelPair // by faultKinds, label kind
	caps     [][]*dto.LabelPair // by capKinds, label cap
	// info is mpsd_mps_info's, made again when the versions it was made
	// of (infoOf) change.
	info   []*dto.LabelPair
	infoOf [2]string
}

func newInstanceLabels(in *instance, index string) *instanceLabels {
	// Sorted by name, as the exposition needs: gpu, gpu_index, group, then
	// kind, reason or state.
	base := []*dto.LabelPair{labelPair("gpu", in.gpus[0].UUID), labelPair("gpu_index", index), labelPair("group", in.group)}
	with := func(n, v string) []*dto.LabelPair { return append(base[:3:3], labelPair(n, v)) }
	// cap sorts before gpu.
	withFirst := func(n, v string) []*dto.LabelPair { return append([]*dto.LabelPair{labelPair(n, v)}, base...) }
	il := &instanceLabels{base: base}
	for _, c := range capKinds {
		il.caps = append(il.caps, withFirst("cap", c))
	}
	for _, st := range instanceStates {
		il.states = append(il.states, with("state", st))
	}
	for _, k := range faultKinds {
		il.restarts = append(il.restarts, with("reason", k))
		il.faults = append(il.faults, with("kind", k))
	}
	return il
}

// infoLabels are the labels of the instance's mpsd_mps_info for these
// versions. A scrape still writing the previous ones keeps them: they are
// replaced, never changed.
func (il *instanceLabels) infoLabels(driver, mpsVersion string) []*dto.LabelPair {
	if il.info == nil || il.infoOf != [2]string{driver, mpsVersion} {
		// driver_version sorts before gpu, mps_version after group.
		il.info = append(append([]*dto.LabelPair{labelPair("driver_version", driver)}, il.base...), labelPair("mps_version", mpsVersion))
		il.infoOf = [2]string{driver, mpsVersion}
	}
	return il.info
}

// instancesInOrderLocked are the instances in the order of their labels
// (gpu, gpu_index, group), each with its label pairs made.
func (m *metrics) instancesInOrderLocked(instances map[string]*instance) []*instance {
	m.instances = m.instances[:0]
	for _, in := range instances {
		if in.metricLabels == nil {
			in.metricLabels = newInstanceLabels(in, m.gpuIndexStr[in.gpus[0].Index])
		}
		m.instances = append(m.instances, in)
	}
	slices.SortFunc(m.instances, func(a, b *instance) int {
		if c := strings.Compare(a.gpus[0].UUID, b.gpus[0].UUID); c != 0 {
			return c
		}
		return strings.Compare(a.group, b.group)
	})
	return m.instances
}

// groupLabels are a configured group's label pairs.
type groupLabels struct {
	index int                // in the config's groups
	base  []*dto.LabelPair   // group
	kinds [][]*dto.LabelPair // by reconKinds: group, kind
}

func newGroupLabels(index int, group string) *groupLabels {
	gl := &groupLabels{index: index, base: []*dto.LabelPair{labelPair("group", group)}}
	for _, k := range reconKinds {
		gl.kinds = append(gl.kinds, append(gl.base[:1:1], labelPair("kind", k)))
	}
	return gl
}

// collect adds the daemon's series to s.
func (c *daemonCollector) collect(s *ownScrape) {
	d := (*Daemon)(c)
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	m := d.metrics
	d.mu.Lock()
	// Room for the series of this scrape, over label pairs made
	// beforehand: the instances', the groups', the daemon's and the GPUs',
	// and budgetCollector's, which the scrape adds next.
	perInstance := 8 + len(instanceStates) + 2*len(faultKinds) + len(capKinds) + budgetPerInstance
	perGroup := 6 + 2*len(reconKinds) + budgetPerGroup
	s.grow(perInstance*len(d.instances) + perGroup*len(d.cfg.Groups) + 3 + 2*len(m.gpuLabels))
	insts := m.instancesInOrderLocked(d.instances)
	for _, in := range insts {
		il := in.metricLabels
		state := in.shownState()
		s.add(descInstanceUp, il.base, b2f(in.daemonUp() && state == api.InstanceReady))
		for _, i := range stateOrder {
			s.add(descInstanceState, il.states[i], b2f(state == instanceStates[i]))
		}
		// Every kind, zeros included, so increase() sees the first one.
		for _, i := range faultOrder {
			kind := faultKinds[i]
			s.add(descRestarts, il.restarts[i], float64(in.restartsBy[kind]))
			s.add(descFaults, il.faults[i], float64(in.faults[kind]))
		}
		s.add(descQuarantined, il.base, b2f(in.holds.quarantined))
		s.add(descLogLost, il.base, b2f(in.logLostLocked()))
		s.add(descClients, il.base, float64(len(in.leases)))
		s.add(descSM, il.base, float64(in.p.Alloc.SM))
		s.add(descMem, il.base, float64(in.p.Alloc.Mem))
		s.add(descUnverified, il.base, float64(in.unverified))
		s.add(descMPSInfo, il.infoLabels(in.versionsLocked()), 1)
		if in.shm.known { // a private /dev/shm is mounted (shm.go)
			s.add(descShmUsed, il.base, float64(in.shm.usage.Used))
			s.add(descShmSize, il.base, float64(in.shm.usage.Size))
			s.add(descShmFull, il.base, b2f(in.shm.full))
			s.add(descShmCleaned, il.base, float64(in.shm.cleaned))
		}
	}
	// cap is the first label of these: by cap, then instance.
	for _, i := range capOrder {
		for _, in := range insts {
			s.add(descCapDrift, in.metricLabels.caps[i], float64(in.capDrifts[capKinds[i]]))
		}
	}
	// One pass over the leases: their memory in use by group, and those
	// whose kill is stuck.
	groups := m.groupLabelsLocked(d.cfg)
	memUsed := make([]uint64, len(d.cfg.Groups))
	stuck := 0
	for _, l := range d.leases {
		if l.killStuck {
			stuck++
		}
		if l.inst == nil || l.memUsed == nil {
			continue
		}
		if gl := groups[l.group]; gl != nil {
			memUsed[gl.index] += *l.memUsed
		}
		if d.cfg.Metrics.PerLease {
			s.add(descLeaseMemByID, descLeaseMemByID.labelPairs(l.group, l.id), float64(*l.memUsed))
		}
	}
	for i, g := range d.cfg.Groups {
		gl := groups[g.Name]
		s.add(descLeaseMemUsed, gl.base, float64(memUsed[i]))
		s.add(descQueue, gl.base, float64(len(d.queues[g.Name])))
		s.add(descGranted, gl.base, float64(m.granted[g.Name]))
		s.add(descRequeues, gl.base, float64(m.requeues[g.Name]))
		s.add(descKillFailures, gl.base, float64(m.killFailures[g.Name]))
		s.add(descPodMemExceed, gl.base, float64(m.podMemExceeded[g.Name]))
		// Every kind, zeros included, so increase() sees the first one.
		for _, j := range reconOrder {
			k := [2]string{g.Name, reconKinds[j]}
			s.add(descUnreconciled, gl.kinds[j], float64(m.unreconciled[k]))
			s.add(descReconKilled, gl.kinds[j], float64(m.reconTerminated[k]))
		}
	}
	// Findings of no group (a bypass by a process of no member), and of
	// groups no longer in the config.
	for k, n := range m.unreconciled {
		if _, ok := d.cfg.Group(k[0]); !ok {
			s.add(descUnreconciled, descUnreconciled.labelPairs(k[0], k[1]), float64(n))
			s.add(descReconKilled, descReconKilled.labelPairs(k[0], k[1]), float64(m.reconTerminated[k]))
		}
	}
	s.add(descKillStuck, nil, float64(stuck))
	for k, n := range m.xids {
		s.add(descXid, descXid.labelPairs(m.gpuUUIDs[k[0]], m.gpuIndexStr[k[0]], strconv.FormatUint(k[1], 10)), float64(n))
	}
	s.add(descReloadOK, nil, b2f(m.reloadOK))
	s.add(descReloadTime, nil, float64(m.reloadAt.UnixNano())/1e9)
	clear(insts) // kept for its room, not its instances
	d.mu.Unlock()

	// NVML is read outside the lock: a slow GPU must not stall admission.
	usage, _ := d.host.UsageAll()
	for _, u := range usage {
		if u.Index < 0 || u.Index >= len(m.gpuLabels) {
			continue
		}
		if u.MemoryUsedBytes != nil {
			s.add(descGPUMem, m.gpuLabels[u.Index], float64(*u.MemoryUsedBytes))
		}
		if u.Utilization != nil {
			s.add(descGPUUtil, m.gpuLabels[u.Index], *u.Utilization)
		}
	}
}

// serveMetrics serves /metrics, /healthz and /readyz on the metrics
// listener until the daemon stops.
func (d *Daemon) serveMetrics(ln net.Listener) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metricsHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := d.Healthy(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if d.heldReason() != "" {
			// The summary says why: the state directory cannot be written.
			http.Error(w, "not ready: "+d.Summary(), http.StatusServiceUnavailable)
			return
		}
		if trouble := d.res.localTrouble(); trouble != "" {
			http.Error(w, "not ready: mpsd is out of local resources ("+trouble+"); "+d.Summary(), http.StatusServiceUnavailable)
			return
		}
		if !d.ready.Load() {
			http.Error(w, "not ready: "+d.Summary(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready: " + d.Summary() + "\n"))
	})
	// A scraper gets 10s for a request and 30s between them; the listener
	// caps how many connections there are at once.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelDebug)}
	lln := d.limitListener(ln, listenerMetrics)
	d.spawn(func() { _ = srv.Serve(lln) })
	return srv
}

type slogPromLogger struct{ d *Daemon }

func (l slogPromLogger) Println(v ...any) { l.d.log.Warn("metrics", "err", v) }

// newResourceMetrics makes the metrics of what outsiders make mpsd hold
// and of its own exhaustion, every series at zero.
func (m *metrics) newResourceMetrics() {
	m.connOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mpsd_connections_open",
		Help: "Open connections of the listener (api: the socket, metrics: this one).",
	}, []string{"listener"})
	m.connRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mpsd_connections_refused_total",
		Help: "Connections refused at a cap (reason total: limits.connections or limits.metrics_connections; per_user: limits.connections_per_user).",
	}, []string{"listener", "reason"})
	m.queueRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mpsd_lease_requests_over_limit_total",
		Help: "Lease requests refused because their uid had limits.queued_per_user requests queued.",
	})
	m.localErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mpsd_local_resource_errors_total",
		Help: "Times mpsd itself ran out of file descriptors or processes, by where (never counted as an MPS fault).",
	}, []string{"where"})
	for _, ln := range []string{listenerAPI, listenerMetrics} {
		m.connOpen.WithLabelValues(ln)
		for _, reason := range []string{"total", "per_user"} {
			if ln == listenerMetrics && reason == "per_user" {
				continue
			}
			m.connRefused.WithLabelValues(ln, reason)
		}
	}
	for _, w := range localResourceWheres {
		m.localErrors.WithLabelValues(w)
	}
}

// groupsChangedLocked starts the admission-wait histogram of every group
// at zero, so a group's series exist before its first grant.
func (m *metrics) groupsChangedLocked(cfg *policy.Config) {
	for _, g := range cfg.Groups {
		m.wait.WithLabelValues(g.Name)
	}
	m.groupLabelsLocked(cfg)
}

// groupLabelsLocked are the label pairs of cfg's groups, by name, made
// once per config.
func (m *metrics) groupLabelsLocked(cfg *policy.Config) map[string]*groupLabels {
	if m.groupLabelsOf != cfg {
		m.groupLabels = make(map[string]*groupLabels, len(cfg.Groups))
		for i, g := range cfg.Groups {
			m.groupLabels[g.Name] = newGroupLabels(i, g.Name)
		}
		m.groupLabelsOf = cfg
	}
	return m.groupLabels
}

// observeGrantLocked records a grant for the metrics.
func (d *Daemon) observeGrantLocked(l *lease) {
	d.metrics.granted[l.group]++
	d.metrics.wait.WithLabelValues(l.group).Observe(d.clock.Since(l.queuedAt).Seconds())
}
