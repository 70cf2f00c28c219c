package promtest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// run runs a fetched program in dir and returns its combined output,
// failing the test with it if the program fails.
func run(t *testing.T, dir, prog string, args ...string) string {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(prog), strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool := PromtoolPath(t)
	out := run(t, repoPath(t, filepath.Dir(rulesFile)), promtool, "check", "rules", filepath.Base(rulesFile))
	rules := 0
	for _, r := range loadRules(t) {
		if r.Alert != "" || r.Record != "" {
			rules++
		}
	}
	if want := "SUCCESS: " + strconv.Itoa(rules) + " rules found"; !strings.Contains(out, want) {
		t.Errorf("promtool check rules: want %q in\n%s", want, out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	promtool := PromtoolPath(t)
	out := run(t, repoPath(t, filepath.Dir(rulesTestFile)), promtool, "test", "rules", filepath.Base(rulesTestFile))
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: no SUCCESS in\n%s", out)
	}
	t.Logf("promtool %s: %s", Version(), strings.TrimSpace(out))
}

// TestPromtoolTestRulesCatchesAChange makes sure the rule tests test the
// rules: the same tests against a rule file where MPSInstanceDown also
// fires for draining instances must fail.
func TestPromtoolTestRulesCatchesAChange(t *testing.T) {
	promtool := PromtoolPath(t)
	dir := t.TempDir()
	rules := string(repoFile(t, rulesFile))
	mutated := strings.Replace(rules, `state=~"quarantined|draining|drained|retiring"`, `state=~"quarantined"`, 1)
	if mutated == rules {
		t.Fatalf("%s: MPSInstanceDown no longer excludes draining instances as this test expects", rulesFile)
	}
	for name, content := range map[string][]byte{
		filepath.Base(rulesFile):     []byte(mutated),
		filepath.Base(rulesTestFile): repoFile(t, rulesTestFile),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(promtool, "test", "rules", filepath.Base(rulesTestFile))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("promtool test rules passed with a broken MPSInstanceDown:\n%s", out)
	}
	if !strings.Contains(string(out), "MPSInstanceDown") {
		t.Errorf("promtool test rules failed, but not on MPSInstanceDown:\n%s", out)
	}
}

func TestPromtoolCheckConfig(t *testing.T) {
	promtool := PromtoolPath(t)
	out := run(t, repoPath(t, filepath.Dir(configFile)), promtool, "check", "config", filepath.Base(configFile))
	if !strings.Contains(out, "SUCCESS: 1 rule files found") {
		t.Errorf("promtool check config: the example config does not load the rules:\n%s", out)
	}
}

// grafanaVar matches the dashboard's template variables in a query.
var grafanaVar = regexp.MustCompile(`\$\{?(__rate_interval|__interval|__range|[A-Za-z_][A-Za-z0-9_]*)\}?`)

// TestDashboardQueriesParse has promtool parse every dashboard query, with
// Grafana's variables replaced by values of the right kind, as recording
// rules (JSON is YAML, so the rule file is written with encoding/json).
func TestDashboardQueriesParse(t *testing.T) {
	promtool := PromtoolPath(t)
	type recording struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []recording
	where := map[string]string{}
	for i, q := range dashboardQueries(t, loadDashboard(t)) {
		expr := grafanaVar.ReplaceAllStringFunc(q.expr, func(v string) string {
			switch strings.Trim(v, "${}") {
			case "__rate_interval", "__interval", "__range":
				return "5m"
			}
			return ".*" // every variable is a label value, used with =~
		})
		name := "dashboard:query_" + strconv.Itoa(i)
		where[name] = q.where
		rules = append(rules, recording{Record: name, Expr: expr})
	}
	file := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	b, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "check", "rules", "dashboard.rules.yml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Name the panels promtool complains about.
		msg := string(out)
		for name, w := range where {
			msg = strings.ReplaceAll(msg, name+"\"", name+"\" ("+w+")")
		}
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, msg)
	}
	if want := "SUCCESS: " + strconv.Itoa(len(rules)) + " rules found"; !strings.Contains(string(out), want) {
		t.Errorf("want %q in\n%s", want, out)
	}
}

// TestPrometheusRuns checks the fetched server starts on this machine (it
// is dynamically linked against the C library).
func TestPrometheusRuns(t *testing.T) {
	prometheus := PrometheusPath(t)
	out := run(t, t.TempDir(), prometheus, "--version")
	if !strings.Contains(out, "prometheus, version") {
		t.Errorf("prometheus --version:\n%s", out)
	}
}
