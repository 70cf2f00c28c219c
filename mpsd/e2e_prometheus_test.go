package mpsd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/promtest"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// Real Prometheus scrapes a simulated mpsd with the shipped alert rules
// loaded; three crashes of one instance's server make the restart-loop
// alert fire for that instance, read back from Prometheus's HTTP API.
// promtool also lints mpsd's live /metrics.
func TestPrometheusEndToEnd(t *testing.T) {
	prom := promtest.PrometheusPath(t)
	promtool := promtest.PromtoolPath(t)
	// Group a on GPU 0 only, so its requeued client comes back there.
	e := newEnv(t, `  a:
    users: [root]
    memory: 10G
    gpus: ["0"]
  b:
    users: [root]
    memory: 10G
`, faultWatchdog)
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.opts.MetricsListener = mln
	maddr := mln.Addr().String()
	e.start()

	// promtool check metrics on the live output.
	resp, err := http.Get("http://" + maddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	lint := exec.Command(promtool, "check", "metrics")
	lint.Stdin = bytes.NewReader(body)
	if out, err := lint.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	// Prometheus with the shipped rules, evaluated every second.
	root, _ := os.Getwd()
	rules := filepath.Join(filepath.Dir(root), "examples", "prometheus", "mpsd-alerts.yml")
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: mpsd
    static_configs:
      - targets: [%q]
`, rules, maddr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	paddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	pcmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+paddr)
	plog, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plog.Close() }()
	pcmd.Stdout, pcmd.Stderr = plog, plog
	pp := startProc(t, pcmd)
	defer func() {
		_ = pcmd.Process.Signal(syscall.SIGTERM)
		pp.wait(t)
		if t.Failed() {
			b, _ := os.ReadFile(plog.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	}()
	promGet := func(path string, out any) error {
		resp, err := http.Get("http://" + paddr + path)
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s: %s", path, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(out)
	}
	// Prometheus has the rules loaded and scrapes mpsd.
	e.waitStatus("prometheus scraping mpsd", func(api.Status) bool {
		var r struct {
			Data struct {
				Result []struct {
					Value []any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		err := promGet("/api/v1/query?query="+url.QueryEscape(`up{job="mpsd"}`), &r)
		return err == nil && len(r.Data.Result) == 1 && r.Data.Result[0].Value[1] == "1"
	})

	// Three crashes of a/0's server, each with a client on it.
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch("--group", "a", "--requeue", "10", "--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"))
	for i := range 3 {
		st := e.waitStatus("a's client connected", func(st api.Status) bool {
			in := instanceOf(st, "a", 0)
			return in.State == api.InstanceReady && in.Clients == 1 && len(in.ServerPIDs) == 1 && e.mpsClients(in) == 1
		})
		if err := syscall.Kill(instanceOf(st, "a", 0).ServerPIDs[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		e.waitStatus("a/0 recovered", func(st api.Status) bool { return instanceOf(st, "a", 0).Restarts == i+1 })
	}
	var firing []map[string]string
	e.waitStatus("the restart-loop alert firing", func(api.Status) bool {
		var r struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		if err := promGet("/api/v1/alerts", &r); err != nil {
			return false
		}
		firing = firing[:0]
		for _, a := range r.Data.Alerts {
			if a.State == "firing" {
				firing = append(firing, a.Labels)
			}
		}
		for _, l := range firing {
			if l["alertname"] == "MPSInstanceRestartLoop" && l["group"] == "a" && l["gpu_index"] == "0" {
				return true
			}
		}
		return false
	})
	for _, l := range firing {
		if l["alertname"] == "MPSInstanceRestartLoop" && (l["group"] != "a" || l["gpu_index"] != "0") {
			t.Errorf("restart-loop alert for an untouched instance: %v", l)
		}
		if strings.HasPrefix(l["alertname"], "Mpsd") {
			t.Errorf("unexpected alert firing: %v", l)
		}
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)
}
