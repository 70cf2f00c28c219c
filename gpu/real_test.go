package gpu

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestNewWithoutNVML runs the production library, not a mock, on hosts
// without libnvidia-ml: New must fail cleanly and the process must survive
// (a stray NVML call would kill it with a symbol lookup error).
func TestNewWithoutNVML(t *testing.T) {
	h, err := New(nvml.New(), testLog(t))
	if err == nil {
		must(t, h.Close())
		t.Skip("host-dependent: this host has NVML and a driver, so the no-driver path cannot run against the real library here; TestNewAfterFailedInitCallsNothingElse covers it with a mock")
	}
	if !errors.Is(err, ErrNVMLUnavailable) {
		t.Fatalf("New(nvml.New()) = %v; want ErrNVMLUnavailable", err)
	}
	if errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		for _, s := range []string{"NVML not found", "is the NVIDIA driver installed?", "--simulate"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
	}
	t.Logf("without a driver New says: %v", err)
}

// TestRealGPUs checks the package against the real driver. It only reads:
// it never changes a compute mode or any other setting of a real GPU.
func TestRealGPUs(t *testing.T) {
	h, err := New(nvml.New(), testLog(t))
	if errors.Is(err, ErrNVMLUnavailable) {
		t.Skipf("host-dependent: needs an NVIDIA driver and GPU; here %v", err)
	}
	must(t, err)
	defer func() { must(t, h.Close()) }()

	inv := h.GPUs()
	if len(inv) == 0 {
		t.Skip("host-dependent: NVML is present but reports no GPUs")
	}
	for _, g := range inv {
		t.Logf("GPU %d: %s %q %d bytes cc %s MIG %s compute mode %s",
			g.Index, g.UUID, g.Name, g.MemoryTotalBytes, g.ComputeCapability, g.MIGMode, g.ComputeMode)
		if !uuidShape.MatchString(g.UUID) {
			t.Errorf("GPU %d UUID %q is not in the format the selectors expect", g.Index, g.UUID)
		}
		if g.Name == "" || g.MemoryTotalBytes == 0 || g.ComputeCapability.Major < 3 || g.ComputeMode == ComputeModeUnknown {
			t.Errorf("GPU %d inventory incomplete: %+v", g.Index, g)
		}
		for _, sel := range []string{g.UUID, g.UUID[:len("GPU-")+8], "all"} {
			got, err := h.Select([]string{sel})
			if err != nil || len(got) == 0 || (sel != "all" && got[0].Index != g.Index) {
				t.Errorf("Select(%q) = %v, %v", sel, got, err)
			}
		}
	}

	all, err := h.UsageAll()
	if err != nil {
		t.Errorf("UsageAll: %v", err)
	}
	for _, u := range all {
		t.Logf("GPU %d usage: used=%v util=%v temp=%v power=%v processes=%d",
			u.Index, deref(u.MemoryUsedBytes), deref(u.Utilization), deref(u.TemperatureC), deref(u.PowerWatts), len(u.Processes))
		if u.MemoryUsedBytes == nil || *u.MemoryUsedBytes > u.MemoryTotalBytes {
			t.Errorf("GPU %d memory used %v of %d", u.Index, deref(u.MemoryUsedBytes), u.MemoryTotalBytes)
		}
		if u.Utilization != nil && (*u.Utilization < 0 || *u.Utilization > 1) {
			t.Errorf("GPU %d utilization %v out of 0..1", u.Index, *u.Utilization)
		}
	}

	// The real event set registers and stops on cancel; no Xid is expected.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.WatchXid(ctx, func(ev XidEvent) { t.Logf("Xid event on a real GPU: %+v", ev) }) }()
	if _, err := h.Usage(0); err != nil { // work while the watcher registers
		t.Errorf("Usage(0): %v", err)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, ErrXidUnsupported) {
		t.Errorf("WatchXid on real GPUs = %v; want nil (or ErrXidUnsupported)", err)
	} else {
		t.Logf("WatchXid on real GPUs returned %v", err)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return "n/a"
	}
	return *p
}
