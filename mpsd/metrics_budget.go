package mpsd

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
	descSMBudget       = gaugeFamily("mpsd_sm_budget_percent", "The instance's SM budget per GPU (its group's sm_percent): what mpsd_sm_allocated_percent may reach.", instLabels)
	descMemBudget      = gaugeFamily("mpsd_memory_budget_bytes", "The instance's device memory budget per GPU (its group's memory): what mpsd_memory_allocated_bytes may reach.", instLabels)
	descClientsBudget  = gaugeFamily("mpsd_clients_budget", "The most MPS clients the instance's leases may hold together (its group's max_clients).", instLabels)
	descClientsAlloc   = gaugeFamily("mpsd_clients_allocated", "MPS clients the instance's running leases hold of mpsd_clients_budget (each lease its --procs, 1 by default).", instLabels)
	descLeasesRunning  = gaugeFamily("mpsd_leases_running", "Leases running on the instance.", instLabels)
	descGroupSMBudget  = gaugeFamily("mpsd_group_sm_budget_percent", "The group's SM budget: over its instances, the budget per GPU times their GPUs (100 a whole GPU).", []string{"group"})
	descGroupSMAlloc   = gaugeFamily("mpsd_group_sm_allocated_percent", "SM the group's running leases hold: over its instances, mpsd_sm_allocated_percent times their GPUs.", []string{"group"})
	descGroupMemBudget = gaugeFamily("mpsd_group_memory_budget_bytes", "The group's device memory budget: over its instances, the budget per GPU times their GPUs.", []string{"group"})
	descGroupMemAlloc  = gaugeFamily("mpsd_group_memory_allocated_bytes", "Device memory the group's running leases hold: over its instances, mpsd_memory_allocated_bytes times their GPUs.", []string{"group"})
	descGroupCliBudget = gaugeFamily("mpsd_group_clients_budget", "The most MPS clients the group's leases may hold: max_clients over its instances.", []string{"group"})
	descGroupCliAlloc  = gaugeFamily("mpsd_group_clients_allocated", "MPS clients the group's running leases hold.", []string{"group"})
	descGroupRunning   = gaugeFamily("mpsd_group_leases_running", "Leases of the group running on its instances.", []string{"group"})
)

// budgetCollector builds the budget and lease gauges from the daemon's
// state at scrape time, as daemonCollector does the others.
type budgetCollector Daemon

// The series collect adds per instance and per group, for which
// daemonCollector makes room.
const budgetPerInstance, budgetPerGroup = 5, 7

// groupBudget is what a group's instances add up to.
type groupBudget struct {
	smBudget, smAlloc           float64
	memBudget, memAlloc         float64
	clientsBudget, clientsAlloc float64
	running                     float64
}

// collect adds the budget and lease gauges to s.
func (c *budgetCollector) collect(s *ownScrape) {
	d := (*Daemon)(c)
	m := d.metrics
	d.mu.Lock()
	groups := m.groupLabelsLocked(d.cfg)
	sums := make([]groupBudget, len(d.cfg.Groups))
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
		s.add(descSMBudget, il.base, float64(b.SM))
		s.add(descMemBudget, il.base, float64(b.Mem))
		s.add(descClientsBudget, il.base, float64(b.Clients))
		s.add(descClientsAlloc, il.base, float64(a.Clients))
		s.add(descLeasesRunning, il.base, float64(running))
		// An instance of a group no longer configured (retiring) has
		// its own series only.
		if gl := groups[in.group]; gl != nil {
			sum, n := &sums[gl.index], float64(len(in.p.GPUs))
			sum.smBudget += float64(b.SM) * n
			sum.smAlloc += float64(a.SM) * n
			sum.memBudget += float64(b.Mem) * n
			sum.memAlloc += float64(a.Mem) * n
			sum.clientsBudget += float64(b.Clients)
			sum.clientsAlloc += float64(a.Clients)
			sum.running += float64(running)
		}
	}
	for i, g := range d.cfg.Groups {
		gl, sum := groups[g.Name], sums[i]
		s.add(descGroupSMBudget, gl.base, sum.smBudget)
		s.add(descGroupSMAlloc, gl.base, sum.smAlloc)
		s.add(descGroupMemBudget, gl.base, sum.memBudget)
		s.add(descGroupMemAlloc, gl.base, sum.memAlloc)
		s.add(descGroupCliBudget, gl.base, sum.clientsBudget)
		s.add(descGroupCliAlloc, gl.base, sum.clientsAlloc)
		s.add(descGroupRunning, gl.base, sum.running)
	}
	clear(insts) // kept for its room, not its instances
	d.mu.Unlock()
}
