package gpu

import (
	"context"
	"log/slog"
	"testing"
)

func benchHost(b *testing.B, gpus int) (*Host, *Sim) {
	b.Helper()
	sim, err := NewSim(SimSpec{GPUs: gpus, Model: "h100-80g"})
	if err != nil {
		b.Fatal(err)
	}
	h, err := New(sim.NVML(), slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	return h, sim
}

// BenchmarkUsageAll8 is one metrics scrape of an 8-GPU simulated host.
func BenchmarkUsageAll8(b *testing.B) {
	h, sim := benchHost(b, 8)
	for g := range 8 {
		for pid := 1; pid <= 16; pid++ {
			if err := sim.SetProcessMemory(g, pid, ProcessMPSClient, 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	}
	for b.Loop() {
		if _, err := h.UsageAll(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSelect resolves a typical group selector list on 8 GPUs.
func BenchmarkSelect(b *testing.B) {
	h, _ := benchHost(b, 8)
	inv := h.GPUs()
	sels := []string{"0", "3", SimUUID(5), SimUUID(7)[:10]}
	for b.Loop() {
		if _, err := Select(inv, sels); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkXidDelivery is the latency of one injected Xid through the event
// set and the watcher loop to the handler.
func BenchmarkXidDelivery(b *testing.B) {
	h, sim := benchHost(b, 2)
	events := make(chan XidEvent, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.WatchXid(ctx, func(e XidEvent) { events <- e }) }()
	defer func() {
		cancel()
		<-done
	}()
	<-sim.XidWatched()
	for b.Loop() {
		if err := sim.InjectXid(1, 79, 0); err != nil {
			b.Fatal(err)
		}
		<-events
	}
}
