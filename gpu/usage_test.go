package gpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func ptr[T any](v T) *T { return &v }

func TestUsageFollowsSimulatedClients(t *testing.T) {
	h, sim := newSimHost(t, SimSpec{GPUs: 2, Model: "h100-80g"})
	total := uint64(81920) << 20

	u, err := h.Usage(1)
	if err != nil {
		t.Fatalf("Usage(1) idle: %v", err)
	}
	checkUsage(t, u, Usage{
		Index: 1, UUID: SimUUID(1), MemoryTotalBytes: total, MemoryUsedBytes: ptr(uint64(0)),
		Utilization: ptr(0.0), TemperatureC: ptr(uint32(30)), PowerWatts: ptr(70.0), Processes: []ProcessMemory{},
	})

	must(t, sim.SetProcessMemory(1, 4242, ProcessMPSClient, 8<<30))
	must(t, sim.SetProcessMemory(1, 17, ProcessMPSClient, 1<<30))
	must(t, sim.SetProcessMemory(1, 900, ProcessCompute, 512<<20))
	must(t, sim.SetProcessMemory(1, 17, ProcessMPSClient, 2<<30)) // replaces, not adds
	must(t, sim.SetUtilization(1, 0.5))
	u, err = h.Usage(1)
	if err != nil {
		t.Fatalf("Usage(1) busy: %v", err)
	}
	checkUsage(t, u, Usage{
		Index: 1, UUID: SimUUID(1), MemoryTotalBytes: total, MemoryUsedBytes: ptr(uint64(10<<30 + 512<<20)),
		Utilization: ptr(0.5), TemperatureC: ptr(uint32(55)), PowerWatts: ptr(385.0),
		Processes: []ProcessMemory{
			{PID: 17, Kind: ProcessMPSClient, UsedBytes: ptr(uint64(2 << 30))},
			{PID: 900, Kind: ProcessCompute, UsedBytes: ptr(uint64(512 << 20))},
			{PID: 4242, Kind: ProcessMPSClient, UsedBytes: ptr(uint64(8 << 30))},
		},
	})

	must(t, sim.RemoveProcess(1, 4242))
	must(t, sim.RemoveProcess(1, 4242)) // idempotent
	all, err := h.UsageAll()
	if err != nil {
		t.Fatalf("UsageAll: %v", err)
	}
	if len(all) != 2 || all[0].Index != 0 || all[1].Index != 1 {
		t.Fatalf("UsageAll = %+v; want GPUs 0 and 1", all)
	}
	if got := *all[1].MemoryUsedBytes; got != 2<<30+512<<20 {
		t.Errorf("GPU 1 memory used after removal = %d", got)
	}
	if got := *all[0].MemoryUsedBytes; got != 0 {
		t.Errorf("GPU 0 memory used = %d; want 0 (clients were on GPU 1)", got)
	}
}

func TestUsageUnsupportedFieldsAreAbsent(t *testing.T) {
	dev := fakeDevice("GPU-11111111-2222-3333-4444-555555555555")
	h, err := New(newFakeLib(dev), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
	dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
	dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	dev.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }

	u, err := h.Usage(0)
	if err != nil {
		t.Fatalf("Usage with every field unsupported: %v", err)
	}
	checkUsage(t, u, Usage{Index: 0, UUID: "GPU-11111111-2222-3333-4444-555555555555", MemoryTotalBytes: 40 << 30})
}

