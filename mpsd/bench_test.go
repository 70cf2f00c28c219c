package mpsd

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/policy"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// leaseClient opens lease streams on its own connection each, as
// mps-launch does.
func leaseClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

// grant posts a lease request and reads the stream up to the granted
// event; the lease is held until the returned body is closed.
func grant(c *http.Client, body string) (interface{ Close() error }, error) {
	resp, err := c.Post("http://mpsd"+api.PathLeases, api.ContentTypeJSON, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		e := api.DecodeError(resp.StatusCode, resp.Body)
		_ = resp.Body.Close()
		return nil, e
	}
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err != nil {
			_ = resp.Body.Close()
			return nil, err
		}
		if ev.Type == api.EventGranted {
			return resp.Body, nil
		}
		if ev.Type == api.EventError {
			_ = resp.Body.Close()
			return nil, fmt.Errorf("%s: %s", ev.Code, ev.Message)
		}
	}
}

const benchGroup = `  inference:
    users: [root]
    memory: 20G
    max_clients: 48
`

// BenchmarkLeaseGrantRelease: 100 concurrent API clients each take a
// lease and release it, with capacity free. First as fast as they can
// (leases/s, the throughput), then paced to an offered load of 5,000
// leases per second in all (p50/p99 grant latency, request sent → granted
// read, at that load; in the flat-out phase latency is only the clients'
// own queueing).
//
//	go test -run '^$' -bench LeaseGrantRelease -benchtime 5000x ./mpsd
func BenchmarkLeaseGrantRelease(b *testing.B) {
	e := newEnvGPUs(b, 4, benchGroup, "")
	e.opts.Logger = slog.New(slog.NewTextHandler(e.log, nil)) // info, as in production
	e.start()
	c := leaseClient(e.socket)
	const clients = 100
	b.ResetTimer()
	start := time.Now()
	leaseLoop(b, c, clients, b.N, 0)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "leases/s")

	const offered = 5000
	lat := leaseLoop(b, c, clients, b.N, time.Second*clients/offered)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-grant-ms@5k/s")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-grant-ms@5k/s")
	}
	c.CloseIdleConnections()
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// leaseLoop runs n grant+release cycles over the given number of
// concurrent clients, each starting a cycle every interval (0: at once),
// and returns the sorted grant latencies.
func leaseLoop(b *testing.B, c *http.Client, clients, n int, interval time.Duration) []time.Duration {
	lat := make([][]time.Duration, clients)
	var mu sync.Mutex
	left := n
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			// Spread the clients' starts over one interval, so a paced
			// load arrives evenly rather than in bursts of 100.
			next := time.Now().Add(interval * time.Duration(i) / time.Duration(clients))
			for {
				mu.Lock()
				if left == 0 {
					mu.Unlock()
					return
				}
				left--
				mu.Unlock()
				if interval > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(interval)
				}
				t0 := time.Now()
				body, err := grant(c, `{"sm":1,"mem_bytes":67108864}`)
				if err != nil {
					b.Error(err)
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
				_ = body.Close()
			}
		})
	}
	wg.Wait()
	all := slices.Concat(lat...)
	slices.Sort(all)
	return all
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// BenchmarkLaunchOverhead: what mps-launch adds to a program's run, from
// exec to exit: `mps-launch --sm 10 --mem 1G -- /bin/true` against
// `/bin/true`, alternating in the same run. Reports both medians and the
// difference.
//
//	go test -run '^$' -bench LaunchOverhead -benchtime 200x ./mpsd
func BenchmarkLaunchOverhead(b *testing.B) {
	e := newEnv(b, benchGroup, "")
	e.start()
	launch := filepath.Join(e.bin, "mps-launch")
	env := append(os.Environ(), api.EnvSocket+"="+e.socket)
	var direct, launched []time.Duration
	runOnce := func(name string, args ...string) time.Duration {
		cmd := exec.Command(name, args...)
		cmd.Env = env
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", name, err, out)
		}
		return time.Since(t0)
	}
	b.ResetTimer()
	for b.Loop() {
		direct = append(direct, runOnce("/bin/true"))
		launched = append(launched, runOnce(launch, "--sm", "10", "--mem", "1G", "--", "/bin/true"))
	}
	b.StopTimer()
	md, ml := median(direct), median(launched)
	b.ReportMetric(float64(md.Microseconds())/1000, "true-ms")
	b.ReportMetric(float64(ml.Microseconds())/1000, "mps-launch-ms")
	b.ReportMetric(float64((ml-md).Microseconds())/1000, "added-ms")
}

