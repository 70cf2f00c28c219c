package mpsd

// The benchmarks behind `make bench` (bench/REPORT.md). Each measures a
// figure of mpsd and, in the same run, the baseline it is compared with,
// and reports medians and p99s (nearest rank) with b.ReportMetric; the
// metric names are what bench/report reads. -benchtime Nx sets the number
// of samples where a benchmark takes one per iteration.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
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
	"github.com/mpsd/mpsd/internal/leasetest"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
	"github.com/mpsd/mpsd/policy"
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

// grantQueued posts a lease request and reads the stream up to the
// granted event, telling whether the request was queued first; the lease
// is held until the returned body is closed.
func grantQueued(c *http.Client, body string) (interface{ Close() error }, bool, error) {
	h, _, queued, err := grantLease(c, body)
	return h, queued, err
}

// grantLease is grantQueued that also returns the granted lease.
func grantLease(c *http.Client, body string) (interface{ Close() error }, *api.Lease, bool, error) {
	resp, err := c.Post("http://mpsd"+api.PathLeases, api.ContentTypeJSON, strings.NewReader(body))
	if err != nil {
		return nil, nil, false, err
	}
	if resp.StatusCode != http.StatusOK {
		e := api.DecodeError(resp.StatusCode, resp.Body)
		_ = resp.Body.Close()
		return nil, nil, false, e
	}
	dec := api.NewEventDecoder(resp.Body)
	queued := false
	for {
		ev, err := dec.Next()
		if err != nil {
			_ = resp.Body.Close()
			return nil, nil, queued, err
		}
		switch ev.Type {
		case api.EventGranted:
			return resp.Body, ev.Lease, queued, nil
		case api.EventQueued:
			queued = true
		case api.EventError:
			_ = resp.Body.Close()
			return nil, nil, queued, fmt.Errorf("%s: %s", ev.Code, ev.Message)
		}
	}
}

const benchGroup = `  inference:
    users: [root]
    memory: 20G
    max_clients: 48
`

// benchLimits lifts the per-user caps on connections and queued requests
// (128 and 64 by default): the benchmarks' clients are one user, root,
// and measure admission, not the caps that protect it.
const benchLimits = `limits:
  connections: 4096
  connections_per_user: 4096
  queued_per_user: 4096
`

// benchLease is the request every lease benchmark makes.
const benchLease = `{"sm":1,"mem_bytes":67108864}`

// pctMS is the q-th percentile of d by nearest rank (the p99 of 20
// samples is their maximum), in milliseconds. d is sorted in place.
func pctMS(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	slices.Sort(d)
	i := int(math.Ceil(q/100*float64(len(d)))) - 1
	i = min(max(i, 0), len(d)-1)
	return float64(d[i]) / float64(time.Millisecond)
}

// reportPcts reports the median and p99 of d as <name>-p50-ms and
// <name>-p99-ms.
func reportPcts(b *testing.B, name string, d []time.Duration) {
	b.ReportMetric(pctMS(d, 50), name+"-p50-ms")
	b.ReportMetric(pctMS(d, 99), name+"-p99-ms")
}

// liveLeases counts the daemon's leases, queued or running, without
// building a status.
func liveLeases(d *Daemon) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.leases)
}

// BenchmarkAdmission: grants+releases per second with 1, 100 and 1,000
// concurrent API clients, each taking a lease (on a connection of its own,
// as mps-launch does) and releasing it, b.N cycles in all, as fast as they
// can. 48 simulated GPUs of 48 clients each (2,304 leases) leave capacity
// free even for 1,000 clients; "queued" counts the grants that had to
// queue all the same (a release still in flight). The rate counts until
// mpsd has released every lease; grant latency is request sent → granted
// read, which with many clients is mostly their queueing for the CPU.
//
// Before the runs every instance takes its first lease, all at once
// (firstGrants): a new instance's first grant of a uid waits for the MPS
// command that sets its daemon's defaults to that uid's share, a cost of
// the instance's first use that the runs would otherwise pay on whichever
// instances they reach first. Its latency is reported with clients=1, as
// first-grant.
//
// Baseline, same clients and connections: the same POST to a path mpsd
// answers 404 (connection, HTTP and the mux, without admission).
// clients=100 also runs paced to an offered 5,000 cycles per second, for
// the grant latency at that load.
//
//	go test -run '^$' -bench Admission -benchtime 5000x ./mpsd
func BenchmarkAdmission(b *testing.B) {
	e := newEnvGPUs(b, 48, benchGroup, benchLimits)
	e.opts.Logger = slog.New(slog.NewTextHandler(e.log, nil)) // info, as in production
	e.start()
	first := firstGrants(b, e, 48)
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			admission(b, e, n)
			if n == 1 {
				reportPcts(b, "first-grant", first)
			}
		})
	}
}

