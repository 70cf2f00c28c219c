package mpsd

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

var updateMetrics = flag.Bool("update-metrics", false, "rewrite the golden metric files in testdata/metrics/")

// budgetMetrics are the budget and lease gauges (metrics_budget.go) and
// the allocations and queue they stand beside.
var budgetMetrics = []string{
	"mpsd_sm_budget_percent", "mpsd_memory_budget_bytes", "mpsd_clients_budget", "mpsd_clients_allocated", "mpsd_leases_running",
	"mpsd_group_sm_budget_percent", "mpsd_group_sm_allocated_percent", "mpsd_group_memory_budget_bytes", "mpsd_group_memory_allocated_bytes",
	"mpsd_group_clients_budget", "mpsd_group_clients_allocated", "mpsd_group_leases_running",
	"mpsd_sm_allocated_percent", "mpsd_memory_allocated_bytes", "mpsd_queue_length",
}

// Each instance's budgets and what its running leases hold of them, and
// each group's, summed over its instances' GPUs: Alice and Bob run on
// group a's two one-GPU instances, Bob on group b's two-GPU instance,
// and Alice's request in b waits (b's memory is Bob's). The exposition is
// compared with testdata/metrics/budgets.golden (go test -run
// TestBudgetGauges -update-metrics rewrites it).
func TestBudgetGauges(t *testing.T) {
	const aliceUID, bobUID = 64741, 64742
	alice, bob := emutest.User(t, aliceUID), emutest.User(t, bobUID)
	e := newEnvGPUs(t, 3, fmt.Sprintf(`  a:
    users: [%[1]s, %[2]s]
    gpus: ["0", "1"]
    sm_percent: 80
    memory: 10G
    max_clients: 8
  b:
    users: [%[1]s, %[2]s]
    gpus: ["1", "2"]
    gpus_per_instance: 2
    memory: 4G
    max_clients: 4
`, alice, bob), "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	run := func(uid uint32, args ...string) *proc {
		p := startProc(t, asUID(e.launch(append(args, "--", client, "--duration", "5m")...), uid))
		t.Cleanup(func() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			p.wait(t)
		})
		return p
	}
	run(aliceUID, "--group", "a", "--gpu", "0", "--sm", "30", "--mem", "2G", "--procs", "2")
	run(bobUID, "--group", "a", "--gpu", "1", "--sm", "40", "--mem", "3G")
	e.waitStatus("alice and bob running in a", func(st api.Status) bool { return runningIn(st, "a") == 2 })
	run(bobUID, "--group", "b", "--gpus", "2", "--sm", "50", "--mem", "3G")
	e.waitStatus("bob running in b", func(st api.Status) bool { return runningIn(st, "b") == 1 })
	run(aliceUID, "--group", "b", "--gpus", "2", "--sm", "10", "--mem", "2G", "--wait", "5m")
	e.waitStatus("alice queued in b", func(st api.Status) bool { return st.Queue["b"] == 1 })

	golden := filepath.Join("testdata", "metrics", "budgets.golden")
	if *updateMetrics {
		if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, exposition(t, e.d.metricsGatherer(), budgetMetrics), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(e.d.metricsGatherer(), strings.NewReader(string(want)), budgetMetrics...); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(e.d.metricsGatherer(), budgetMetrics...); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}
}

// runningIn counts group g's running leases in st.
func runningIn(st api.Status, g string) int {
	n := 0
	for _, l := range st.Leases {
		if l.Group == g && l.State == api.LeaseRunning {
			n++
		}
	}
	return n
}

// exposition is the text exposition of reg's metrics named in names.
func exposition(t *testing.T, reg prometheus.Gatherer, names []string) []byte {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if slices.Contains(names, f.GetName()) {
			if err := enc.Encode(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b.Bytes()
}
