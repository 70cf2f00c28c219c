// Command report turns the output of mpsd's benchmarks (`go test -bench`,
// as `make bench` runs them) into bench/REPORT.md and bench/report.json:
// one table per area (launch overhead, MPS setup, failover, admission,
// footprint, scrape) with each figure's median and p99, the baseline
// measured in the same run, their ratio, the target and whether it is
// met. A target that is missed, or a figure that was not measured
// (benchmark skipped, failed or absent), is said so, in the table and in
// the summary at the top. The report also states the machine (cores,
// memory, kernel, Go, load) and the command that reproduces each figure.
//
// Usage:
//
//	make bench
//	report [-md bench/REPORT.md] [-json bench/report.json] [-tee] < bench-output
//
// The input is what `go test -bench` prints, for one or more runs in a
// row; a line "bench-command: CMD" before a run names the command that
// produced it (make bench writes one before each), and a line
// "bench-note: TEXT" adds TEXT to the report's notes (say, that a run was
// put together from two, or what else used the machine). With -tee the input is
// copied to stdout as it is read. The exit status is 1 when the input
// holds a failed benchmark or a missing figure, after both files are
// written.
//
// The metric names read here are those mpsd/bench_test.go reports.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	mdPath := flag.String("md", "bench/REPORT.md", "Markdown report to write")
	jsonPath := flag.String("json", "bench/report.json", "JSON report to write")
	tee := flag.Bool("tee", false, "copy the input to stdout as it is read")
	flag.Parse()

	m := readMachine()
	var in io.Reader = os.Stdin
	if *tee {
		in = io.TeeReader(os.Stdin, os.Stdout)
	}
	run, err := parse(in)
	if err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(2)
	}
	m.LoadEnd = loadAvg()
	m.GOMAXPROCS = run.procs
	m.CPUName = run.cpu
	rep := build(run, m, time.Now())
	if err := os.WriteFile(*mdPath, []byte(markdown(rep)), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(2)
	}
	js, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(*jsonPath, append(js, '\n'), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(2)
	}
	fmt.Fprintf(os.Stderr, "report: %s and %s written: %d targets met, %d missed, %d not measured\n",
		*mdPath, *jsonPath, len(rep.Summary.Met), len(rep.Summary.Missed), len(rep.Summary.NotMeasured))
	for _, s := range rep.Summary.Missed {
		fmt.Fprintf(os.Stderr, "report: MISSED: %s\n", s)
	}
	for _, s := range rep.Summary.NotMeasured {
		fmt.Fprintf(os.Stderr, "report: NOT MEASURED: %s\n", s)
	}
	if len(run.failed) > 0 || len(rep.Summary.NotMeasured) > 0 {
		os.Exit(1)
	}
}

// Machine is what the report says of the machine it ran on.
type Machine struct {
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpu_model"`
	CPUName     string `json:"cpu_go_test,omitempty"` // go test's "cpu:" line
	GOMAXPROCS  int    `json:"gomaxprocs,omitempty"`
	MemoryBytes int64  `json:"memory_bytes"`
	Kernel      string `json:"kernel"`
	Go          string `json:"go"`
	OS          string `json:"os"`
	LoadStart   string `json:"loadavg_start"`
	LoadEnd     string `json:"loadavg_end"`
}