// firstGrants takes one lease on each of the env's gpus instances at once
// (gpu_select names each GPU), then releases them, and returns each
// grant's latency.
func firstGrants(b *testing.B, e *testEnv, gpus int) []time.Duration {
	c := leaseClient(e.socket)
	defer c.CloseIdleConnections()
	lat := make([]time.Duration, gpus)
	held := make([]interface{ Close() error }, gpus)
	errs := make([]error, gpus)
	var wg sync.WaitGroup
	for i := range gpus {
		wg.Go(func() {
			t0 := time.Now()
			held[i], _, errs[i] = grantQueued(c, fmt.Sprintf(`{"sm":1,"mem_bytes":67108864,"gpu_select":["%d"]}`, i))
			lat[i] = time.Since(t0)
		})
	}
	wg.Wait()
	for i, h := range held {
		if h != nil {
			_ = h.Close()
		}
		if errs[i] != nil {
			b.Fatalf("first lease on GPU %d: %v", i, errs[i])
		}
	}
	deadline := time.Now().Add(waitFor)
	for liveLeases(e.d) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%d first leases still held %s after their release", liveLeases(e.d), waitFor)
		}
		time.Sleep(time.Millisecond)
	}
	return lat
}

func admission(b *testing.B, e *testEnv, clients int) {
	c := leaseClient(e.socket)
	defer c.CloseIdleConnections()
	var queued atomic.Int64
	lease := func() (time.Duration, error) {
		t0 := time.Now()
		body, q, err := grantQueued(c, benchLease)
		took := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if q {
			queued.Add(1)
		}
		return took, body.Close()
	}
	waitReleased := func() {
		deadline := time.Now().Add(waitFor)
		for liveLeases(e.d) > 0 {
			if time.Now().After(deadline) {
				b.Fatalf("%d leases still held %s after the last release", liveLeases(e.d), waitFor)
			}
			time.Sleep(time.Millisecond)
		}
	}

	b.ResetTimer()
	start := time.Now()
	lat := cycles(b, clients, b.N, 0, lease)
	waitReleased()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "leases/s")
	reportPcts(b, "grant", lat)
	b.ReportMetric(float64(queued.Load()), "queued")

	start = time.Now()
	base := cycles(b, clients, b.N, 0, func() (time.Duration, error) {
		t0 := time.Now()
		resp, err := c.Post("http://mpsd/v1/bench-baseline", api.ContentTypeJSON, strings.NewReader(benchLease))
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			return 0, fmt.Errorf("baseline: status %d, want 404", resp.StatusCode)
		}
		return time.Since(t0), nil
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "baseline-req/s")
	reportPcts(b, "baseline", base)

	if clients == 100 {
		const offered = 5000
		queued.Store(0)
		lat := cycles(b, clients, b.N, time.Second*time.Duration(clients)/offered, lease)
		waitReleased()
		reportPcts(b, "grant@5k/s", lat)
		b.ReportMetric(float64(queued.Load()), "queued@5k/s")
	}
}

// cycles runs op n times over the given number of concurrent clients,
// each starting one every interval (0: at once), and returns the
// durations op measured.
func cycles(b *testing.B, clients, n int, interval time.Duration, op func() (time.Duration, error)) []time.Duration {
	lat := make([][]time.Duration, clients)
	var left atomic.Int64
	left.Store(int64(n))
	var failed atomic.Bool
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			// Spread the clients' starts over one interval, so a paced
			// load arrives evenly rather than in bursts.
			next := time.Now().Add(interval * time.Duration(i) / time.Duration(clients))
			for left.Add(-1) >= 0 && !failed.Load() {
				if interval > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(interval)
				}
				took, err := op()
				if err != nil {
					if !failed.Swap(true) {
						b.Error(err)
					}
					return
				}
				lat[i] = append(lat[i], took)
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		b.FailNow()
	}
	return slices.Concat(lat...)
}

