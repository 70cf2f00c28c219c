package promtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The shipped files, relative to the repository root.
const (
	rulesFile     = "examples/prometheus/mpsd-alerts.yml"
	rulesTestFile = "examples/prometheus/mpsd-alerts_test.yml"
	configFile    = "examples/prometheus/prometheus.yml"
	dashboardFile = "examples/grafana/mpsd.json"
	alertsDoc     = "docs/alerts.md"
	// runbookBase is where the alerts' runbook_url and the dashboard's
	// link point: docs/alerts.md as the package installs it (docs/install.md;
	// the chart's prometheus.runbookBase replaces it).
	runbookBase = "file:///usr/share/doc/mpsd/alerts.md#"
)

// metricContract is what mpsd exports (docs/architecture.md#metrics-and-systemd): each metric's labels,
// and whether it is a histogram (then _bucket, _sum and _count exist).
type metricContract struct {
	labels    []string
	histogram bool
}

var (
	instLabels = []string{"gpu", "gpu_index", "group"}
	contract   = map[string]metricContract{
		"mpsd_build_info":                            {labels: []string{"version", "commit", "goversion"}},
		"mpsd_instance_up":                           {labels: instLabels},
		"mpsd_mps_info":                              {labels: append(slices.Clone(instLabels), "driver_version", "mps_version")},
		"mpsd_instance_state":                        {labels: append(slices.Clone(instLabels), "state")},
		"mpsd_server_restarts_total":                 {labels: append(slices.Clone(instLabels), "reason")},
		"mpsd_faults_total":                          {labels: append(slices.Clone(instLabels), "kind")},
		"mpsd_quarantined":                           {labels: instLabels},
		"mpsd_mps_log_lost":                          {labels: instLabels},
		"mpsd_shm_used_bytes":                        {labels: instLabels},
		"mpsd_shm_size_bytes":                        {labels: instLabels},
		"mpsd_shm_full":                              {labels: instLabels},
		"mpsd_shm_cleaned_total":                     {labels: instLabels},
		"mpsd_clients":                               {labels: instLabels},
		"mpsd_sm_allocated_percent":                  {labels: instLabels},
		"mpsd_memory_allocated_bytes":                {labels: instLabels},
		"mpsd_sm_budget_percent":                     {labels: instLabels},
		"mpsd_memory_budget_bytes":                   {labels: instLabels},
		"mpsd_clients_budget":                        {labels: instLabels},
		"mpsd_clients_allocated":                     {labels: instLabels},
		"mpsd_leases_running":                        {labels: instLabels},
		"mpsd_group_sm_budget_percent":               {labels: []string{"group"}},
		"mpsd_group_sm_allocated_percent":            {labels: []string{"group"}},
		"mpsd_group_memory_budget_bytes":             {labels: []string{"group"}},
		"mpsd_group_memory_allocated_bytes":          {labels: []string{"group"}},
		"mpsd_group_clients_budget":                  {labels: []string{"group"}},
		"mpsd_group_clients_allocated":               {labels: []string{"group"}},
		"mpsd_group_leases_running":                  {labels: []string{"group"}},
		"mpsd_queue_length":                          {labels: []string{"group"}},
		"mpsd_leases_granted_total":                  {labels: []string{"group"}},
		"mpsd_requeues_total":                        {labels: []string{"group"}},
		"mpsd_admission_wait_seconds":                {labels: []string{"group"}, histogram: true},
		"mpsd_gpu_xid_errors_total":                  {labels: []string{"gpu", "gpu_index", "xid"}},
		"mpsd_gpu_memory_used_bytes":                 {labels: []string{"gpu", "gpu_index"}},
		"mpsd_gpu_utilization_ratio":                 {labels: []string{"gpu", "gpu_index"}},
		"mpsd_config_last_reload_success":            {},
		"mpsd_config_last_reload_timestamp_seconds":  {},
		"mpsd_unverified_mps_records_total":          {labels: instLabels},
		"mpsd_mps_cap_drift_total":                   {labels: append(slices.Clone(instLabels), "cap")},
		"mpsd_leases_kill_stuck":                     {},
		"mpsd_cgroup_kill_failures_total":            {labels: []string{"group"}},
		"mpsd_local_resource_errors_total":           {labels: []string{"where"}},
		"mpsd_connections_open":                      {labels: []string{"listener"}},
		"mpsd_connections_refused_total":             {labels: []string{"listener", "reason"}},
		"mpsd_lease_requests_over_limit_total":       {},
		"mpsd_state_writable":                        {},
		"mpsd_state_write_failures_total":            {},
		"mpsd_unreconciled_clients_total":            {labels: []string{"group", "kind"}},
		"mpsd_unreconciled_clients_terminated_total": {labels: []string{"group", "kind"}},
		"mpsd_lease_memory_used_bytes":               {labels: []string{"group"}},
		"mpsd_pod_memory_exceeded_total":             {labels: []string{"group"}},
		"mpsd_lease_memory_used_bytes_by_lease":      {labels: []string{"group", "lease"}},
	}
	// Values a matcher on these labels may name.
	labelValues = map[string][]string{
		"state":  {"starting", "ready", "recovering", "quarantined", "draining", "drained", "retiring"},
		"reason": faultKinds,
		"kind":   append(slices.Clone(faultKinds), reconKinds...),
		"cap":    {"thread_percentage", "pinned_memory"},
	}
	faultKinds = []string{"daemon_exit", "server_exit", "fatal_exception", "server_fault", "hung", "xid", "admin_restart"}
	// The kinds of mpsd_unreconciled_clients_total.
	reconKinds = []string{"unleased", "wrong_instance", "bypass"}
	// Labels Prometheus adds to every scraped series.
	targetLabels = []string{"job", "instance"}
	// Standard Go and process collector metrics the dashboard may use.
	collectorMetrics = []string{"go_goroutines", "go_threads", "go_memstats_heap_inuse_bytes", "go_memstats_alloc_bytes",
		"go_gc_duration_seconds", "process_cpu_seconds_total", "process_resident_memory_bytes",
		"process_virtual_memory_bytes", "process_open_fds", "process_max_fds", "process_start_time_seconds"}
	severities = []string{"critical", "warning"}
)