func readMachine() Machine {
	m := Machine{Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadStart: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "processor":
				m.CPUs++
			case "model name":
				if m.CPUModel == "" {
					m.CPUModel = strings.TrimSpace(v)
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				m.MemoryBytes = kb << 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// result is one benchmark's line.
type result struct {
	Name       string             `json:"name"`
	Iterations int64              `json:"iterations"`
	Metrics    map[string]float64 `json:"metrics"`
	Command    string             `json:"command"`
}

// event is a skipped or failed benchmark, or one that logged, with what
// it said.
type event struct {
	Name    string   `json:"name"`
	Command string   `json:"command"`
	Lines   []string `json:"lines,omitempty"`
}

type parsed struct {
	results []result
	skipped []event
	failed  []event
	logs    []event
	raw     []string // the benchmark lines as printed
	notes   []string // the input's bench-note lines
	procs   int
	cpu     string
}

// procSuffix is the -GOMAXPROCS suffix go test appends to a benchmark's
// name (the benchmarks take care that no name of theirs ends so).
var procSuffix = regexp.MustCompile(`-(\d+)$`)

func parse(r io.Reader) (*parsed, error) {
	p := &parsed{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	command := ""
	var cur *event // the event indented lines belong to
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "    ") && cur != nil {
			if len(cur.Lines) < 40 {
				cur.Lines = append(cur.Lines, strings.TrimSpace(line))
			}
			continue
		}
		cur = nil
		switch {
		case strings.HasPrefix(line, "bench-command: "):
			command = strings.TrimPrefix(line, "bench-command: ")
		case strings.HasPrefix(line, "bench-note: "):
			p.notes = append(p.notes, strings.TrimSpace(strings.TrimPrefix(line, "bench-note: ")))
		case strings.HasPrefix(line, "cpu: "):
			p.cpu = strings.TrimPrefix(line, "cpu: ")
		case strings.HasPrefix(line, "--- SKIP: "), strings.HasPrefix(line, "--- FAIL: "), strings.HasPrefix(line, "--- BENCH: "):
			kind, rest, _ := strings.Cut(strings.TrimPrefix(line, "--- "), ": ")
			name, _, _ := strings.Cut(rest, " ")
			name = procSuffix.ReplaceAllString(name, "")
			e := event{Name: name, Command: command}
			switch kind {
			case "SKIP":
				p.skipped = append(p.skipped, e)
				cur = &p.skipped[len(p.skipped)-1]
			case "FAIL":
				p.failed = append(p.failed, e)
				cur = &p.failed[len(p.failed)-1]
			default:
				p.logs = append(p.logs, e)
				cur = &p.logs[len(p.logs)-1]
			}
		case strings.HasPrefix(line, "Benchmark"):
			f := strings.Fields(line)
			if len(f) < 2 {
				continue // a benchmark that printed before failing
			}
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || len(f)%2 != 0 {
				continue
			}
			res := result{Name: f[0], Iterations: n, Metrics: map[string]float64{}, Command: command}
			if m := procSuffix.FindStringSubmatch(res.Name); m != nil {
				p.procs, _ = strconv.Atoi(m[1])
				res.Name = strings.TrimSuffix(res.Name, m[0])
			}
			for i := 2; i+1 < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					return nil, fmt.Errorf("benchmark line %q: value %q: %w", line, f[i], err)
				}
				res.Metrics[f[i+1]] = v
			}
			p.results = append(p.results, res)
			p.raw = append(p.raw, line)
		}
	}
	return p, sc.Err()
}

// Report is what both files hold.
type Report struct {
	Generated  string   `json:"generated"`
	Machine    Machine  `json:"machine"`
	Reproduce  string   `json:"reproduce"`
	Summary    Summary  `json:"summary"`
	Areas      []Area   `json:"areas"`
	Benchmarks []result `json:"benchmarks"`
	Skipped    []event  `json:"skipped,omitempty"`
	Failed     []event  `json:"failed,omitempty"`
	Logs       []event  `json:"logs,omitempty"`
	Notes      []string `json:"notes"`
	raw        []string // benchmark lines, for the Markdown appendix
}

// Summary lists the targets by outcome, one line each.
type Summary struct {
	Met         []string `json:"met"`
	Missed      []string `json:"missed"`
	NotMeasured []string `json:"not_measured"`
}

// Area is one table.
type Area struct {
	Name  string `json:"name"`
	About string `json:"about"`
	Rows  []Row  `json:"rows"`
}

// Row is one figure. Values are in Unit; a throughput or a single
// measurement has only Median (its value).
type Row struct {
	Figure   string    `json:"figure"`
	Unit     string    `json:"unit"`
	Median   *float64  `json:"median"`
	P99      *float64  `json:"p99,omitempty"`
	Baseline *Baseline `json:"baseline,omitempty"`
	// Ratio is figure ÷ baseline (medians), or as RatioIs says.
	Ratio   *float64 `json:"ratio,omitempty"`
	RatioIs string   `json:"ratio_is,omitempty"`
	Target  string   `json:"target,omitempty"`
	// Status: "met", "not met", "no target" or "not measured".
	Status  string `json:"status"`
	Note    string `json:"note,omitempty"`
	Command string `json:"command,omitempty"`
	// Benchmark is the benchmark (and sub-benchmark) the figure comes from.
	Benchmark string `json:"benchmark"`
}

