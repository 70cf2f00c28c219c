package mpsd

import (
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/mpsd/mpsd/policy"
)

// Metric descriptors (docs/architecture.md#metrics-and-systemd). The instance metrics are labelled by
// the first GPU of the instance's set (gpu = UUID, gpu_index) and group;
// nothing is labelled per lease, so the series count follows the host's
// instances, not its workload.
var (
	instLabels = []string{"gpu", "gpu_index", "group"}
	gpuLabels  = []string{"gpu", "gpu_index"}

	descMPSInfo       = prometheus.NewDesc("mpsd_mps_info", "The NVIDIA driver (NVML) and MPS control binary version (its control.log, 580 and newer; empty before) of the instance; always 1.", append(instLabels[:3:3], "driver_version", "mps_version"), nil)
	descInstanceUp    = prometheus.NewDesc("mpsd_instance_up", "1 when the instance's MPS control daemon is up and takes clients.", instLabels, nil)
	descInstanceState = prometheus.NewDesc("mpsd_instance_state", "1 for the instance's current state, 0 for the others.", append(instLabels[:3:3], "state"), nil)
	descRestarts      = prometheus.NewDesc("mpsd_server_restarts_total", "Recoveries of the instance (revoke, restart, requeue), by the fault that caused them.", append(instLabels[:3:3], "reason"), nil)
	descFaults        = prometheus.NewDesc("mpsd_faults_total", "Faults reported for the instance, by kind.", append(instLabels[:3:3], "kind"), nil)
	descQuarantined   = prometheus.NewDesc("mpsd_quarantined", "1 while the instance is quarantined (mpsctl resume lifts it).", instLabels, nil)
	descClients       = prometheus.NewDesc("mpsd_clients", "Running leases on the instance.", instLabels, nil)
	descSM            = prometheus.NewDesc("mpsd_sm_allocated_percent", "Sum of the running leases' SM percentage, per GPU of the instance.", instLabels, nil)
	descMem           = prometheus.NewDesc("mpsd_memory_allocated_bytes", "Sum of the running leases' pinned device memory, per GPU of the instance.", instLabels, nil)
	descQueue         = prometheus.NewDesc("mpsd_queue_length", "Requests waiting in the group's queue.", []string{"group"}, nil)
	descGranted       = prometheus.NewDesc("mpsd_leases_granted_total", "Leases granted in the group, requeued runs included.", []string{"group"}, nil)
	descRequeues      = prometheus.NewDesc("mpsd_requeues_total", "Leases revoked by a fault and put back in the group's queue.", []string{"group"}, nil)
	descKillFailures  = prometheus.NewDesc("mpsd_cgroup_kill_failures_total", "Kills of a lease's cgroup that failed (its processes would not die); the kill is retried.", []string{"group"}, nil)
	descKillStuck     = prometheus.NewDesc("mpsd_leases_kill_stuck", "Leases whose processes would not die, holding their capacity while mpsd retries the kill.", nil, nil)
	descXid           = prometheus.NewDesc("mpsd_gpu_xid_errors_total", "Xid errors NVML reported for the GPU.", append(gpuLabels[:2:2], "xid"), nil)
	descGPUMem        = prometheus.NewDesc("mpsd_gpu_memory_used_bytes", "GPU memory in use, as NVML reports it.", gpuLabels, nil)
	descGPUUtil       = prometheus.NewDesc("mpsd_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the GPU (0-1).", gpuLabels, nil)
	descUnverified    = prometheus.NewDesc("mpsd_unverified_mps_records_total", "MPS log records (or server list entries) that named a process which is no verified server of the instance's daemon, and were ignored: forged by a local user who can reach the pipe directory, or about a server gone before it could be checked.", instLabels, nil)
	descUnreconciled  = prometheus.NewDesc("mpsd_unreconciled_clients_total", "GPU processes found on an instance that no lease of it accounts for, by kind: unleased (an MPS client without a lease), wrong_instance (a lease's process on another instance's server), bypass (a compute process beside MPS). group is the group it was found in (for bypass, the group its owner belongs to; empty for none).", []string{"group", "kind"}, nil)
	descReconKilled   = prometheus.NewDesc("mpsd_unreconciled_clients_terminated_total", "Processes of mpsd_unreconciled_clients_total that mpsd ended (the group's reconcile: terminate), by kind.", []string{"group", "kind"}, nil)
	descLeaseMemUsed  = prometheus.NewDesc("mpsd_lease_memory_used_bytes", "Device memory NVML reports for the group's running leases' processes, summed per lease on its GPU where it is highest, and over the group's leases.", []string{"group"}, nil)
	descLeaseMemByID  = prometheus.NewDesc("mpsd_lease_memory_used_bytes_by_lease", "Device memory NVML reports for one running lease's processes, summed on its GPU where it is highest (metrics.per_lease: true only).", []string{"group", "lease"}, nil)
	descCapDrift      = prometheus.NewDesc("mpsd_mps_cap_drift_total", "Times a cap of an MPS server of the instance (cap: thread_percentage, pinned_memory) was found off the group's max_sm or max_mem and set back: its owner changed it, or the server started with other defaults.", append(instLabels[:3:3], "cap"), nil)
	descReloadOK      = prometheus.NewDesc("mpsd_config_last_reload_success", "1 if the last config reload (or the initial load) succeeded.", nil, nil)
	descReloadTime    = prometheus.NewDesc("mpsd_config_last_reload_timestamp_seconds", "When the config was last loaded or reload attempted.", nil, nil)
)

