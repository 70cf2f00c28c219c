package testrun

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// testdata/gotest.json is go test -json of a module whose packages pass,
// fail, skip (with and without a reason, in a subtest), fail to build and
// panic in a test, as a timeout does.
func readGoTest(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/gotest.json")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReport(t *testing.T) {
	var out strings.Builder
	skips, err := Report(strings.NewReader(readGoTest(t)), &out, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []Skip{
		{"example.com/rep", "TestSkip", "needs root: cgroups"},
		{"example.com/rep", "TestSub/a", "no thing here"},
		{"example.com/rep/sub", "TestBareSkip", "(no reason given)"},
	}
	if !slices.Equal(skips, want) {
		t.Errorf("skips\n got %q\nwant %q", skips, want)
	}
	got := out.String()
	// What go test without -json shows: failures with their logs, build
	// errors, a test's panic, each package's result line.
	for _, s := range []string{
		"--- FAIL: TestFail (", "    a_test.go:6: shown\n", "    a_test.go:6: boom\n",
		"FAIL\texample.com/rep\t",
		"broken/x_test.go:5:28: undefined: undefined\n", "FAIL\texample.com/rep/broken [build failed]\n",
		"--- FAIL: TestHang (", "panic: test timed out after 1s", "FAIL\texample.com/rep/crash\t",
		"ok  \texample.com/rep/sub\t",
	} {
		if !strings.Contains(got, s) {
			t.Errorf("output lacks %q:\n%s", s, got)
		}
	}
	// And not what it hides: passing tests' logs, skips, the framing.
	for _, s := range []string{"hidden", "=== RUN", "--- PASS", "--- SKIP", "needs root", "\nPASS\n"} {
		if strings.Contains(got, s) {
			t.Errorf("output shows %q:\n%s", s, got)
		}
	}
}

func TestReportVerbose(t *testing.T) {
	var out strings.Builder
	skips, err := Report(strings.NewReader(readGoTest(t)), &out, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(skips) != 3 {
		t.Errorf("skips %q, want 3", skips)
	}
	for _, s := range []string{"=== RUN   TestPass\n", "    a_test.go:5: hidden\n", "--- SKIP: TestSkip", "--- FAIL: TestFail", "PASS\n"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("verbose output lacks %q", s)
		}
	}
}

func TestReportPassesOtherLines(t *testing.T) {
	var out strings.Builder
	in := "go: downloading example.com/x v1.0.0\n{not json\n" + `{"Action":"output","Package":"p","Output":"ok  \tp\t0.1s\n"}` + "\n"
	if _, err := Report(strings.NewReader(in), &out, false); err != nil {
		t.Fatal(err)
	}
	if want := "go: downloading example.com/x v1.0.0\n{not json\nok  \tp\t0.1s\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
}

func TestAllowed(t *testing.T) {
	a, err := ParseAllowed("# comment\n\n^github.com/mpsd/mpsd/gpu TestRealGPUs: host-dependent:\nno NVIDIA driver\n")
	if err != nil {
		t.Fatal(err)
	}
	skips := []Skip{
		{"github.com/mpsd/mpsd/gpu", "TestRealGPUs", "host-dependent: needs an NVIDIA driver"},
		{"github.com/mpsd/mpsd/deviceplugin", "TestDevices", "no NVIDIA driver on this host"},
		{"github.com/mpsd/mpsd/mpsd", "TestE2E", "needs root"},
		{"github.com/mpsd/mpsd/cgroup", "TestRealGPUs", "host-dependent: other package"},
	}
	if got := a.Disallowed(skips); !slices.Equal(got, skips[2:]) {
		t.Errorf("disallowed %q, want %q", got, skips[2:])
	}
	if got := (Allowed{}).Disallowed(skips); len(got) != len(skips) {
		t.Errorf("an empty list allowed %q", got)
	}
	if _, err := ParseAllowed("ok\n(unclosed\n"); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a bad pattern: %v, want an error naming line 2", err)
	}
}

func FuzzReport(f *testing.F) {
	f.Add(`{"Action":"skip","Package":"p","Test":"T"}`)
	f.Add(`{"Action":"output","Package":"p","Test":"T","Output":"    x_test.go:1: why\n"}` + "\n" + `{"Action":"skip","Package":"p","Test":"T"}`)
	f.Add("plain\n{\n")
	f.Fuzz(func(t *testing.T, in string) {
		var out strings.Builder
		skips, err := Report(strings.NewReader(in), &out, false)
		if err != nil {
			return // a line beyond the scanner's limit
		}
		for _, s := range skips {
			if s.Reason == "" || strings.Contains(s.Reason, "\n") {
				t.Fatalf("skip %+v: want a one-line reason", s)
			}
		}
	})
}

// TestCISkipsAllowed: CI's allow-list parses, allows the skips no CI
// machine can avoid and none of those for a requirement CI must meet.
func TestCISkipsAllowed(t *testing.T) {
	b, err := os.ReadFile("../../.ci/skips-allowed")
	if err != nil {
		t.Fatal(err)
	}
	a, err := ParseAllowed(string(b))
	if err != nil {
		t.Fatal(err)
	}
	allowed := []Skip{
		{"github.com/mpsd/mpsd/gpu", "TestRealGPUs", "host-dependent: needs an NVIDIA driver and GPU; here gpu: NVML unavailable"},
		{"github.com/mpsd/mpsd/deviceplugin", "TestDeviceNodesOnThisHost", "no NVIDIA driver on this host (/proc/driver/nvidia/gpus is empty)"},
		{"github.com/mpsd/mpsd/cgroup", "TestCreateLimitsReadBack/v1", "no cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu"},
		{"github.com/mpsd/mpsd/cgroup", "TestCreateLimitsReadBack/hybrid", "not a hybrid host: no cgroup2 mount at /sys/fs/cgroup/unified"},
	}
	if bad := a.Disallowed(allowed); len(bad) > 0 {
		t.Errorf("not allowed: %q", bad)
	}
	required := []Skip{
		{"github.com/mpsd/mpsd/mpsd", "TestLaunchAppliesLimits", "mpsd's end-to-end tests need root: real cgroups"},
		{"github.com/mpsd/mpsd/cgroup", "TestCreateLimitsReadBack/v2", "needs root: creates cgroups in the host's cgroupfs"},
		{"github.com/mpsd/mpsd/internal/slurmtest", "TestSlurm", "skipping: slurmctld not installed"},
		{"github.com/mpsd/mpsd/internal/promtest", "TestAlertRules", "promtool not available, skipping: not found (run make fetch-prometheus)"},
		{"github.com/mpsd/mpsd/mpsd", "TestUnitFiles", "systemd-analyze not installed (not found): unit files checked for their settings only"},
		{"github.com/mpsd/mpsd/internal/mpsemu/conformance", "TestConformance", "real MPS 550 not available, skipping: x (run make fetch-mps)"},
		{"github.com/mpsd/mpsd/launcher", "TestStatusLine", "no pseudo-terminals on this host: x"},
		{"github.com/mpsd/mpsd/gpu", "TestX", "needs root"},
		// A test of what one backend lacks runs only the backends it applies
		// to (eachBackendOf): a structural skip is a test defect.
		{"github.com/mpsd/mpsd/cgroup", "TestAttachMembershipLast/v2", "v2 has no v1 attach step: the clone itself places the child"},
	}
	if got := a.Disallowed(required); len(got) != len(required) {
		t.Errorf("allowed, though CI requires what they lack: %q", slices.DeleteFunc(slices.Clone(required), func(s Skip) bool { return slices.Contains(got, s) }))
	}
}