// BenchmarkLaunchOverhead: what mps-launch adds to a program's run, from
// exec to exit: `mps-launch --sm 10 --mem 1G -- /bin/true` against
// `/bin/true`, alternating, one pair per iteration. Reports both runs'
// medians and p99s and the added time (launched − direct, pair by pair;
// the target is a median of at most 3 ms).
//
// After the pairs, as many rounds measure the pieces of the added time
// that can be taken apart from outside mps-launch: its start-up and exit
// alone (`mps-launch --help`, which parses its flags and exits, minus a
// /bin/true run just before), and mpsd's two round trips as a client of
// the API makes them, each on a connection of its own as mps-launch does:
// the lease (request to granted event: admission, the state write the
// grant waits for) and the attach of a waiting child of this process
// (pidfd and /proc checks, the move into the lease cgroup, the check that
// it arrived). Each round ends once mpsd has released every lease.
//
//	go test -run '^$' -bench LaunchOverhead -benchtime 300x ./mpsd
func BenchmarkLaunchOverhead(b *testing.B) {
	e := newEnv(b, benchGroup, "")
	e.opts.Logger = slog.New(slog.NewTextHandler(e.log, nil))
	e.start()
	launch := filepath.Join(e.bin, "mps-launch")
	env := append(os.Environ(), api.EnvSocket+"="+e.socket)
	var direct, launched, added, startup, grant, attach, release []time.Duration
	runOnce := func(name string, args ...string) time.Duration {
		cmd := exec.Command(name, args...)
		cmd.Env = env
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", name, err, out)
		}
		return time.Since(t0)
	}
	c := leaseClient(e.socket)
	defer c.CloseIdleConnections()
	const body = `{"sm":10,"mem_bytes":1073741824}`
	for b.Loop() {
		d := runOnce("/bin/true")
		l := runOnce(launch, "--sm", "10", "--mem", "1G", "--", "/bin/true")
		direct, launched, added = append(direct, d), append(launched, l), append(added, l-d)
	}
	// The pieces, apart from the pairs: interleaved, they would change
	// what the pairs measure (a move into a cgroup costs an RCU grace
	// period unless another one came just before).
	for range len(direct) {
		d := runOnce("/bin/true")
		startup = append(startup, runOnce(launch, "--help")-d)
		g, a, r := launchRoundTrips(b, c, body)
		grant, attach, release = append(grant, g), append(attach, a), append(release, r)
		waitNoLeases(b, e.d)
	}
	reportPcts(b, "true", direct)
	reportPcts(b, "mps-launch", launched)
	reportPcts(b, "added", added)
	reportPcts(b, "startup", startup)
	reportPcts(b, "grant", grant)
	reportPcts(b, "attach", attach)
	reportPcts(b, "release", release)
}

// launchRoundTrips takes a lease, attaches a waiting child of this
// process to it and, once the child has ended, releases the lease, as
// mps-launch does, timing each (the release until mpsd has answered: the
// lease gone, its cgroup removed).
func launchRoundTrips(b *testing.B, c *http.Client, body string) (grant, attach, release time.Duration) {
	child := exec.Command("/bin/sleep", "3600")
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = child.Wait() }()
	defer func() { _ = child.Process.Kill() }()
	t0 := time.Now()
	h, lease, _, err := grantLease(c, body)
	grant = time.Since(t0)
	if err != nil {
		b.Fatalf("lease: %v", err)
	}
	defer func() { _ = h.Close() }()
	req, _ := json.Marshal(api.AttachRequest{PID: child.Process.Pid})
	t0 = time.Now()
	resp, err := c.Post("http://mpsd"+api.AttachPath(lease.ID), api.ContentTypeJSON, bytes.NewReader(req))
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	attach = time.Since(t0)
	if err != nil {
		b.Fatalf("attach pid %d to lease %s: %v", child.Process.Pid, lease.ID, err)
	}
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("attach pid %d to lease %s: status %d", child.Process.Pid, lease.ID, resp.StatusCode)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	req, _ = json.Marshal(api.ReleaseRequest{Attempt: lease.Attempt})
	t0 = time.Now()
	resp, err = c.Post("http://mpsd"+api.ReleasePath(lease.ID), api.ContentTypeJSON, bytes.NewReader(req))
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	release = time.Since(t0)
	if err != nil {
		b.Fatalf("release lease %s: %v", lease.ID, err)
	}
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("release lease %s: status %d", lease.ID, resp.StatusCode)
	}
	return grant, attach, release
}

