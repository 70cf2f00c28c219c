package mpsd

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mpsd/mpsd/api"
)

// designMetrics are the names docs/architecture.md#metrics-and-systemd promises.
// (mpsd_lease_memory_used_bytes_by_lease only with metrics.per_lease).
var designMetrics = []string{
	"mpsd_instance_up", "mpsd_server_restarts_total", "mpsd_faults_total", "mpsd_quarantined", "mpsd_mps_log_lost",
	"mpsd_clients", "mpsd_sm_allocated_percent", "mpsd_memory_allocated_bytes", "mpsd_queue_length",
	"mpsd_requeues_total", "mpsd_admission_wait_seconds", "mpsd_gpu_xid_errors_total",
	"mpsd_gpu_memory_used_bytes", "mpsd_gpu_utilization_ratio", "mpsd_config_last_reload_success", "mpsd_build_info",
	"mpsd_mps_info", "mpsd_mps_cap_drift_total", "mpsd_lease_memory_used_bytes", "mpsd_unreconciled_clients_total",
	"mpsd_unreconciled_clients_terminated_total", "mpsd_state_writable", "mpsd_state_write_failures_total",
	"mpsd_sm_budget_percent", "mpsd_memory_budget_bytes", "mpsd_clients_budget", "mpsd_clients_allocated", "mpsd_leases_running",
	"mpsd_group_sm_budget_percent", "mpsd_group_sm_allocated_percent", "mpsd_group_memory_budget_bytes",
	"mpsd_group_memory_allocated_bytes", "mpsd_group_clients_budget", "mpsd_group_clients_allocated", "mpsd_group_leases_running",
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of the series of name whose labels include all
// of want; ok is false when there is none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		match := true
		for k, v := range want {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// /metrics shows every metric of docs/architecture.md#metrics-and-systemd with values that match the
// daemon's state; a server crash raises the restart and fault counters of
// its instance only. /healthz and /readyz answer.
func TestMetricsEndpoint(t *testing.T) {
	e := newEnv(t, groupsAB("10G"), "")
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.opts.MetricsListener = mln
	addr := mln.Addr().String()
	e.start()
	if code, body := httpGet(t, "http://"+addr+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	e.waitStatus("ready", func(api.Status) bool { return e.d.ready.Load() })
	if code, body := httpGet(t, "http://"+addr+"/readyz"); code != 200 || !strings.Contains(body, "4 ready") {
		t.Errorf("/readyz: %d %s", code, body)
	}

	client := e.emu + "/mpsemu-client"
	p := startProc(t, e.launch("--group", "a", "--sm", "30", "--mem", "2G", "--", client, "--duration", "1m"))
	st := e.waitStatus("a's client connected", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.Clients == 1 && len(in.ServerPIDs) == 1 && e.mpsClients(in) == 1
	})
	a0 := instanceOf(st, "a", 0)
	sim := e.sim
	<-sim.XidWatched()
	if err := sim.InjectXid(1, 31, 0); err != nil { // an application Xid on GPU 1, nobody's
		t.Fatal(err)
	}
	e.waitStatus("the Xid counted", func(api.Status) bool {
		v, _ := value(scrape(t, addr), "mpsd_gpu_xid_errors_total", map[string]string{"gpu_index": "1", "xid": "31"})
		return v == 1
	})

	fams := scrape(t, addr)
	for _, name := range designMetrics {
		if _, ok := fams[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	inst := map[string]string{"group": "a", "gpu_index": "0", "gpu": a0.GPUUUID}
	for name, want := range map[string]float64{
		"mpsd_instance_up":            1,
		"mpsd_clients":                1,
		"mpsd_sm_allocated_percent":   30,
		"mpsd_memory_allocated_bytes": 2 << 30,
		"mpsd_quarantined":            0,
		"mpsd_mps_log_lost":           0,
	} {
		if v, ok := value(fams, name, inst); !ok || v != want {
			t.Errorf("%s%v = %v (found %v), want %v", name, inst, v, ok, want)
		}
	}
	if v, _ := value(fams, "mpsd_leases_granted_total", map[string]string{"group": "a"}); v != 1 {
		t.Errorf("granted in a = %v, want 1", v)
	}
	if v, _ := value(fams, "mpsd_admission_wait_seconds", map[string]string{"group": "a"}); v != 1 {
		t.Errorf("admission waits observed in a = %v, want 1", v)
	}
	if v, _ := value(fams, "mpsd_config_last_reload_success", nil); v != 1 {
		t.Errorf("config_last_reload_success = %v", v)
	}
	if problems, err := testutil.GatherAndLint(e.d.metricsGatherer()); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}

	// A crash of a/0's server: its counters rise, nobody else's.
	if err := syscall.Kill(a0.ServerPIDs[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.waitStatus("a/0 recovered", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return in.Restarts == 1 && in.State == api.InstanceReady
	})
	fams = scrape(t, addr)
	for _, in := range e.d.Status().Instances {
		l := map[string]string{"group": in.Group, "gpu_index": strconv.Itoa(in.GPUIndex), "reason": faultServerExit}
		want := 0.0
		if in.Group == "a" && in.GPUIndex == 0 {
			want = 1
		}
		if v, _ := value(fams, "mpsd_server_restarts_total", l); v != want {
			t.Errorf("restarts of %s/%d = %v, want %v", in.Group, in.GPUIndex, v, want)
		}
		delete(l, "reason")
		l["kind"] = faultServerExit
		if v, _ := value(fams, "mpsd_faults_total", l); v != want {
			t.Errorf("faults of %s/%d = %v, want %v", in.Group, in.GPUIndex, v, want)
		}
	}
	if v, _ := value(fams, "mpsd_requeues_total", map[string]string{"group": "a"}); v != 1 {
		t.Errorf("requeues in a = %v, want 1", v)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)

	// A bad config edit shows as a failed reload.
	e.writeConfig("  a: {memroy: 1G}\n", "")
	e.waitStatus("the failed reload", func(api.Status) bool {
		v, _ := value(scrape(t, addr), "mpsd_config_last_reload_success", nil)
		return v == 0
	})
}

// Scrapes at once, in the protobuf and text formats Prometheus asks for,
// while the state they show changes: each shows one moment of it (every
// instance's mpsd_mps_info with the driver of that moment, every
// instance's Xid fault count the same), and nothing a scrape hands on is
// written after (the label pairs and the zero and one values scrapes
// share; go test -race).
func TestScrapesAtOnce(t *testing.T) {
	e := newEnvGPUs(t, 8, `  inference:
    users: [root]
    memory: 20G
`, "")
	d, err := New(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.host.Close() }()
	d.mu.Lock()
	d.instances, d.queues, d.leases = map[string]*instance{}, map[string][]*lease{}, map[string]*lease{}
	d.reconcileLocked(d.cfg)
	for _, in := range d.instances {
		if _, err := in.step(instEvUp, "test"); err != nil {
			t.Fatal(err)
		}
	}
	instances := len(d.instances)
	d.mu.Unlock()

	// Changes until the scrapes are done.
	done, changed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(changed)
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			d.mu.Lock()
			for _, in := range d.instances {
				in.driver = "580." + strconv.Itoa(i%3)
				in.faults[faultXid]++
			}
			d.mu.Unlock()
			runtime.Gosched()
		}
	}()
	h := d.metricsHandler()
	scrapeAs := func(accept string) error {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Accept", accept)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			return fmt.Errorf("scrape: %d %s", w.Code, w.Body)
		}
		dec := expfmt.NewDecoder(w.Body, expfmt.ResponseFormat(w.Result().Header))
		drivers, xids := map[string]int{}, map[float64]int{}
		for {
			var mf dto.MetricFamily
			if err := dec.Decode(&mf); err == io.EOF {
				break
			} else if err != nil {
				return err
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				switch {
				case mf.GetName() == "mpsd_mps_info":
					drivers[labels["driver_version"]]++
				case mf.GetName() == "mpsd_faults_total" && labels["kind"] == faultXid:
					xids[m.GetCounter().GetValue()]++
				}
			}
		}
		if len(drivers) != 1 || len(xids) != 1 {
			return fmt.Errorf("one scrape shows several moments: drivers %v, Xid fault counts %v", drivers, xids)
		}
		for _, n := range drivers {
			if n != instances {
				return fmt.Errorf("mpsd_mps_info of %d instances, want %d", n, instances)
			}
		}
		return nil
	}
	const scrapes = 20
	errs := make(chan error, 2)
	for _, accept := range []string{
		"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
		"text/plain;version=0.0.4",
	} {
		go func() {
			var err error
			for i := 0; i < scrapes && err == nil; i++ {
				err = scrapeAs(accept)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(done)
	<-changed
}