// repoFile reads a file of the repository.
func repoFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(repoFile(t, rulesFile), &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rules", rulesFile)
	}
	return rules
}

// query is one PromQL expression of the shipped files and where it is.
type query struct {
	where, expr string
}

// dashboard is the part of Grafana's dashboard model the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Links []struct {
		Title string `json:"title"`
		URL   string `json:"url"`
	} `json:"links"`
}

type panel struct {
	ID         int                       `json:"id"`
	Type       string                    `json:"type"`
	Title      string                    `json:"title"`
	Datasource json.RawMessage           `json:"datasource"`
	GridPos    *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw := repoFile(t, dashboardFile)
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s is not valid dashboard JSON: %v", dashboardFile, err)
	}
	if !json.Valid(raw) {
		t.Fatalf("%s is not valid JSON", dashboardFile)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

var labelValuesFn = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*,\s*\w+\s*\)\s*$`)

// dashboardQueries returns every panel query and the series selectors of
// the label_values() template variables.
func dashboardQueries(t *testing.T, d dashboard) []query {
	t.Helper()
	var qs []query
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			qs = append(qs, query{where: "panel " + strings.TrimSpace(p.Title) + " " + tg.RefID, expr: tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValuesFn.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(SELECTOR, LABEL)", v.Name, v.Definition)
			continue
		}
		qs = append(qs, query{where: "variable " + v.Name, expr: m[1]})
	}
	return qs
}

var (
	stringLit  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	identifier = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	selector   = regexp.MustCompile(`\b((?:mpsd|go|process)_[A-Za-z0-9_:]*|up)\s*\{([^}]*)\}`)
	matcher    = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	grouping   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
)

// contractMetric maps a name used in a query to its contract entry: the
// name itself, or a histogram's with _bucket, _sum or _count.
func contractMetric(name string) (base string, c metricContract, ok bool) {
	if c, ok := contract[name]; ok && !c.histogram {
		return name, c, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, found := strings.CutSuffix(name, suffix); found {
			if c, ok := contract[b]; ok && c.histogram {
				return b, c, true
			}
		}
	}
	return "", metricContract{}, false
}

// checkQuery returns the metric names q uses, and a problem for every
// metric name, label or label value of q that is not in mpsd's contract.
// The parse is crude (identifiers outside string literals; selectors with
// their matchers; grouping clauses), which is all the shipped files need.
func checkQuery(q query) (metrics, problems []string) {
	errorf := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	if strings.TrimSpace(q.expr) == "" {
		errorf("%s: empty query", q.where)
		return nil, problems
	}
	bare := stringLit.ReplaceAllString(q.expr, `""`)
	for _, id := range identifier.FindAllString(bare, -1) {
		switch {
		case strings.HasPrefix(id, "mpsd_"):
			if _, _, ok := contractMetric(id); !ok {
				errorf("%s: metric %s is not one mpsd exports (query %q)", q.where, id, q.expr)
			}
			metrics = append(metrics, id)
		case strings.HasPrefix(id, "go_") || strings.HasPrefix(id, "process_"):
			if !slices.Contains(collectorMetrics, id) {
				errorf("%s: %s is not a standard Go or process collector metric (query %q)", q.where, id, q.expr)
			}
			metrics = append(metrics, id)
		}
	}
	allLabels := map[string]bool{"le": true}
	for _, l := range targetLabels {
		allLabels[l] = true
	}
	for _, c := range contract {
		for _, l := range c.labels {
			allLabels[l] = true
		}
	}
	for _, m := range selector.FindAllStringSubmatch(q.expr, -1) {
		name, matchers := m[1], m[2]
		var allowed []string
		switch {
		case name == "up" || strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_"):
			allowed = nil
		default:
			base, c, ok := contractMetric(name)
			if !ok {
				continue // reported above
			}
			allowed = c.labels
			if base != name && strings.HasSuffix(name, "_bucket") {
				allowed = append(slices.Clone(allowed), "le")
			}
		}
		for _, mm := range matcher.FindAllStringSubmatch(matchers, -1) {
			label, op, value := mm[1], mm[2], mm[3]
			if !slices.Contains(allowed, label) && !slices.Contains(targetLabels, label) {
				errorf("%s: %s has no label %q (it has %v and the target's %v)", q.where, name, label, allowed, targetLabels)
				continue
			}
			enum, ok := labelValues[label]
			if !ok || strings.HasPrefix(value, "$") {
				continue
			}
			vals := []string{value}
			if op == "=~" || op == "!~" {
				vals = strings.Split(value, "|")
			}
			for _, v := range vals {
				if !slices.Contains(enum, v) {
					errorf("%s: %s{%s%s%q}: %q is not a value of %s (%v)", q.where, name, label, op, value, v, label, enum)
				}
			}
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(bare, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !allLabels[l] {
				errorf("%s: grouping by %q, a label no mpsd metric has (query %q)", q.where, l, q.expr)
			}
		}
	}
	return metrics, problems
}

func TestAlertRulesUseContractMetrics(t *testing.T) {
	used := map[string]bool{}
	for _, r := range loadRules(t) {
		name := r.Alert + r.Record
		metrics, problems := checkQuery(query{where: "rule " + name, expr: r.Expr})
		for _, p := range problems {
			t.Error(p)
		}
		for _, m := range metrics {
			used[m] = true
		}
	}
	// The rules watch what docs/architecture.md#metrics-and-systemd promises alerts on.
	for _, m := range []string{"mpsd_instance_up", "mpsd_instance_state", "mpsd_server_restarts_total", "mpsd_quarantined",
		"mpsd_queue_length", "mpsd_leases_granted_total", "mpsd_requeues_total", "mpsd_gpu_xid_errors_total",
		"mpsd_config_last_reload_success"} {
		if !used[m] {
			t.Errorf("no alert rule uses %s", m)
		}
	}
}

func TestDashboardUsesContractMetrics(t *testing.T) {
	d := loadDashboard(t)
	used := map[string]bool{}
	for _, q := range dashboardQueries(t, d) {
		metrics, problems := checkQuery(q)
		for _, p := range problems {
			t.Error(p)
		}
		for _, m := range metrics {
			if base, _, ok := contractMetric(m); ok {
				m = base
			}
			used[m] = true
		}
	}
	// Every metric of the contract has a panel.
	var missing []string
	for m := range contract {
		if !used[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("no dashboard query shows %v", missing)
	}
}

// TestCheckQueryCatchesMistakes keeps the crude parser honest.
func TestCheckQueryCatchesMistakes(t *testing.T) {
	for _, tc := range []struct {
		expr string
		bad  bool
	}{
		{`sum by (group) (rate(mpsd_admission_wait_seconds_bucket{group=~"$group", le="1"}[5m]))`, false},
		{`mpsd_instance_state{state=~"quarantined|draining", job="mpsd"} == 1`, false},
		{`increase(mpsd_server_restarts_total{reason!="admin_restart"}[10m])`, false},
		{`rate(process_cpu_seconds_total{instance="a"}[5m])`, false},
		{`mpsd_instance_ups == 0`, true},                                  // unknown metric
		{`mpsd_queue_length_bucket`, true},                                // not a histogram
		{`mpsd_clients{gpu_uuid="x"}`, true},                              // unknown label
		{`mpsd_instance_state{state="quarantine"}`, true},                 // unknown state
		{`mpsd_faults_total{kind=~"xid|oom"}`, true},                      // unknown kind
		{`sum by (gpu_uuid) (mpsd_clients)`, true},                        // unknown grouping label
		{`mpsd_gpu_xid_errors_total{xid="79"} unless on (host) up`, true}, // unknown label in on()
		{`go_goroutine`, true},                                            // not a collector metric
	} {
		_, problems := checkQuery(query{where: "test", expr: tc.expr})
		if got := len(problems) > 0; got != tc.bad {
			t.Errorf("checkQuery(%q) problems %q; want a problem: %v", tc.expr, problems, tc.bad)
		}
	}
}

// githubAnchors returns the anchors GitHub makes for the Markdown headings
// of doc: lower case, punctuation dropped, spaces to dashes.
func githubAnchors(doc string) map[string]string {
	anchors := map[string]string{}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		anchors[b.String()] = text
	}
	return anchors
}

func TestAlertsHaveAnnotationsAndRunbooks(t *testing.T) {
	anchors := githubAnchors(string(repoFile(t, alertsDoc)))
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		if seen[r.Alert] {
			t.Errorf("alert %s defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if !slices.Contains(severities, r.Labels["severity"]) {
			t.Errorf("%s: severity %q, want one of %v", r.Alert, r.Labels["severity"], severities)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		url := r.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(url, runbookBase)
		if !ok {
			t.Errorf("%s: runbook_url %q does not start with %s", r.Alert, url, runbookBase)
			continue
		}
		if anchor != strings.ToLower(r.Alert) {
			t.Errorf("%s: runbook anchor %q, want %q (the alert's own section)", r.Alert, anchor, strings.ToLower(r.Alert))
		}
		if _, ok := anchors[anchor]; !ok {
			t.Errorf("%s: runbook anchor #%s has no heading in %s", r.Alert, anchor, alertsDoc)
		}
	}
	// Every section of the doc named like an alert is one (no stale runbooks).
	alertName := regexp.MustCompile(`^(MPS|Mpsd)[A-Za-z]+$`)
	for _, text := range anchors {
		if alertName.MatchString(text) && !seen[text] {
			t.Errorf("%s has a section %q but no such alert exists", alertsDoc, text)
		}
	}
}

func TestEveryAlertIsTested(t *testing.T) {
	var f struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			Name          string `yaml:"name"`
			AlertRuleTest []struct {
				EvalTime  string `yaml:"eval_time"`
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(repoFile(t, rulesTestFile), &f); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if !slices.Contains(f.RuleFiles, filepath.Base(rulesFile)) {
		t.Errorf("%s: rule_files %v does not name %s", rulesTestFile, f.RuleFiles, filepath.Base(rulesFile))
	}
	firing, quiet := map[string]int{}, map[string]int{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		if firing[r.Alert] == 0 {
			t.Errorf("%s: no test case where it fires", r.Alert)
		}
		if quiet[r.Alert] == 0 {
			t.Errorf("%s: no test case where it must not fire", r.Alert)
		}
	}
}

// TestDashboardLinksRunbooks: the dashboard's runbook link is the alerts'
// runbook base (the installed docs/alerts.md), not an address of its own.
func TestDashboardLinksRunbooks(t *testing.T) {
	d := loadDashboard(t)
	want := strings.TrimSuffix(runbookBase, "#")
	var urls []string
	for _, l := range d.Links {
		urls = append(urls, l.URL)
	}
	if !slices.Contains(urls, want) {
		t.Errorf("dashboard links %q, want one to %s", urls, want)
	}
}

func TestDashboardPanels(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q: want both", d.UID, d.Title)
	}
	const ds = `"${datasource}"`
	hasDSVar := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" {
			hasDSVar = true
		}
	}
	if !hasDSVar {
		t.Errorf("no datasource template variable: panels must not be tied to one Prometheus")
	}
	ids := map[int]string{}
	n := 0
	for _, p := range allPanels(d.Panels) {
		if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %d %q: bad gridPos %+v", p.ID, p.Title, p.GridPos)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, other, p.Title)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		n++
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if !strings.Contains(string(p.Datasource), ds) {
			t.Errorf("panel %q: datasource %s, want uid %s", p.Title, p.Datasource, ds)
		}
		queries := 0
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) != "" {
				queries++
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q missing or repeated", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if !strings.Contains(string(tg.Datasource), ds) {
				t.Errorf("panel %q %s: datasource %s, want uid %s", p.Title, tg.RefID, tg.Datasource, ds)
			}
		}
		if queries == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
	if n == 0 {
		t.Fatal("dashboard has no panels")
	}
}