var faultKinds = []string{faultDaemonExit, faultServerExit, faultFatalException, faultServerFault, faultStartFailed, faultHung, faultXid, faultAdmin}

var instanceStates = []policy.InstanceState{policy.InstanceStarting, policy.InstanceReady, policy.InstanceRecovering, policy.InstanceQuarantined, policy.InstanceDraining}

// metrics is the daemon's counters that live outside instances, and its
// registry. Guarded by Daemon.mu except the histogram, which locks itself.
type metrics struct {
	reg      *prometheus.Registry
	wait     *prometheus.HistogramVec
	granted  map[string]uint64
	requeues map[string]uint64
	// killFailures counts failed kills of lease cgroups per group.
	killFailures map[string]uint64
	// unreconciled and reconTerminated count reconciliation's findings
	// and the processes it ended, by (group, kind).
	unreconciled    map[[2]string]uint64
	reconTerminated map[[2]string]uint64
	xids            map[[2]uint64]uint64 // (gpu index, xid) → count
	reloadOK        bool
	reloadAt        time.Time
	gpuUUIDs        []string
	gpuIndexStr     []string

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
		xids:            map[[2]uint64]uint64{},
		reloadOK:        true,
		reloadAt:        time.Now(),
	}
	for _, g := range d.host.GPUs() {
		m.gpuUUIDs = append(m.gpuUUIDs, g.UUID)
		m.gpuIndexStr = append(m.gpuIndexStr, strconv.Itoa(g.Index))
	}
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "mpsd_build_info",
		Help:        "Build of the running mpsd; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
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
		(*daemonCollector)(d),
		(*stateCollector)(d),
	)
	return m
}

// daemonCollector builds the daemon's metrics from its state at scrape
// time, so they can never disagree with mpsctl status.
type daemonCollector Daemon

func (c *daemonCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInstanceUp, descInstanceState, descRestarts, descFaults, descQuarantined,
		descClients, descSM, descMem, descMPSInfo, descQueue, descGranted, descRequeues, descKillFailures, descKillStuck, descXid, descGPUMem, descGPUUtil, descReloadOK, descReloadTime, descUnverified, descCapDrift, descUnreconciled, descReconKilled, descLeaseMemUsed, descLeaseMemByID} {
		ch <- d
	}
}

// instanceLabels are an instance's label pairs, made once: a scrape of
// many instances then allocates little beyond the values.
type instanceLabels struct {
	base     []*dto.LabelPair
	states   [][]*dto.LabelPair // by instanceStates
	restarts [][]*dto.LabelPair // by faultKinds, label reason
	faults   [][]*dto.LabelPair // by faultKinds, label kind
	caps     [][]*dto.LabelPair // by capKinds, label cap
}

func newInstanceLabels(in *instance, index string) *instanceLabels {
	pair := func(n, v string) *dto.LabelPair { return &dto.LabelPair{Name: &n, Value: &v} }
	// Sorted by name, as the exposition needs: gpu, gpu_index, group, then
	// kind, reason or state.
	base := []*dto.LabelPair{pair("gpu", in.gpus[0].UUID), pair("gpu_index", index), pair("group", in.group)}
	with := func(n, v string) []*dto.LabelPair { return append(base[:3:3], pair(n, v)) }
	// cap sorts before gpu.
	withFirst := func(n, v string) []*dto.LabelPair { return append([]*dto.LabelPair{pair(n, v)}, base...) }
	il := &instanceLabels{base: base}
	for _, c := range capKinds {
		il.caps = append(il.caps, withFirst("cap", c))
	}
	for _, st := range instanceStates {
		il.states = append(il.states, with("state", st.String()))
	}
	for _, k := range faultKinds {
		il.restarts = append(il.restarts, with("reason", k))
		il.faults = append(il.faults, with("kind", k))
	}
	return il
}

// fastMetric is a const metric over label pairs made beforehand.
type fastMetric struct {
	desc    *prometheus.Desc
	labels  []*dto.LabelPair
	value   float64
	counter bool
}

func (m *fastMetric) Desc() *prometheus.Desc { return m.desc }

func (m *fastMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	if m.counter {
		out.Counter = &dto.Counter{Value: &m.value}
	} else {
		out.Gauge = &dto.Gauge{Value: &m.value}
	}
	return nil
}