// Baseline is what a figure is compared with, measured in the same run.
type Baseline struct {
	What   string   `json:"what"`
	Median *float64 `json:"median"`
	P99    *float64 `json:"p99,omitempty"`
}

const (
	statusMet         = "met"
	statusMissed      = "not met"
	statusNoTarget    = "no target"
	statusNotMeasured = "not measured"
)

// target is a bound on one value of a row.
type target struct {
	text string
	ok   func(median, p99, ratio *float64) *bool // nil: the values it needs are missing
}

func atMost(limit float64, onP99 bool, text string) *target {
	return &target{text: text, ok: func(median, p99, _ *float64) *bool {
		v := median
		if onP99 {
			v = p99
		}
		if v == nil {
			return nil
		}
		r := *v <= limit
		return &r
	}}
}

func atLeast(limit float64, text string) *target {
	return &target{text: text, ok: func(median, _, _ *float64) *bool {
		if median == nil {
			return nil
		}
		r := *median >= limit
		return &r
	}}
}

func ratioAtLeast(limit float64, text string) *target {
	return &target{text: text, ok: func(_, _, ratio *float64) *bool {
		if ratio == nil {
			return nil
		}
		r := *ratio >= limit
		return &r
	}}
}

// builder assembles areas from the parsed run.
type builder struct {
	run  *parsed
	used map[string]bool
}

func (b *builder) find(name string) (*result, string) {
	for i := range b.run.results {
		if b.run.results[i].Name == name {
			b.used[name] = true
			return &b.run.results[i], ""
		}
	}
	for _, e := range append(slices.Clone(b.run.failed), b.run.skipped...) {
		if e.Name == name || strings.HasPrefix(name, e.Name+"/") {
			why := "failed"
			if slices.ContainsFunc(b.run.skipped, func(s event) bool { return s.Name == e.Name }) {
				why = "skipped"
			}
			if len(e.Lines) > 0 {
				why += ": " + e.Lines[0]
			}
			return nil, why
		}
	}
	return nil, "not in the benchmark output"
}

func val(r *result, metric string) *float64 {
	if r == nil {
		return nil
	}
	v, ok := r.Metrics[metric]
	if !ok || math.IsNaN(v) {
		return nil
	}
	return &v
}

func div(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	r := *a / *b
	return &r
}

// spec describes one row in terms of a benchmark's metrics.
type spec struct {
	figure, unit, bench string
	median, p99         string // metric names
	baseWhat            string
	baseMedian, baseP99 string
	ratio               string // a metric that is the ratio itself; else median ÷ baseline median
	ratioIs             string
	target              *target
	note                string
	noteFrom            func(r *result) string
}

func (b *builder) row(s spec) Row {
	r, why := b.find(s.bench)
	row := Row{Figure: s.figure, Unit: s.unit, Benchmark: s.bench, Note: s.note, RatioIs: s.ratioIs}
	if r != nil {
		row.Command = r.Command
		row.Median = val(r, s.median)
		if s.p99 != "" {
			row.P99 = val(r, s.p99)
		}
		if s.baseWhat != "" {
			row.Baseline = &Baseline{What: s.baseWhat, Median: val(r, s.baseMedian)}
			if s.baseP99 != "" {
				row.Baseline.P99 = val(r, s.baseP99)
			}
		}
		switch {
		case s.ratio != "":
			row.Ratio = val(r, s.ratio)
		case row.Baseline != nil:
			row.Ratio = div(row.Median, row.Baseline.Median)
			if row.RatioIs == "" {
				row.RatioIs = "figure ÷ baseline (medians)"
			}
		}
		if s.noteFrom != nil {
			if n := s.noteFrom(r); n != "" {
				if row.Note != "" {
					row.Note += " "
				}
				row.Note += n
			}
		}
	} else {
		row.Note = strings.TrimSpace("not measured: " + why + ". " + row.Note)
	}
	if s.target != nil {
		row.Target = s.target.text
	}
	switch {
	case r == nil || row.Median == nil:
		row.Status = statusNotMeasured
		if r != nil {
			row.Note = strings.TrimSpace("not measured: metric " + s.median + " missing. " + row.Note)
		}
	case s.target == nil:
		row.Status = statusNoTarget
	default:
		ok := s.target.ok(row.Median, row.P99, row.Ratio)
		switch {
		case ok == nil:
			row.Status = statusNotMeasured
		case *ok:
			row.Status = statusMet
		default:
			row.Status = statusMissed
		}
	}
	if r == nil && s.target == nil {
		// A figure without a target that is missing is still said.
		row.Status = statusNotMeasured
	}
	return row
}