// BenchmarkRSS1000Leases: mpsd's resident memory, as a process of its
// own, with 1,000 live leases held by open streams (24 simulated GPUs of
// 48 clients each).
//
//	go test -run '^$' -bench RSS1000Leases -benchtime 1x ./mpsd
func BenchmarkRSS1000Leases(b *testing.B) {
	e := newEnvGPUs(b, 24, benchGroup, "")
	for b.Loop() {
		measureRSS(b, e, 1000)
	}
}

func measureRSS(b *testing.B, e *testEnv, n int) {
	cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate", "--log-level", "warn")
	cmd.Stderr = e.log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	c := leaseClient(e.socket)
	deadline := time.Now().Add(waitFor)
	for {
		resp, err := c.Get("http://mpsd" + api.PathStatus)
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("mpsd not serving: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.ReportMetric(float64(vmRSS(b, cmd.Process.Pid))/(1<<20), "MiB-rss-idle")
	var held []interface{ Close() error }
	defer func() {
		for _, h := range held {
			_ = h.Close()
		}
	}()
	for i := range n {
		h, err := grant(c, `{"sm":1,"mem_bytes":67108864}`)
		if err != nil {
			b.Fatalf("lease %d: %v", i, err)
		}
		held = append(held, h)
	}
	rss := vmRSS(b, cmd.Process.Pid)
	b.ReportMetric(float64(rss)/(1<<20), "MiB-rss")
	b.ReportMetric(float64(len(held)), "leases")
}

func vmRSS(b *testing.B, pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// BenchmarkFailover: an MPS server with N clients is SIGKILLed; the time
// until mpsd has seen it (detect) and until every client runs again as a
// fresh process under a requeued lease (failover), over 20 kills.
//
//	go test -run '^$' -bench Failover -benchtime 1x ./mpsd
func BenchmarkFailover(b *testing.B) {
	for _, n := range []int{8, 48} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			for b.Loop() {
				failover(b, n, 20)
			}
		})
	}
}

