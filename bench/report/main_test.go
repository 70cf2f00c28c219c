package main

import (
	"strings"
	"testing"
	"time"
)

const sample = `bench-note: launch figures from a second run
bench-command: go test -run '^$' -bench '^BenchmarkLaunchOverhead$' -benchtime 3x ./mpsd
goos: linux
cpu: Test CPU
BenchmarkLaunchOverhead-2   	       3	  17122004 ns/op	        2.5 added-p50-ms	        31.33 added-p99-ms	        12.32 mps-launch-p50-ms	        32.30 mps-launch-p99-ms	         1.339 true-p50-ms	         4.102 true-p99-ms	         0.9 startup-p50-ms	         2.1 startup-p99-ms	         0.6 grant-p50-ms	         1.9 grant-p99-ms	         0.5 attach-p50-ms	         1.1 attach-p99-ms
bench-command: go test -run '^$' -bench '^BenchmarkMPSSetup$' -benchtime 3x ./mpsd
BenchmarkMPSSetup/control=emulator-2         	       3	 394768368 ns/op	         8.000 instances	       102.6 mpsd-p50-ms	       113.2 mpsd-p99-ms	         1.017 new-p50-ms	         1.077 new-p99-ms	       126.6 shell-p50-ms	       132.4 shell-p99-ms	         1.234 speedup-x
--- SKIP: BenchmarkMPSSetup/control=nvidia
    bench_test.go:1: NVIDIA's nvidia-cuda-mps-control not fetched
bench-command: go test -run '^$' -bench '^BenchmarkFailover$' -benchtime 3x ./mpsd
BenchmarkFailover/clients=8-2         	       3	  98777465 ns/op	         0.9776 detect-p50-ms	         4.656 detect-p99-ms	        70.35 failover-p50-ms	        575.04 failover-p99-ms
--- FAIL: BenchmarkFootprint
    bench_test.go:2: mpsd not ready
`

func TestReport(t *testing.T) {
	run, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if run.procs != 2 || run.cpu != "Test CPU" || len(run.results) != 3 || len(run.skipped) != 1 || len(run.failed) != 1 {
		t.Fatalf("parsed %+v", run)
	}
	if got := run.results[1].Name; got != "BenchmarkMPSSetup/control=emulator" {
		t.Errorf("name %q: the -GOMAXPROCS suffix stays", got)
	}
	rep := build(run, Machine{CPUs: 2}, time.Unix(0, 0))
	if len(rep.Notes) == 0 || rep.Notes[0] != "launch figures from a second run" {
		t.Errorf("notes %q: the bench-note line comes first", rep.Notes)
	}
	status := map[string]Row{}
	for _, a := range rep.Areas {
		for _, r := range a.Rows {
			status[r.Figure] = r
		}
	}
	for figure, want := range map[string]string{
		"time added by mps-launch (launched − direct, pair by pair)":                                          statusMet, // 2.5 ms ≤ 3 ms
		"mps-launch --sm 10 --mem 1G -- /bin/true":                                                            statusNoTarget,
		"start-up and exit of mps-launch alone (mps-launch --help − /bin/true, pair by pair)":                 statusNoTarget,
		"lease round trip (request → granted event, an API client on a connection of its own)":                statusNoTarget,
		"attach round trip (a waiting child moved into the lease cgroup), after mpsd released the last lease": statusNoTarget,
		"mpsd, 8 instances, the MPS emulator's control daemon":                                                statusMissed,
		"mpsd, 8 instances, NVIDIA's nvidia-cuda-mps-control":                                                 statusNotMeasured,
		"failover, 8 clients":                     statusMissed, // p99 575 ms > 500 ms
		"failover, 48 clients":                    statusNotMeasured,
		"RSS, 1,000 leases held, after 10 s idle": statusNotMeasured,
		"grants+releases per second, 100 clients": statusNotMeasured,
		"scrape time, 64 instances, 1,000 leases": statusNotMeasured,
		"mpsd New before Run (config, GPU inventory, cgroups), not counted above, the MPS emulator's control daemon": statusNoTarget,
	} {
		r, ok := status[figure]
		if !ok {
			t.Errorf("no row %q", figure)
			continue
		}
		if r.Status != want {
			t.Errorf("%q: %s, want %s (%+v)", figure, r.Status, want, r)
		}
	}
	if r := status["mpsd, 8 instances, NVIDIA's nvidia-cuda-mps-control"]; !strings.Contains(r.Note, "skipped: bench_test.go:1: NVIDIA's") {
		t.Errorf("skip reason not carried: %q", r.Note)
	}
	if r := status["failover, 8 clients"]; r.Command != "go test -run '^$' -bench '^BenchmarkFailover$' -benchtime 3x ./mpsd" {
		t.Errorf("command %q", r.Command)
	}
	md := markdown(rep)
	for _, want := range []string{"❌ **NOT MET**", "⚠️ **not measured**", "Reproduce: `go test -run '^$' -bench '^BenchmarkFailover$'", "BenchmarkFootprint FAILED: bench_test.go:2: mpsd not ready"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	if len(rep.Summary.Missed) != 2 || len(rep.Summary.Met) != 1 {
		t.Errorf("summary %+v", rep.Summary)
	}
}

func TestFmtNum(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.04421: "0.044", 1.5: "1.50", 2: "2", 12.34: "12.3", 123.4: "123", 4942.4: "4,942", 1234567: "1,234,567"} {
		if got := fmtNum(v, ""); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
}
