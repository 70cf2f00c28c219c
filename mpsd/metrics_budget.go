package mpsd

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The denominators of the allocation gauges: each instance's budgets (the
// group's sm, memory and max_clients, per GPU as mpsd_sm_allocated_percent
// and mpsd_memory_allocated_bytes are) and what its running leases hold of
// them, and the same per group, summed over its instances' GPUs, so that
// a dashboard shows used of total (docs/architecture.md#metrics-and-systemd).
// The leases running per instance and per group stand beside the group's
// queued ones (mpsd_queue_length): a queued lease has no instance until it
// is granted.
// Labelled as the instance metrics are, or by group: the series follow the
// config's instances and groups, never the workload.
var (
	descSMBudget       = prometheus.NewDesc("mpsd_sm_budget_percent", "The instance's SM budget per GPU (its group's sm_percent): what mpsd_sm_allocated_percent may reach.", instLabels, nil)
	descMemBudget      = prometheus.NewDesc("mpsd_memory_budget_bytes", "The instance's device memory budget per GPU (its group's memory): what mpsd_memory_allocated_bytes may reach.", instLabels, nil)
	descClientsBudget  = prometheus.NewDesc("mpsd_clients_budget", "The most MPS clients the instance's leases may hold together (its group's max_clients).", instLabels, nil)
	descClientsAlloc   = prometheus.NewDesc("mpsd_clients_allocated", "MPS clients the instance's running leases hold of mpsd_clients_budget (each lease its --procs, 1 by default).", instLabels, nil)
	descLeasesRunning  = prometheus.NewDesc("mpsd_leases_running", "Leases running on the instance.", instLabels, nil)
	descGroupSMBudget  = prometheus.NewDesc("mpsd_group_sm_budget_percent", "The group's SM budget: over its instances, the budget per GPU times their GPUs (100 a whole GPU).", []string{"group"}, nil)
	descGroupSMAlloc   = prometheus.NewDesc("mpsd_group_sm_allocated_percent", "SM the group's running leases hold: over its instances, mpsd_sm_allocated_percent times their GPUs.", []string{"group"}, nil)
	descGroupMemBudget = prometheus.NewDesc("mpsd_group_memory_budget_bytes", "The group's device memory budget: over its instances, the budget per GPU times their GPUs.", []string{"group"}, nil)
	descGroupMemAlloc  = prometheus.NewDesc("mpsd_group_memory_allocated_bytes", "Device memory the group's running leases hold: over its instances, mpsd_memory_allocated_bytes times their GPUs.", []string{"group"}, nil)
	descGroupCliBudget = prometheus.NewDesc("mpsd_group_clients_budget", "The most MPS clients the group's leases may hold: max_clients over its instances.", []string{"group"}, nil)
	descGroupCliAlloc  = prometheus.NewDesc("mpsd_group_clients_allocated", "MPS clients the group's running leases hold.", []string{"group"}, nil)
	descGroupRunning   = prometheus.NewDesc("mpsd_group_leases_running", "Leases of the group running on its instances.", []string{"group"}, nil)
)

// budgetCollector builds the budget and lease gauges from the daemon's
// state at scrape time, as daemonCollector does the others.
type budgetCollector Daemon

func (c *budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSMBudget, descMemBudget, descClientsBudget, descClientsAlloc, descLeasesRunning,
		descGroupSMBudget, descGroupSMAlloc, descGroupMemBudget, descGroupMemAlloc, descGroupCliBudget, descGroupCliAlloc, descGroupRunning} {
		ch <- d
	}
}

// groupBudget is what a group's instances add up to.
type groupBudget struct {
	smBudget, smAlloc           float64
	memBudget, memAlloc         float64
	clientsBudget, clientsAlloc float64
	running                     float64
}

func (c *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	d := (*Daemon)(c)
	m := d.metrics
	d.mu.Lock()
	groups := m.groupLabelsLocked(d.cfg)
	sums := make([]groupBudget, len(d.cfg.Groups))
	fm := make([]fastMetric, 0, 5*len(d.instances)+7*len(d.cfg.Groups))
	emit := func(desc *prometheus.Desc, labels []*dto.LabelPair, v float64) {
		fm = append(fm, fastMetric{desc: desc, labels: labels, value: v})
	}
	insts := m.instancesInOrderLocked(d.instances)
	for _, in := range insts {
		il := in.metricLabels
		running := 0
		for _, l := range in.leases {
			if l.state == leaseRunning {
				running++
			}
		}
		b, a := in.p.Budget, in.p.Alloc
		emit(descSMBudget, il.base, float64(b.SM))
		emit(descMemBudget, il.base, float64(b.Mem))
		emit(descClientsBudget, il.base, float64(b.Clients))
		emit(descClientsAlloc, il.base, float64(a.Clients))
		emit(descLeasesRunning, il.base, float64(running))
		// An instance of a group no longer configured (retiring) has
		// its own series only.
		if gl := groups[in.group]; gl != nil {
			s, n := &sums[gl.index], float64(len(in.p.GPUs))
			s.smBudget += float64(b.SM) * n
			s.smAlloc += float64(a.SM) * n
			s.memBudget += float64(b.Mem) * n
			s.memAlloc += float64(a.Mem) * n
			s.clientsBudget += float64(b.Clients)
			s.clientsAlloc += float64(a.Clients)
			s.running += float64(running)
		}
	}
	for i, g := range d.cfg.Groups {
		gl, s := groups[g.Name], sums[i]
		emit(descGroupSMBudget, gl.base, s.smBudget)
		emit(descGroupSMAlloc, gl.base, s.smAlloc)
		emit(descGroupMemBudget, gl.base, s.memBudget)
		emit(descGroupMemAlloc, gl.base, s.memAlloc)
		emit(descGroupCliBudget, gl.base, s.clientsBudget)
		emit(descGroupCliAlloc, gl.base, s.clientsAlloc)
		emit(descGroupRunning, gl.base, s.running)
	}
	clear(insts) // kept for its room, not its instances
	d.mu.Unlock()
	for i := range fm {
		ch <- &fm[i]
	}
}
