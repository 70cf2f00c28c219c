package mpsd

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/policy"
)

// ownScrapeDaemon is a daemon (not started) of 4 GPUs and groups a
// (alice) and b (bob) whose state gives every family of mpsd's own its
// series: running leases of both users with their memory in use (per
// lease too), a kill stuck, Xids of two GPUs, reconciliation's findings
// in a group, in no group and in a group no longer configured, cap drift
// and a private /dev/shm.
func ownScrapeDaemon(t *testing.T) *Daemon {
	t.Helper()
	const aliceUID, bobUID = 64051, 64052
	alice, bob := emutest.User(t, aliceUID), emutest.User(t, bobUID)
	e := newEnvGPUs(t, 4, fmt.Sprintf(`  a:
    users: [%s]
    memory: 20G
  b:
    users: [%s]
    memory: 10G
`, alice, bob), "metrics:\n  listen: \"\"\n  per_lease: true")
	d, err := New(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.host.Close() })
	d.mu.Lock()
	defer d.mu.Unlock()
	d.instances, d.queues, d.leases = map[string]*instance{}, map[string][]*lease{}, map[string]*lease{}
	d.reconcileLocked(d.cfg)
	for i, in := range d.instanceList() {
		uid := uint32(aliceUID)
		if in.group == "b" {
			uid = bobUID
		}
		used := uint64(i+1) << 20
		l := &lease{id: fmt.Sprintf("%s-%012d", in.group, i), uid: uid, group: in.group, req: policy.Request{Group: in.group, SM: 1, Mem: 64 << 20, GPUs: 1}, inst: in,
			box: newMailbox(nil), state: leaseRunning, memUsed: &used, killStuck: i == 0}
		in.p.Assign(&l.req)
		in.leases[l.id] = l
		d.leases[l.id] = l
		if _, err := in.step(instEvUp, "test"); err != nil {
			t.Fatal(err)
		}
		in.capDrifts = map[string]uint64{capThreads: uint64(i)}
		if i == 1 {
			in.shm = shmState{known: true, full: true, cleaned: 2}
		}
	}
	for _, k := range [][2]uint64{{3, 79}, {0, 31}, {3, 13}, {0, 79}, {1, 48}} {
		d.metrics.xids[k] += k[1]
	}
	for _, k := range [][2]string{{"gone", reconBypass}, {"", reconBypass}, {"a", reconUnleased}, {"gone", reconUnleased}} {
		d.metrics.unreconciled[k]++
	}
	return d
}

// mpsd's own families, built without the registry, pass the checks the
// registry made at every scrape (valid names and label names, label
// values of valid UTF-8, one type per family, no series twice) and come in
// its order: client_golang's Gatherers, which checks and sorts as the
// registry does, gives them back unchanged. The scrape has every family
// of mpsd's own; none comes from the registry too, and a family from both
// fails the gather.
func TestOwnFamiliesConsistent(t *testing.T) {
	d := ownScrapeDaemon(t)
	var s ownScrape
	(*daemonCollector)(d).collect(&s)
	(*budgetCollector)(d).collect(&s)
	own := s.families()
	names := map[string]bool{}
	for _, mf := range own {
		names[mf.GetName()] = true
	}
	for _, f := range ownFamilies {
		if !names[f.name] {
			t.Errorf("the scrape lacks %s: the test checks none of its series", f.name)
		}
	}

	checked, err := prometheus.Gatherers{prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return own, nil })}.Gather()
	if err != nil {
		t.Fatalf("the registry's checks: %v", err)
	}
	if len(checked) != len(own) {
		t.Fatalf("%d families checked, %d gathered", len(checked), len(own))
	}
	for i := range own {
		if !proto.Equal(checked[i], own[i]) {
			t.Errorf("family %d: the registry's order is\n%v\nmpsd's\n%v", i, checked[i], own[i])
		}
	}

	reg, err := d.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range reg {
		if names[mf.GetName()] {
			t.Errorf("%s both registered and mpsd's own", mf.GetName())
		}
	}
	all, err := d.metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(reg)+len(own) || !slices.IsSortedFunc(all, compareNames) {
		t.Errorf("gathered %d families (sorted: %v), want the registry's %d and mpsd's %d, sorted by name",
			len(all), slices.IsSortedFunc(all, compareNames), len(reg), len(own))
	}
	if _, err := mergeFamilies(reg, own[:1:1]); err != nil {
		t.Errorf("merge of distinct families: %v", err)
	}
	if _, err := mergeFamilies(reg, []*dto.MetricFamily{reg[len(reg)/2]}); err == nil {
		t.Errorf("%s both registered and mpsd's own: gathered without an error", reg[len(reg)/2].GetName())
	}
}

func compareNames(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) }