func TestUsageFromNVMLValues(t *testing.T) {
	tests := []struct {
		name    string
		compute []nvml.ProcessInfo
		mps     func() ([]nvml.ProcessInfo, nvml.Return)
		want    []ProcessMemory
	}{
		{"both lists",
			[]nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 100}},
			func() ([]nvml.ProcessInfo, nvml.Return) {
				return []nvml.ProcessInfo{{Pid: 5, UsedGpuMemory: 50}}, nvml.SUCCESS
			},
			[]ProcessMemory{{PID: 5, Kind: ProcessMPSClient, UsedBytes: ptr(uint64(50))}, {PID: 10, Kind: ProcessCompute, UsedBytes: ptr(uint64(100))}}},
		{"MPS list unsupported",
			[]nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 100}},
			func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
			[]ProcessMemory{{PID: 10, Kind: ProcessCompute, UsedBytes: ptr(uint64(100))}}},
		{"PID in both lists counts as MPS client",
			[]nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 1}},
			func() ([]nvml.ProcessInfo, nvml.Return) {
				return []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 2}}, nvml.SUCCESS
			},
			[]ProcessMemory{{PID: 7, Kind: ProcessMPSClient, UsedBytes: ptr(uint64(2))}}},
		{"memory not available",
			[]nvml.ProcessInfo{{Pid: 3, UsedGpuMemory: ^uint64(0)}},
			func() ([]nvml.ProcessInfo, nvml.Return) { return []nvml.ProcessInfo{}, nvml.SUCCESS },
			[]ProcessMemory{{PID: 3, Kind: ProcessCompute}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dev := fakeDevice("GPU-a")
			dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return tc.compute, nvml.SUCCESS }
			dev.GetMPSComputeRunningProcessesFunc = tc.mps
			h, err := New(newFakeLib(dev), testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			u, err := h.Usage(0)
			if err != nil {
				t.Fatal(err)
			}
			checkUsage(t, u, Usage{
				Index: 0, UUID: "GPU-a", MemoryTotalBytes: 40 << 30, MemoryUsedBytes: ptr(uint64(1 << 30)),
				Utilization: ptr(0.42), TemperatureC: ptr(uint32(51)), PowerWatts: ptr(123.456), Processes: tc.want,
			})
		})
	}
}

func TestUsageReturnsPartialReadingAndErrors(t *testing.T) {
	dev := fakeDevice("GPU-11111111-2222-3333-4444-555555555555")
	h, err := New(newFakeLib(dev, fakeDevice("GPU-b")), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
	dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }

	u, err := h.Usage(0)
	if !errors.Is(err, ErrGPULost) || !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("Usage error = %v; want the lost GPU and the unknown error", err)
	}
	for _, s := range []string{"temperature of GPU 0 (GPU-11111111-2222-3333-4444-555555555555)", "power of GPU 0"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if u.TemperatureC != nil || u.PowerWatts != nil || u.MemoryUsedBytes == nil || u.Utilization == nil {
		t.Errorf("partial usage = %+v; want memory and utilization only", u)
	}

	all, err := h.UsageAll()
	if !errors.Is(err, ErrGPULost) || len(all) != 2 || all[1].TemperatureC == nil {
		t.Errorf("UsageAll = %+v, %v; want both GPUs, GPU 1 complete, and GPU 0's error", all, err)
	}
}

func checkUsage(t *testing.T, got, want Usage) {
	t.Helper()
	if got.Index != want.Index || got.UUID != want.UUID || got.MemoryTotalBytes != want.MemoryTotalBytes {
		t.Errorf("usage identity = %d %s %d; want %d %s %d", got.Index, got.UUID, got.MemoryTotalBytes,
			want.Index, want.UUID, want.MemoryTotalBytes)
	}
	eqPtr(t, "memory used", got.MemoryUsedBytes, want.MemoryUsedBytes)
	eqPtr(t, "utilization", got.Utilization, want.Utilization)
	eqPtr(t, "temperature", got.TemperatureC, want.TemperatureC)
	eqPtr(t, "power", got.PowerWatts, want.PowerWatts)
	if (got.Processes == nil) != (want.Processes == nil) || len(got.Processes) != len(want.Processes) {
		t.Errorf("processes = %+v; want %+v", got.Processes, want.Processes)
		return
	}
	for i := range want.Processes {
		g, w := got.Processes[i], want.Processes[i]
		if g.PID != w.PID || g.Kind != w.Kind {
			t.Errorf("process %d = %+v; want %+v", i, g, w)
		}
		eqPtr(t, "process memory", g.UsedBytes, w.UsedBytes)
	}
}

func eqPtr[T comparable](t *testing.T, what string, got, want *T) {
	t.Helper()
	switch {
	case got == nil && want == nil:
	case got == nil || want == nil:
		t.Errorf("%s = %v; want %v", what, got, want)
	case *got != *want:
		t.Errorf("%s = %v; want %v", what, *got, *want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