func (c *daemonCollector) Collect(ch chan<- prometheus.Metric) {
	d := (*Daemon)(c)
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	counter := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, labels...)
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	m := d.metrics
	d.mu.Lock()
	// One allocation for all of the instance series of this scrape.
	per := 7 + len(instanceStates) + 2*len(faultKinds) + len(capKinds)
	fm := make([]fastMetric, 0, per*len(d.instances))
	emit := func(desc *prometheus.Desc, labels []*dto.LabelPair, v float64, isCounter bool) {
		fm = append(fm, fastMetric{desc: desc, labels: labels, value: v, counter: isCounter})
	}
	for _, in := range d.instances {
		if in.metricLabels == nil {
			in.metricLabels = newInstanceLabels(in, m.gpuIndexStr[in.gpus[0].Index])
		}
		il := in.metricLabels
		state := in.placementState()
		emit(descInstanceUp, il.base, b2f(in.daemonUp() && state == policy.InstanceReady), false)
		for i, st := range instanceStates {
			emit(descInstanceState, il.states[i], b2f(state == st), false)
		}
		// Every kind, zeros included, so increase() sees the first one.
		for i, kind := range faultKinds {
			emit(descRestarts, il.restarts[i], float64(in.restartsBy[kind]), true)
			emit(descFaults, il.faults[i], float64(in.faults[kind]), true)
		}
		emit(descQuarantined, il.base, b2f(in.holds.quarantined), false)
		emit(descClients, il.base, float64(len(in.leases)), false)
		emit(descSM, il.base, float64(in.p.Alloc.SM), false)
		emit(descMem, il.base, float64(in.p.Alloc.Mem), false)
		emit(descUnverified, il.base, float64(in.unverified), true)
		driver, mpsVersion := in.versionsLocked()
		gauge(descMPSInfo, 1, in.gpus[0].UUID, m.gpuIndexStr[in.gpus[0].Index], in.group, driver, mpsVersion)
		for i, c := range capKinds {
			emit(descCapDrift, il.caps[i], float64(in.capDrifts[c]), true)
		}
	}
	memUsed := map[string]uint64{}
	for _, l := range d.leases {
		if l.inst != nil && l.memUsed != nil {
			memUsed[l.group] += *l.memUsed
			if d.cfg.Metrics.PerLease {
				gauge(descLeaseMemByID, float64(*l.memUsed), l.group, l.id)
			}
		}
	}
	for _, g := range d.cfg.Groups {
		gauge(descLeaseMemUsed, float64(memUsed[g.Name]), g.Name)
		gauge(descQueue, float64(len(d.queues[g.Name])), g.Name)
		counter(descGranted, float64(m.granted[g.Name]), g.Name)
		counter(descRequeues, float64(m.requeues[g.Name]), g.Name)
		counter(descKillFailures, float64(m.killFailures[g.Name]), g.Name)
		// Every kind, zeros included, so increase() sees the first one.
		for _, kind := range reconKinds {
			k := [2]string{g.Name, kind}
			counter(descUnreconciled, float64(m.unreconciled[k]), g.Name, kind)
			counter(descReconKilled, float64(m.reconTerminated[k]), g.Name, kind)
		}
	}
	// Findings of no group (a bypass by a process of no member), and of
	// groups no longer in the config.
	for k, n := range m.unreconciled {
		if _, ok := d.cfg.Group(k[0]); !ok {
			counter(descUnreconciled, float64(n), k[0], k[1])
			counter(descReconKilled, float64(m.reconTerminated[k]), k[0], k[1])
		}
	}
	stuck := 0
	for _, l := range d.leases {
		if l.killStuck {
			stuck++
		}
	}
	gauge(descKillStuck, float64(stuck))
	for k, n := range m.xids {
		counter(descXid, float64(n), m.gpuUUIDs[k[0]], m.gpuIndexStr[k[0]], strconv.FormatUint(k[1], 10))
	}
	gauge(descReloadOK, b2f(m.reloadOK))
	gauge(descReloadTime, float64(m.reloadAt.UnixNano())/1e9)
	d.mu.Unlock()
	for i := range fm {
		ch <- &fm[i]
	}

	// NVML is read outside the lock: a slow GPU must not stall admission.
	usage, _ := d.host.UsageAll()
	for _, u := range usage {
		if u.Index < 0 || u.Index >= len(m.gpuUUIDs) {
			continue
		}
		if u.MemoryUsedBytes != nil {
			gauge(descGPUMem, float64(*u.MemoryUsedBytes), m.gpuUUIDs[u.Index], m.gpuIndexStr[u.Index])
		}
		if u.Utilization != nil {
			gauge(descGPUUtil, *u.Utilization, m.gpuUUIDs[u.Index], m.gpuIndexStr[u.Index])
		}
	}
}

// serveMetrics serves /metrics, /healthz and /readyz on the metrics
// listener until the daemon stops.
func (d *Daemon) serveMetrics(ln net.Listener) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{ErrorLog: slogPromLogger{d}}))
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
}

// observeGrantLocked records a grant for the metrics.
func (d *Daemon) observeGrantLocked(l *lease) {
	d.metrics.granted[l.group]++
	d.metrics.wait.WithLabelValues(l.group).Observe(time.Since(l.queuedAt).Seconds())
}