func failover(b *testing.B, n, runs int) {
	e := newEnv(b, `  a:
    users: [root]
    memory: 40G
    gpus: ["0"]
    requeue_attempts: 1000
`, `watchdog:
  backoff_initial: 1ms
  backoff_max: 10ms
  quarantine_after: 1000`)
	e.opts.Logger = slog.New(slog.NewTextHandler(e.log, nil))
	var killAt atomic.Int64
	detected := make(chan time.Duration, 16)
	var hookMu sync.Mutex
	seen := true // nothing has failed yet
	e.opts.faultHook = func(*instance, fault) {
		hookMu.Lock()
		defer hookMu.Unlock()
		if !seen {
			seen = true
			detected <- time.Since(time.Unix(0, killAt.Load()))
		}
	}
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	for range n {
		startProc(b, e.launch("--sm", "1", "--mem", "64M", "--", client, "--duration", "1h"))
	}
	clientsRunning := func(st api.Status, attempt int) bool {
		if countLeases(st, api.LeaseRunning) != n {
			return false
		}
		for _, l := range st.Leases {
			if l.Attempt != attempt || !slices.ContainsFunc(l.PIDs, isClient) {
				return false
			}
		}
		return true
	}
	st := e.waitStatus("every client running", func(st api.Status) bool {
		return clientsRunning(st, 1) && e.mpsClients(st.Instances[0]) == n
	})
	var fail, detect []time.Duration
	for run := range runs {
		server := st.Instances[0].ServerPIDs[0]
		hookMu.Lock()
		seen = false
		hookMu.Unlock()
		killAt.Store(time.Now().UnixNano())
		if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(waitFor)
		for {
			st = e.d.Status()
			if clientsRunning(st, run+2) && len(st.Instances[0].ServerPIDs) > 0 && st.Instances[0].ServerPIDs[0] != server {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("run %d: clients not relaunched: %+v", run, st)
			}
			time.Sleep(time.Millisecond)
		}
		fail = append(fail, time.Since(time.Unix(0, killAt.Load())))
		detect = append(detect, <-detected)
		// The next kill waits until every new client is an MPS client
		// of the new server.
		st = e.waitStatus("every client connected again", func(st api.Status) bool { return e.mpsClients(st.Instances[0]) == n })
	}
	slices.Sort(fail)
	slices.Sort(detect)
	p := func(d []time.Duration, q int) float64 { return float64(d[(len(d)-1)*q/100].Microseconds()) / 1000 }
	b.ReportMetric(p(fail, 50), "p50-failover-ms")
	b.ReportMetric(p(fail, 99), "p99-failover-ms")
	b.ReportMetric(p(detect, 50), "p50-detect-ms")
	b.ReportMetric(p(detect, 99), "p99-detect-ms")
}

func isClient(pid int) bool {
	comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(comm)) == "mpsemu-client"
}

// BenchmarkScrape: one /metrics scrape of a daemon with 64 instances and
// 1,000 leases (the daemon's state is built in memory; no MPS runs).
//
//	go test -run '^$' -bench Scrape -benchmem ./mpsd
func BenchmarkScrape(b *testing.B) {
	e := newEnvGPUs(b, 64, `  inference:
    users: [root]
    memory: 20G
`, "")
	d, err := New(e.opts)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = d.host.Close() }()
	d.mu.Lock()
	d.instances, d.queues, d.leases = map[string]*instance{}, map[string][]*lease{}, map[string]*lease{}
	d.reconcileLocked(d.cfg)
	insts := d.instanceList()
	for i := range 1000 {
		in := insts[i%len(insts)]
		l := &lease{id: fmt.Sprintf("inference-%012d", i), group: "inference", req: policyRequest(1, 64<<20), inst: in, box: newMailbox()}
		in.p.Assign(&l.req)
		in.leases[l.id] = l
		d.leases[l.id] = l
	}
	for _, in := range insts {
		in.up = true
		in.refreshLocked()
	}
	d.mu.Unlock()
	h := promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest("GET", "/metrics", nil)
	b.ReportAllocs()
	b.ResetTimer()
	w := &discardResponse{header: http.Header{}}
	for b.Loop() {
		clear(w.header)
		w.code, w.n = 0, 0
		h.ServeHTTP(w, req)
		if w.code != 200 || w.n == 0 {
			b.Fatalf("scrape: %d, %d bytes", w.code, w.n)
		}
	}
	b.ReportMetric(float64(w.n), "bytes/scrape")
}

// discardResponse is a ResponseWriter that counts and drops the body, as
// a socket would take it: a buffer growing to the whole body would be
// the benchmark's own allocation, not the scrape's.
type discardResponse struct {
	header http.Header
	code   int
	n      int
}

func (w *discardResponse) Header() http.Header  { return w.header }
func (w *discardResponse) WriteHeader(code int) { w.code = code }
func (w *discardResponse) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = 200
	}
	w.n += len(p)
	return len(p), nil
}

func policyRequest(sm int, mem int64) policy.Request {
	return policy.Request{Group: "inference", SM: sm, Mem: mem, GPUs: 1}
}