// waitNoLeases waits until mpsd holds no lease, queued or running.
func waitNoLeases(b *testing.B, d *Daemon) {
	deadline := time.Now().Add(waitFor)
	for liveLeases(d) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%d leases still held %s after the last release", liveLeases(d), waitFor)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkMPSSetup: mpsd bringing up 8 instances (8 simulated GPUs, one
// group) from the start of Run to Options.Ready, against a shell script
// doing what NVIDIA's k8s-device-plugin does for each instance, one after
// the other: `nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY,
// CUDA_MPS_LOG_DIRECTORY and CUDA_VISIBLE_DEVICES set, then `echo
// set_default_active_thread_percentage 100 | nvidia-cuda-mps-control` and
// `echo set_default_device_pinned_mem_limit 0 20480M |
// nvidia-cuda-mps-control` (the defaults mpsd sets). Both run against the
// same control daemon: the emulator's and, when make fetch-mps has
// fetched it, NVIDIA's (which starts without a GPU). One of each per
// iteration, alternating which goes first; every daemon is stopped after
// its round (mpsd's by the harness, the script's with `echo quit`).
// mpsd's New (config, GPU inventory, cgroups) is not counted; it is
// reported as new-p50-ms.
//
//	go test -run '^$' -bench MPSSetup -benchtime 20x ./mpsd
func BenchmarkMPSSetup(b *testing.B) {
	b.Run("control=emulator", func(b *testing.B) { mpsSetup(b, "") })
	gen, real, err := benchRealControl()
	// Named by the driver version without the package revision: a name
	// ending in -N would read as go test's -GOMAXPROCS suffix.
	name := "control=nvidia"
	if gen != "" {
		v, _, _ := strings.Cut(emutest.RealVersion(gen), "-")
		if v == "" {
			v = gen
		}
		name += "-" + v
	}
	b.Run(name, func(b *testing.B) {
		if err != nil {
			b.Skipf("NVIDIA's nvidia-cuda-mps-control not fetched (%v); make fetch-mps fetches it", err)
		}
		mpsSetup(b, real)
	})
}

// benchRealControl finds NVIDIA's control daemon, the emulator's default
// generation first.
func benchRealControl() (gen, path string, err error) {
	for _, g := range []string{"550", "555", "535"} {
		p, e := emutest.RealControlPath(g)
		if e == nil {
			return g, p, nil
		}
		if err == nil {
			err = e
		}
	}
	return "", "", err
}

const (
	setupInstances = 8
	setupGroup     = `  inference:
    users: [root]
    memory: 20G
`
	setupPinned = "20480M" // the group's memory, as mpsd sends it
)

func mpsSetup(b *testing.B, realControl string) {
	emu := emutest.BinDir(b)
	control := filepath.Join(emu, emutest.ControlName)
	emuDir := "" // simulate.emulator_dir for mpsd: the emulator's own
	if realControl != "" {
		// mpsd runs NVIDIA's control daemon where it would run the
		// emulator's: a directory with it under its name, next to the
		// emulator's server and client.
		emuDir = b.TempDir()
		links := map[string]string{
			emutest.ControlName: realControl,
			emutest.ServerName:  filepath.Join(emu, emutest.ServerName),
			emutest.ClientName:  filepath.Join(emu, emutest.ClientName),
		}
		for name, target := range links {
			if err := os.Symlink(target, filepath.Join(emuDir, name)); err != nil {
				b.Fatal(err)
			}
		}
		control = realControl
	}
	var uuids []string
	var mpsdT, shellT, newT []time.Duration
	mpsdRound := func() {
		e := newEnvGPUs(b, setupInstances, setupGroup, "")
		if emuDir != "" {
			e.emu = emuDir
			e.writeConfig(setupGroup, "")
		}
		e.opts.Logger = slog.New(slog.NewTextHandler(e.log, nil))
		newTook, took := e.startTimed()
		st := e.d.Status()
		if len(st.Instances) != setupInstances {
			b.Fatalf("%d instances, want %d", len(st.Instances), setupInstances)
		}
		uuids = uuids[:0]
		for _, in := range st.Instances {
			if in.State != api.InstanceReady {
				b.Fatalf("instance on GPU %d: %s after Ready", in.GPUIndex, in.State)
			}
			uuids = append(uuids, in.GPUUUID)
		}
		e.cleanup()
		mpsdT, newT = append(mpsdT, took), append(newT, newTook)
	}
	first := true
	for b.Loop() {
		if len(mpsdT)%2 == 0 {
			mpsdRound()
			shellT = append(shellT, shellSetup(b, control, emu, uuids, first))
		} else {
			shellT = append(shellT, shellSetup(b, control, emu, uuids, first))
			mpsdRound()
		}
		first = false
	}
	reportPcts(b, "mpsd", mpsdT)
	reportPcts(b, "shell", shellT)
	reportPcts(b, "new", newT)
	b.ReportMetric(pctMS(shellT, 50)/pctMS(mpsdT, 50), "speedup-x")
	b.ReportMetric(setupInstances, "instances")
}

// startTimed is start, returning how long New took and how long Run took
// from its start to Options.Ready.
func (e *testEnv) startTimed() (newTook, runTook time.Duration) {
	e.t.Helper()
	ready := make(chan time.Time, 1)
	opts := e.opts
	opts.Ready = func() { ready <- time.Now() }
	t0 := time.Now()
	d, err := New(opts)
	if err != nil {
		e.t.Fatalf("mpsd.New: %v", err)
	}
	newTook = time.Since(t0)
	ctx, cancel := context.WithCancel(context.Background())
	e.d, e.cancel, e.done = d, cancel, make(chan error, 1)
	t0 = time.Now()
	go func() { e.done <- d.Run(ctx) }()
	select {
	case t := <-ready:
		return newTook, t.Sub(t0)
	case err := <-e.done:
		e.cancel = nil
		e.t.Fatalf("mpsd stopped before it was ready: %v", err)
	case <-time.After(waitFor):
		e.t.Fatalf("mpsd not ready after %s", waitFor)
	}
	return 0, 0
}

// shellRecipe is what k8s-device-plugin's MPS control daemon does for
// each of its instances, as a script.
const shellRecipe = `set -e
i=0
for uuid in $UUIDS; do
	export CUDA_MPS_PIPE_DIRECTORY="$BASE/$i/pipe" CUDA_MPS_LOG_DIRECTORY="$BASE/$i/log" CUDA_VISIBLE_DEVICES="$uuid"
	mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
	"$CONTROL" -d
	echo set_default_active_thread_percentage 100 | "$CONTROL"
	echo set_default_device_pinned_mem_limit 0 "$PINNED" | "$CONTROL"
	i=$((i+1))
done
`

// shellSetup runs shellRecipe for one instance per uuid against control
// and returns how long it took; then (untimed) it checks the settings
// took when check is set, and quits every daemon it started.
func shellSetup(b *testing.B, control, emu string, uuids []string, check bool) time.Duration {
	base, err := testrun.MkdirTemp("", "mpstk") // short: the daemons' sockets live here
	if err != nil {
		b.Fatal(err)
	}
	pipes := make([]string, len(uuids))
	for i := range uuids {
		pipes[i] = filepath.Join(base, strconv.Itoa(i), "pipe")
	}
	done := false
	cleanup := func() {
		if done {
			return
		}
		done = true
		// quit each daemon as an operator would, then make sure.
		for i, p := range pipes {
			_, _ = benchControl(control, emu, base, i, "quit")
			deadline := time.Now().Add(5 * time.Second)
			for pipeDirLive(p) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			emutest.KillByPipeDir(p)
		}
		_ = os.RemoveAll(base)
	}
	b.Cleanup(cleanup)
	defer cleanup()

	out, err := os.Create(filepath.Join(base, "recipe.out"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = out.Close() }()
	cmd := exec.Command("/bin/sh", "-c", shellRecipe)
	cmd.Env = append(os.Environ(), "BASE="+base, "CONTROL="+control, "UUIDS="+strings.Join(uuids, " "),
		"PINNED="+setupPinned, "PATH="+emu+":"+os.Getenv("PATH"))
	// A file, not a pipe: the daemons inherit the script's output and
	// outlive it.
	cmd.Stdout, cmd.Stderr = out, out
	t0 := time.Now()
	err = cmd.Run()
	took := time.Since(t0)
	if err != nil {
		log, _ := os.ReadFile(out.Name())
		b.Fatalf("shell recipe: %v\n%s", err, log)
	}
	if check {
		for i := range uuids {
			for cmd, want := range map[string]string{"get_default_active_thread_percentage": "100.0", "get_default_device_pinned_mem_limit 0": "20G"} {
				if got, err := benchControl(control, emu, base, i, cmd); err != nil || got != want {
					b.Fatalf("shell recipe instance %d: %s: %q, %v; want %q", i, cmd, got, err, want)
				}
			}
		}
	}
	return took
}

// benchControl runs `echo line | nvidia-cuda-mps-control` against
// instance i of a shell recipe.
func benchControl(control, emu, base string, i int, line string) (string, error) {
	cmd := exec.Command(control)
	cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(base, strconv.Itoa(i), "pipe"),
		"CUDA_MPS_LOG_DIRECTORY="+filepath.Join(base, strconv.Itoa(i), "log"), "PATH="+emu+":"+os.Getenv("PATH"))
	cmd.Stdin = strings.NewReader(line + "\n")
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// pipeDirLive tells whether a process with CUDA_MPS_PIPE_DIRECTORY=pipe
// (a daemon of that pipe directory) is still there.
func pipeDirLive(pipe string) bool {
	needle := []byte("CUDA_MPS_PIPE_DIRECTORY=" + pipe + "\x00")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && bytes.Contains(env, needle) && emutest.Alive(pid) {
			return true
		}
	}
	return false
}

// BenchmarkFootprint: mpsd's resident memory and idle CPU, as a process
// of its own (bin/mpsd --simulate), with 8 simulated GPUs × 8 groups (64
// instances, each an emulated control daemon) and 1,000 leases held by
// open streams (125 per group). Idle CPU is utime+stime from
// /proc/<pid>/stat over a 10 s window in which nothing is asked of mpsd
// (its watchdog probes every instance every 2 s, the default), as a
// percentage of one core; the clock tick is 10 ms, so the resolution is
// 0.1%. Measured first with no lease (baseline), then with the 1,000.
// RSS is taken right after the last grant and again at the end of the
// idle window. It also reports the inotify instances mpsd holds against
// the host's per-user limit (fs.inotify.max_user_instances, often 128),
// which one instance per followed log exceeded at 64 instances.
//
//	go test -run '^$' -bench Footprint -benchtime 1x ./mpsd
func BenchmarkFootprint(b *testing.B) {
	var groups strings.Builder
	for g := range footprintGroups {
		fmt.Fprintf(&groups, "  g%d:\n    users: [root]\n    memory: 4G\n", g)
	}
	e := newEnvGPUs(b, 8, groups.String(), benchLimits)
	for b.Loop() {
		footprint(b, e, 1000, 10*time.Second)
	}
}

const footprintGroups = 8

// inotifyLimit reads the per-user limit on inotify instances.
func inotifyLimit(b *testing.B) int {
	raw, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// countInotify counts pid's inotify instances.
func countInotify(pid int) int {
	fds, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/fd/*")
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

func footprint(b *testing.B, e *testEnv, n int, window time.Duration) {
	cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", e.cfgPath, "--simulate", "--log-level", "warn")
	cmd.Stderr = e.log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	c := leaseClient(e.socket)
	defer c.CloseIdleConnections()
	// Serving, and every instance up.
	deadline := time.Now().Add(waitFor)
	for {
		st, err := benchStatus(c)
		if err == nil && len(st.Instances) == 8*footprintGroups && !slices.ContainsFunc(st.Instances, func(in api.InstanceStatus) bool { return in.State != api.InstanceReady }) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("mpsd not ready with %d instances: %+v, %v", 8*footprintGroups, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // start-up work done
	b.ReportMetric(float64(countInotify(pid)), "inotify-instances")
	b.ReportMetric(float64(inotifyLimit(b)), "inotify-limit")
	b.ReportMetric(idleCPU(b, pid, window), "idle-cpu-%-0leases")
	b.ReportMetric(float64(vmRSS(b, pid))/(1<<20), "MiB-rss-0leases")

	var held []interface{ Close() error }
	defer func() {
		for _, h := range held {
			_ = h.Close()
		}
	}()
	queued := 0
	for i := range n {
		h, q, err := grantQueued(c, fmt.Sprintf(`{"sm":1,"mem_bytes":67108864,"group":"g%d"}`, i%footprintGroups))
		if err != nil {
			b.Fatalf("lease %d: %v", i, err)
		}
		if q {
			queued++
		}
		held = append(held, h)
	}
	b.ReportMetric(float64(vmRSS(b, pid))/(1<<20), "MiB-rss-granted")
	b.ReportMetric(float64(len(held)), "leases")
	b.ReportMetric(float64(queued), "queued")
	b.ReportMetric(8*footprintGroups, "instances")
	time.Sleep(time.Second)
	b.ReportMetric(idleCPU(b, pid, window), "idle-cpu-%")
	b.ReportMetric(float64(vmRSS(b, pid))/(1<<20), "MiB-rss")
}

func benchStatus(c *http.Client) (api.Status, error) {
	var st api.Status
	resp, err := c.Get("http://mpsd" + api.PathStatus)
	if err != nil {
		return st, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// idleCPU is the CPU time pid used over window, in percent of one core.
func idleCPU(b *testing.B, pid int, window time.Duration) float64 {
	t0, c0 := time.Now(), cpuTicks(b, pid)
	time.Sleep(window)
	t1, c1 := time.Now(), cpuTicks(b, pid)
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return 100 * float64(time.Duration(c1-c0)*tick) / float64(t1.Sub(t0))
}

// cpuTicks is utime+stime of pid, in clock ticks.
func cpuTicks(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command, which ends with the last ')': state is
	// field 3, utime 14, stime 15.
	i := strings.LastIndexByte(string(raw), ')')
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return ut + st
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

// BenchmarkFailover: an MPS server with N clients (each under mps-launch)
// is SIGKILLed, once per iteration; the time until mpsd has seen it
// (detect) and until every client runs again as a fresh process under a
// requeued lease (failover).
//
//	go test -run '^$' -bench Failover -benchtime 50x ./mpsd
func BenchmarkFailover(b *testing.B) {
	for _, n := range []int{1, 8, 48} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { failover(b, n) })
	}
}

func failover(b *testing.B, n int) {
	e := newEnv(b, `  a:
    users: [root]
    memory: 40G
    gpus: ["0"]
    requeue_attempts: 100000
`, `watchdog:
  backoff_initial: 1ms
  backoff_max: 10ms
  quarantine_after: 100000`)
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
	run := 0
	for b.Loop() {
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
		// of the new server, and mpsd has checked the new server's caps
		// (caps.go: one or two runs of the control program after a
		// server starts): a crash is detected on a settled instance.
		// A kill in that moment competes for the CPU with those
		// commands and the rest of a bring-up's work: detection at 8
		// clients measured 0.2-0.5 ms more then.
		st = e.waitStatus("every client connected again, the new server's caps checked", func(st api.Status) bool {
			if e.mpsClients(st.Instances[0]) != n || len(st.Instances[0].ServerPIDs) == 0 {
				return false
			}
			e.d.mu.Lock()
			in := e.d.instances["a/0"]
			e.d.mu.Unlock()
			_, checked := in.mps.capsOf(st.Instances[0].ServerPIDs[0])
			return checked
		})
		run++
	}
	reportPcts(b, "failover", fail)
	reportPcts(b, "detect", detect)
}

func isClient(pid int) bool {
	comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(comm)) == "mpsemu-client"
}

// BenchmarkScrape: one /metrics scrape of a daemon with 64 instances and
// 1,000 leases (the daemon's state is built in memory; no MPS runs),
// against the same daemon with no lease (baseline). Reports the median
// and p99 scrape time and, with -benchmem, what a scrape allocates.
//
//	go test -run '^$' -bench Scrape -benchtime 300x -benchmem ./mpsd
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{1000, 0} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) { benchScrape(b, n) })
	}
}

func benchScrape(b *testing.B, leases int) {
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
	for i := range leases {
		in := insts[i%len(insts)]
		l := &lease{id: fmt.Sprintf("inference-%012d", i), group: "inference", req: policyRequest(1, 64<<20), inst: in, box: newMailbox(nil), state: leaseRunning}
		in.p.Assign(&l.req)
		in.leases[l.id] = l
		d.leases[l.id] = l
	}
	for _, in := range insts {
		if _, err := in.step(instEvUp, "benchmark"); err != nil {
			b.Fatal(err)
		}
	}
	d.mu.Unlock()
	h := d.metricsHandler() // what mpsd serves
	req := httptest.NewRequest("GET", "/metrics", nil)
	w := &discardResponse{header: http.Header{}}
	took := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	for b.Loop() {
		clear(w.header)
		w.code, w.n = 0, 0
		t0 := time.Now()
		h.ServeHTTP(w, req)
		took = append(took, time.Since(t0))
		if w.code != 200 || w.n == 0 {
			b.Fatalf("scrape: %d, %d bytes", w.code, w.n)
		}
	}
	reportPcts(b, "scrape", took)
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

// BenchmarkStateChurn: another group's grants while one tenant churns the
// state file (docs/security.md rule 21), as the attack that found it did.
// Group a (GPU 0) has one lease that takes its room. The attack queues 62
// requests in it whose command is 16 KiB of '<' (six bytes each in JSON)
// and holds them, then a loop makes requests there one after the other
// and closes each once mpsd has queued it. Group b (GPU 1) takes leases:
// each iteration measures, quiet (no attack) and then under the attack,
// `mps-launch --group b --sm 10 --mem 1G -- /bin/true` and a lease round
// trip of an API client (request → granted event, then release); the
// attack ends (its requests closed, mpsd holding only the lease that
// takes the room) before the next iteration. Reports each figure's
// median and p99 quiet and under attack, the slowdowns (under attack ÷
// quiet, of the medians), the loop's pace while it ran, and the bytes a
// second the attack (queueing, loop, end) made mpsd write into state_dir
// (from the files, stateMeter).
//
//	go test -run '^$' -bench StateChurn -benchtime 20x ./mpsd
func BenchmarkStateChurn(b *testing.B) {
	const queued = 62
	e := newEnvGPUs(b, 2, `  a:
    users: [root]
    memory: 20G
    gpus: ["0"]
  b:
    users: [root]
    memory: 20G
    gpus: ["1"]
`, benchLimits)
	e.opts.Logger = slog.New(slog.NewTextHandler(e.log, nil))
	m := &stateMeter{path: filepath.Join(e.dir, "state", "state.json")}
	e.opts.writeHook = m.before
	e.start()
	c := leaseClient(e.socket)
	defer c.CloseIdleConnections()

	long := churnBody(b, api.LeaseRequest{Group: "a", SM: 100, MemBytes: 1 << 30,
		Command: []string{"/bin/true", strings.Repeat("<", api.MaxCommandBytes-len("/bin/true"))}})
	holder, _, _, err := grantLease(c, churnBody(b, api.LeaseRequest{Group: "a", SM: 100, MemBytes: 1 << 30}))
	if err != nil {
		b.Fatalf("group a's room: %v", err)
	}
	defer func() { _ = holder.Close() }()

	launch := filepath.Join(e.bin, "mps-launch")
	env := append(os.Environ(), api.EnvSocket+"="+e.socket)
	launchOnce := func() time.Duration {
		cmd := exec.Command(launch, "--group", "b", "--sm", "10", "--mem", "1G", "--", "/bin/true")
		cmd.Env = env
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("mps-launch: %v\n%s", err, out)
		}
		return time.Since(t0)
	}
	grantBody := churnBody(b, api.LeaseRequest{Group: "b", SM: 10, MemBytes: 1 << 30})
	grantOnce := func() time.Duration {
		t0 := time.Now()
		h, _, _, err := grantLease(c, grantBody)
		took := time.Since(t0)
		if err != nil {
			b.Fatalf("group b's lease: %v", err)
		}
		_ = h.Close()
		return took
	}
	// attack queues and holds the requests, then runs the loop (one
	// request at a time, as one loop of the tenant's does) until stop,
	// which ends it all, waits until mpsd holds only the lease that takes
	// the room, and says how many requests the loop made in how long. It
	// returns once the loop has made a few requests.
	attack := func() (stop func() (int, time.Duration)) {
		held := make([]io.Closer, 0, queued)
		for i := range queued {
			h, err := churnQueue(c, long)
			if err != nil {
				b.Fatalf("queued request %d: %v", i, err)
			}
			held = append(held, h)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var cycles atomic.Int64
		started := make(chan struct{})
		done := make(chan struct{})
		began := time.Now()
		go func() {
			defer close(done)
			for ctx.Err() == nil {
				h, err := churnQueue(c, long)
				if err != nil {
					if ctx.Err() == nil {
						b.Errorf("churn: %v", err)
					}
					return
				}
				_ = h.Close()
				if cycles.Add(1) == 5 {
					close(started)
				}
			}
		}()
		select {
		case <-started:
		case <-done:
		}
		return func() (int, time.Duration) {
			cancel()
			<-done
			ran := time.Since(began)
			for _, h := range held {
				_ = h.Close()
			}
			deadline := time.Now().Add(waitFor)
			for liveLeases(e.d) > 1 {
				if time.Now().After(deadline) {
					b.Fatalf("%d leases still held %s after the attack ended", liveLeases(e.d), waitFor)
				}
				time.Sleep(time.Millisecond)
			}
			return int(cycles.Load()), ran
		}
	}

	var grantQuiet, grantAttack, launchQuiet, launchAttack []time.Duration
	var churned int
	var churnTime, attackTime time.Duration
	var attackBytes int64
	for b.Loop() {
		launchQuiet = append(launchQuiet, launchOnce())
		grantQuiet = append(grantQuiet, grantOnce())
		_, b0 := m.read()
		t0 := time.Now()
		stop := attack()
		launchAttack = append(launchAttack, launchOnce())
		grantAttack = append(grantAttack, grantOnce())
		n, ran := stop()
		churned, churnTime = churned+n, churnTime+ran
		_, b1 := m.read()
		attackTime += time.Since(t0)
		attackBytes += b1 - b0
	}
	reportPcts(b, "launch-quiet", launchQuiet)
	reportPcts(b, "launch-attack", launchAttack)
	reportPcts(b, "grant-quiet", grantQuiet)
	reportPcts(b, "grant-attack", grantAttack)
	b.ReportMetric(pctMS(launchAttack, 50)/pctMS(launchQuiet, 50), "launch-slowdown-x")
	b.ReportMetric(pctMS(grantAttack, 50)/pctMS(grantQuiet, 50), "grant-slowdown-x")
	b.ReportMetric(float64(churned)/churnTime.Seconds(), "churn-req/s")
	b.ReportMetric(float64(attackBytes)/attackTime.Seconds()/1e6, "state-MB/s")
}

// churnBody is req as the churning tenant sends it: '<' as itself (the
// request's bound is on its bytes).
func churnBody(b *testing.B, req api.LeaseRequest) string {
	body, err := leasetest.Body(req)
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// churnQueue posts a lease request and reads its stream up to its queued
// event; the request stays queued until the returned body is closed.
func churnQueue(c *http.Client, body string) (io.Closer, error) {
	h, _, err := leasetest.Ask(c, body, api.EventQueued)
	return h, err
}