// fortyMB is the footprint target's 40 MB in MiB, read strictly as
// 40·10^6 bytes.
const fortyMB = 40e6 / (1 << 20)

func build(run *parsed, m Machine, now time.Time) Report {
	b := &builder{run: run, used: map[string]bool{}}
	rep := Report{
		Generated: now.UTC().Format(time.RFC3339),
		Machine:   m,
		Reproduce: "make bench (each table names the go test command behind its figures)",
		Skipped:   run.skipped,
		Failed:    run.failed,
		Logs:      run.logs,
		raw:       run.raw,
	}

	// Launch overhead.
	launch := "BenchmarkLaunchOverhead"
	rep.Areas = append(rep.Areas, Area{
		Name: "Launch overhead",
		About: "Exec to exit of `mps-launch --sm 10 --mem 1G -- /bin/true` against `/bin/true`, alternating, against an in-process mpsd on 2 simulated GPUs. " +
			"The pieces below are measured after the pairs, in as many rounds, each round ending once mpsd has released every lease: they are parts of the added time, not all of it " +
			"(the rest is the trampoline's start and release and the launcher's wait for the command). " +
			"The attach is measured as a launch after a quiet spell meets it: the move into the cgroup then waits for an RCU grace period, " +
			"which a move right after another (as in the back-to-back pairs) does not",
		Rows: []Row{
			b.row(spec{figure: "mps-launch --sm 10 --mem 1G -- /bin/true", unit: "ms", bench: launch,
				median: "mps-launch-p50-ms", p99: "mps-launch-p99-ms",
				baseWhat: "/bin/true", baseMedian: "true-p50-ms", baseP99: "true-p99-ms"}),
			b.row(spec{figure: "time added by mps-launch (launched − direct, pair by pair)", unit: "ms", bench: launch,
				median: "added-p50-ms", p99: "added-p99-ms",
				target: atMost(3, false, "≤ 3 ms added (median)")}),
			b.row(spec{figure: "start-up and exit of mps-launch alone (mps-launch --help − /bin/true, pair by pair)", unit: "ms", bench: launch,
				median: "startup-p50-ms", p99: "startup-p99-ms"}),
			b.row(spec{figure: "lease round trip (request → granted event, an API client on a connection of its own)", unit: "ms", bench: launch,
				median: "grant-p50-ms", p99: "grant-p99-ms"}),
			b.row(spec{figure: "attach round trip (a waiting child moved into the lease cgroup), after mpsd released the last lease", unit: "ms", bench: launch,
				median: "attach-p50-ms", p99: "attach-p99-ms"}),
			b.row(spec{figure: "release round trip (the command has ended → mpsd's answer: the lease gone, its cgroup removed)", unit: "ms", bench: launch,
				median: "release-p50-ms", p99: "release-p99-ms"}),
		},
	})

	// MPS setup.
	setup := Area{
		Name: "MPS setup",
		About: "mpsd bringing up 8 instances (8 simulated GPUs, one group), from the start of Run to Ready, against a shell script doing what " +
			"NVIDIA's k8s-device-plugin does per instance, one after the other (`nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY, " +
			"CUDA_MPS_LOG_DIRECTORY and CUDA_VISIBLE_DEVICES, then `echo set_default_active_thread_percentage 100 | nvidia-cuda-mps-control` " +
			"and `echo set_default_device_pinned_mem_limit 0 20480M | nvidia-cuda-mps-control`), both against the same control daemon",
	}
	setupSubs := subsOf(run, "BenchmarkMPSSetup/")
	if !slices.ContainsFunc(setupSubs, func(s string) bool { return s == "BenchmarkMPSSetup/control=emulator" }) {
		setupSubs = append([]string{"BenchmarkMPSSetup/control=emulator"}, setupSubs...)
	}
	if !slices.ContainsFunc(setupSubs, func(s string) bool { return strings.HasPrefix(s, "BenchmarkMPSSetup/control=nvidia") }) {
		setupSubs = append(setupSubs, "BenchmarkMPSSetup/control=nvidia")
	}
	for _, sub := range setupSubs {
		daemon := "the MPS emulator's control daemon"
		if _, v, ok := strings.Cut(sub, "control=nvidia"); ok {
			daemon = "NVIDIA's nvidia-cuda-mps-control"
			if v = strings.TrimPrefix(v, "-"); v != "" {
				daemon += " " + v
			}
		}
		setup.Rows = append(setup.Rows,
			b.row(spec{figure: "mpsd, 8 instances, " + daemon, unit: "ms", bench: sub,
				median: "mpsd-p50-ms", p99: "mpsd-p99-ms",
				baseWhat: "shell recipe, 8 instances", baseMedian: "shell-p50-ms", baseP99: "shell-p99-ms",
				ratio: "speedup-x", ratioIs: "speedup: shell ÷ mpsd (medians)",
				target: ratioAtLeast(2, "≥ 2× faster than the shell recipe (median)")}),
			b.row(spec{figure: "mpsd New before Run (config, GPU inventory, cgroups), not counted above, " + daemon, unit: "ms", bench: sub,
				median: "new-p50-ms", p99: "new-p99-ms"}),
		)
	}
	rep.Areas = append(rep.Areas, setup)

	// Failover.
	fo := Area{
		Name: "Failover",
		About: "SIGKILL of the MPS server of one instance with N clients (each an emulated CUDA client under mps-launch) until every client runs again " +
			"as a fresh process of a new server under its requeued lease; detection is until mpsd has seen the fault. No baseline: nothing else relaunches " +
			"MPS clients (with k8s-device-plugin the pods' containers fail and kubelet restarts them with its own back-off)",
	}
	for _, n := range []int{1, 8, 48} {
		sub := fmt.Sprintf("BenchmarkFailover/clients=%d", n)
		var t *target
		switch n {
		case 8:
			t = atMost(500, true, "p99 ≤ 500 ms")
		case 48:
			t = atMost(1000, true, "p99 ≤ 1 s")
		}
		fo.Rows = append(fo.Rows,
			b.row(spec{figure: fmt.Sprintf("failover, %d client%s", n, plural(n)), unit: "ms", bench: sub,
				median: "failover-p50-ms", p99: "failover-p99-ms", target: t, noteFrom: samples}),
			b.row(spec{figure: fmt.Sprintf("of which detection, %d client%s", n, plural(n)), unit: "ms", bench: sub,
				median: "detect-p50-ms", p99: "detect-p99-ms"}),
		)
	}
	rep.Areas = append(rep.Areas, fo)

	// Admission.
	ad := Area{
		Name: "Admission",
		About: "N concurrent API clients each take a lease (a stream on a connection of its own, as mps-launch does) and release it, as fast as they can, " +
			"against an in-process mpsd with 48 simulated GPUs × 48 clients (2,304 leases, so capacity is free; queued grants are counted). The rate counts " +
			"until mpsd has released every lease. Clients and mpsd share the machine's cores, so with many clients grant latency is mostly their queueing for the CPU. " +
			"Before the runs every instance takes its first lease, all at once (reported on its own). " +
			"Baseline: the same clients posting the same body to a path mpsd answers 404 (connection, HTTP and routing, without admission)",
	}
	for _, n := range []int{1, 100, 1000} {
		sub := fmt.Sprintf("BenchmarkAdmission/clients=%d", n)
		var rate, lat *target
		rateNote := "The 5,000 /s target is read at 100 clients."
		switch n {
		case 1:
			lat = atMost(5, true, "p99 ≤ 5 ms (capacity free)")
		case 100:
			rate, rateNote = atLeast(5000, "≥ 5,000 /s"), ""
		}
		queued := func(metric string) func(r *result) string {
			return func(r *result) string {
				if q := val(r, metric); q != nil {
					return fmt.Sprintf("%s of %s grants queued.", fmtNum(*q, ""), fmtNum(float64(r.Iterations), ""))
				}
				return ""
			}
		}
		ad.Rows = append(ad.Rows,
			b.row(spec{figure: fmt.Sprintf("grants+releases per second, %d client%s", n, plural(n)), unit: "/s", bench: sub,
				median: "leases/s", baseWhat: "404 round trips per second", baseMedian: "baseline-req/s",
				target: rate, note: rateNote, noteFrom: queued("queued")}),
			b.row(spec{figure: fmt.Sprintf("grant latency (request → granted), flat out, %d client%s", n, plural(n)), unit: "ms", bench: sub,
				median: "grant-p50-ms", p99: "grant-p99-ms",
				baseWhat: "404 round trip", baseMedian: "baseline-p50-ms", baseP99: "baseline-p99-ms", target: lat}),
		)
		if n == 1 {
			ad.Rows = append(ad.Rows, b.row(spec{figure: "first grant on each of 48 new instances, all at once, before the runs", unit: "ms", bench: sub,
				median: "first-grant-p50-ms", p99: "first-grant-p99-ms",
				note: "A new instance's first grant of a uid waits for the MPS command that sets its daemon's defaults to that uid's share; the runs after it do not pay it again."}))
		}
		if n == 100 {
			ad.Rows = append(ad.Rows, b.row(spec{figure: "grant latency at an offered 5,000 grants+releases/s, 100 clients", unit: "ms", bench: sub,
				median: "grant@5k/s-p50-ms", p99: "grant@5k/s-p99-ms",
				target: atMost(5, true, "p99 ≤ 5 ms (capacity free)"), noteFrom: queued("queued@5k/s")}))
		}
	}
	rep.Areas = append(rep.Areas, ad)

	// Footprint.
	fp := "BenchmarkFootprint"
	rep.Areas = append(rep.Areas, Area{
		Name: "Footprint",
		About: "mpsd as a process of its own (bin/mpsd --simulate) with 8 simulated GPUs × 8 groups (64 instances, each an emulated control daemon) and 1,000 leases " +
			"held by open streams. Idle CPU: utime+stime from /proc/<pid>/stat over 10 s with nothing asked of mpsd (its watchdog probes each instance every 2 s, " +
			"the default), in % of one core, resolution 0.1%. Baseline: the same mpsd before the first lease",
		Rows: []Row{
			b.row(spec{figure: "RSS, 1,000 leases held, after 10 s idle", unit: "MiB", bench: fp,
				median: "MiB-rss", baseWhat: "no lease", baseMedian: "MiB-rss-0leases",
				target: atMost(fortyMB, false, "≤ 40 MB (38.1 MiB)")}),
			b.row(spec{figure: "RSS, right after the 1,000th grant", unit: "MiB", bench: fp,
				median: "MiB-rss-granted", baseWhat: "no lease", baseMedian: "MiB-rss-0leases",
				target: atMost(fortyMB, false, "≤ 40 MB (38.1 MiB)")}),
			b.row(spec{figure: "idle CPU, 1,000 leases held", unit: "% of a core", bench: fp,
				median: "idle-cpu-%", baseWhat: "no lease", baseMedian: "idle-cpu-%-0leases",
				target: atMost(0.5, false, "≤ 0.5% of a core")}),
			b.row(spec{figure: "inotify instances mpsd holds (not a target of the issue)", unit: "", bench: fp,
				median: "inotify-instances", baseWhat: "host's fs.inotify.max_user_instances before the run", baseMedian: "inotify-limit",
				ratioIs: "figure ÷ limit", target: inotifyTarget(run),
				note: "Per user: every other process of mpsd's user counts against the same limit, so mpsd should need far fewer than it."}),
		},
	})

	// Scrape.
	rep.Areas = append(rep.Areas, Area{
		Name:  "Scrape",
		About: "One /metrics scrape (promhttp handler, body counted and dropped) of a daemon with 64 instances and 1,000 leases, state built in memory; baseline: the same daemon with no lease",
		Rows: []Row{
			b.row(spec{figure: "scrape time, 64 instances, 1,000 leases", unit: "ms", bench: "BenchmarkScrape/leases=1000",
				median: "scrape-p50-ms", p99: "scrape-p99-ms", target: atMost(10, true, "≤ 10 ms (p99)"),
				noteFrom: func(r *result) string {
					if v := val(r, "bytes/scrape"); v != nil {
						return fmt.Sprintf("%s bytes per scrape.", fmtNum(*v, ""))
					}
					return ""
				}}),
			b.row(spec{figure: "allocated per scrape, 64 instances, 1,000 leases", unit: "B", bench: "BenchmarkScrape/leases=1000",
				median: "B/op", target: atMost(1e6, false, "≤ 1 MB (10^6 B)")}),
		},
	})
	// Baselines of the scrape rows come from the other sub-benchmark.
	if r, _ := b.find("BenchmarkScrape/leases=0"); r != nil {
		sa := &rep.Areas[len(rep.Areas)-1]
		for i, pair := range [][2]string{{"scrape-p50-ms", "scrape-p99-ms"}, {"B/op", ""}} {
			row := &sa.Rows[i]
			row.Baseline = &Baseline{What: "no lease", Median: val(r, pair[0])}
			if pair[1] != "" {
				row.Baseline.P99 = val(r, pair[1])
			}
			if row.Median != nil {
				row.Ratio = div(row.Median, row.Baseline.Median)
				row.RatioIs = "figure ÷ baseline (medians)"
			}
		}
	}

	for _, a := range rep.Areas {
		for _, r := range a.Rows {
			line := a.Name + ": " + r.Figure
			switch r.Status {
			case statusMet:
				rep.Summary.Met = append(rep.Summary.Met, fmt.Sprintf("%s: %s (%s)", line, r.Target, shortValue(r)))
			case statusMissed:
				rep.Summary.Missed = append(rep.Summary.Missed, fmt.Sprintf("%s: %s, measured %s", line, r.Target, shortValue(r)))
			case statusNotMeasured:
				rep.Summary.NotMeasured = append(rep.Summary.NotMeasured, line+": "+r.Note)
			}
		}
	}
	for _, res := range run.results {
		rep.Benchmarks = append(rep.Benchmarks, res)
		if !b.used[res.Name] {
			rep.Notes = append(rep.Notes, "benchmark "+res.Name+" is in the output but in no table; see the raw lines")
		}
	}
	rep.Notes = append(rep.Notes, run.notes...)
	rep.Notes = append(rep.Notes,
		"A figure without a p99 is a single value (a rate over the whole run, or one measurement), shown in the median column.",
		"Percentiles are by nearest rank over the run's samples (with 20 samples the p99 is the largest); the number of samples is each command's -benchtime.",
		"Every figure comes from simulated GPUs: the MPS emulator's (or NVIDIA's GPU-less) control daemon, emulated servers and clients, real processes and cgroups. No GPU work runs.",
		"The benchmarks share the machine with whatever else runs on it; the load averages above say how busy it was.",
	)
	return rep
}

func inotifyTarget(run *parsed) *target {
	limit := 128.0
	for _, r := range run.results {
		if r.Name == "BenchmarkFootprint" {
			if v, ok := r.Metrics["inotify-limit"]; ok {
				limit = v
			}
		}
	}
	return atMost(limit, false, fmt.Sprintf("≤ the host's limit (%s)", fmtNum(limit, "")))
}

func samples(r *result) string {
	return fmt.Sprintf("%d kills.", r.Iterations)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// subsOf lists the sub-benchmarks under prefix that the run printed,
// skipped or failed, in their order.
func subsOf(run *parsed, prefix string) []string {
	var out []string
	add := func(name string) {
		if strings.HasPrefix(name, prefix) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, r := range run.results {
		add(r.Name)
	}
	for _, e := range run.skipped {
		add(e.Name)
	}
	for _, e := range run.failed {
		add(e.Name)
	}
	return out
}

// fmtNum prints v with three significant digits and thousands separators.
func fmtNum(v float64, unit string) string {
	var s string
	switch a := math.Abs(v); {
	case a == 0:
		s = "0"
	case a >= 1000:
		s = thousands(strconv.FormatFloat(math.Round(v), 'f', 0, 64))
	case a >= 100:
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	case a == math.Trunc(a):
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 1:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	default:
		s = strconv.FormatFloat(v, 'f', 3, 64)
	}
	switch unit {
	case "":
		return s
	case "% of a core":
		return s + "%"
	}
	return s + " " + unit
}

func thousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func opt(v *float64, unit string) string {
	if v == nil {
		return "—"
	}
	return fmtNum(*v, unit)
}

func shortValue(r Row) string {
	if r.P99 == nil {
		return opt(r.Median, r.Unit)
	}
	s := "median " + opt(r.Median, r.Unit) + ", p99 " + opt(r.P99, r.Unit)
	if r.Ratio != nil && strings.HasPrefix(r.RatioIs, "speedup") {
		s += ", " + fmtNum(*r.Ratio, "") + "×"
	}
	return s
}

func statusCell(s string) string {
	switch s {
	case statusMet:
		return "✅ met"
	case statusMissed:
		return "❌ **NOT MET**"
	case statusNotMeasured:
		return "⚠️ **not measured**"
	}
	return "—"
}

func markdown(rep Report) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }
	p("# mpsd benchmarks\n\n")
	p("Generated by `make bench` (bench/report from `go test -bench` output) on %s. Do not edit: run `make bench` again.\n\n", rep.Generated)
	m := rep.Machine
	p("## Machine\n\n")
	p("| | |\n|---|---|\n")
	p("| cores | %d (%s) |\n", m.CPUs, m.CPUModel)
	if m.GOMAXPROCS > 0 {
		p("| GOMAXPROCS | %d |\n", m.GOMAXPROCS)
	}
	p("| memory | %.1f GiB |\n", float64(m.MemoryBytes)/(1<<30))
	p("| kernel | %s |\n", m.Kernel)
	p("| Go | %s (%s) |\n", m.Go, m.OS)
	p("| load average (1, 5, 15 min) | %s at the start, %s at the end |\n\n", m.LoadStart, m.LoadEnd)

	p("## Summary\n\n")
	total := len(rep.Summary.Met) + len(rep.Summary.Missed) + len(rep.Summary.NotMeasured)
	p("%d targets: %d met, %d not met, %d not measured.\n\n", total, len(rep.Summary.Met), len(rep.Summary.Missed), len(rep.Summary.NotMeasured))
	if len(rep.Summary.Missed) > 0 {
		p("Not met:\n\n")
		for _, s := range rep.Summary.Missed {
			p("- ❌ %s\n", s)
		}
		p("\n")
	}
	if len(rep.Summary.NotMeasured) > 0 {
		p("Not measured:\n\n")
		for _, s := range rep.Summary.NotMeasured {
			p("- ⚠️ %s\n", s)
		}
		p("\n")
	}
	if len(rep.Summary.Met) > 0 {
		p("Met:\n\n")
		for _, s := range rep.Summary.Met {
			p("- ✅ %s\n", s)
		}
		p("\n")
	}

	for _, a := range rep.Areas {
		p("## %s\n\n%s.\n\n", a.Name, a.About)
		p("| figure | median | p99 | baseline (median / p99) | ratio | target | result |\n")
		p("|---|---:|---:|---|---:|---|---|\n")
		var notes, cmds []string
		for _, r := range a.Rows {
			base := "—"
			if r.Baseline != nil {
				base = r.Baseline.What + ": " + opt(r.Baseline.Median, r.Unit)
				if r.Baseline.P99 != nil {
					base += " / " + opt(r.Baseline.P99, r.Unit)
				}
			}
			ratio := "—"
			if r.Ratio != nil {
				ratio = fmtNum(*r.Ratio, "") + "×"
				if strings.HasPrefix(r.RatioIs, "speedup") {
					ratio += " faster"
				}
			}
			p99 := "—"
			if r.P99 != nil {
				p99 = opt(r.P99, r.Unit)
			}
			target := r.Target
			if target == "" {
				target = "—"
			}
			fig := r.Figure
			if r.Note != "" {
				notes = append(notes, r.Note)
				fig += fmt.Sprintf(" [%d]", len(notes))
			}
			p("| %s | %s | %s | %s | %s | %s | %s |\n", fig, opt(r.Median, r.Unit), p99, base, ratio, target, statusCell(r.Status))
			if r.Command != "" && !slices.Contains(cmds, r.Command) {
				cmds = append(cmds, r.Command)
			}
		}
		p("\n")
		for i, n := range notes {
			p("[%d] %s  \n", i+1, n)
		}
		if len(notes) > 0 {
			p("\n")
		}
		for _, c := range cmds {
			p("Reproduce: `%s`\n\n", c)
		}
	}

	if len(rep.Failed) > 0 || len(rep.Skipped) > 0 || len(rep.Logs) > 0 {
		p("## What the benchmarks said\n\n")
		for _, group := range []struct {
			kind string
			evs  []event
		}{{"FAILED", rep.Failed}, {"skipped", rep.Skipped}, {"logged", rep.Logs}} {
			for _, e := range group.evs {
				p("- %s %s", e.Name, group.kind)
				if len(e.Lines) > 0 {
					p(": %s", strings.Join(e.Lines, " / "))
				}
				p("\n")
			}
		}
		p("\n")
	}
	p("## Notes\n\n")
	for _, n := range rep.Notes {
		p("- %s\n", n)
	}
	p("\n<details><summary>Raw benchmark lines</summary>\n\n```\n%s\n```\n\n</details>\n", strings.Join(rep.raw, "\n"))
	return w.String()
}
