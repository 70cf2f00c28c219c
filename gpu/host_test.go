package gpu

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNewAfterFailedInitCallsNothingElse(t *testing.T) {
	tests := []struct {
		name    string
		ret     nvml.Return
		message []string
	}{
		{"library not found", nvml.ERROR_LIBRARY_NOT_FOUND,
			[]string{"NVML not found", "is the NVIDIA driver installed?", "use --simulate to run without GPUs"}},
		{"driver not loaded", nvml.ERROR_DRIVER_NOT_LOADED,
			[]string{"NVML init failed", "is the NVIDIA driver installed and loaded", "use --simulate to run without GPUs"}},
		{"no permission", nvml.ERROR_NO_PERMISSION,
			[]string{"NVML init failed", "/dev/nvidia*", "use --simulate"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			trap := newNVMLTrap(t, tc.ret)
			h, err := New(trap, testLog(t))
			if h != nil || err == nil {
				t.Fatalf("New = %v, %v; want nil host and an error", h, err)
			}
			if !errors.Is(err, ErrNVMLUnavailable) || !errors.Is(err, tc.ret) {
				t.Errorf("error %q does not wrap ErrNVMLUnavailable and %v", err, tc.ret)
			}
			for _, want := range tc.message {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if got := trap.Calls(); !slices.Equal(got, []string{"Init"}) {
				t.Errorf("NVML calls = %v; want only [Init]", got)
			}
		})
	}
}

// TestNVMLTrapRecordsCalls proves the trap above would see a stray call.
func TestNVMLTrapRecordsCalls(t *testing.T) {
	trap := newNVMLTrap(t, nvml.SUCCESS)
	if ret := trap.Init(); ret != nvml.SUCCESS {
		t.Fatalf("trap Init = %v", ret)
	}
	if _, ret := trap.DeviceGetCount(); ret != nvml.ERROR_UNINITIALIZED {
		t.Errorf("trap DeviceGetCount = %v; want ERROR_UNINITIALIZED", ret)
	}
	if ret := trap.Shutdown(); ret != nvml.ERROR_UNINITIALIZED {
		t.Errorf("trap Shutdown = %v", ret)
	}
	if got, want := trap.Calls(), []string{"Init", "DeviceGetCount", "Shutdown"}; !slices.Equal(got, want) {
		t.Errorf("calls = %v; want %v", got, want)
	}
}

func TestInventory(t *testing.T) {
	tests := []struct {
		spec   SimSpec
		gpus   int
		name   string
		memory uint64
		cc     ComputeCapability
		cuda   int
	}{
		{SimSpec{}, 2, "Mock NVIDIA A100-SXM4-40GB", 40960 << 20, ComputeCapability{8, 0}, 12080},
		{SimSpec{GPUs: 8, Model: "a100-40g"}, 8, "Mock NVIDIA A100-SXM4-40GB", 40960 << 20, ComputeCapability{8, 0}, 12080},
		{SimSpec{GPUs: 1, Model: "h100-80g"}, 1, "NVIDIA H100 80GB HBM3", 81920 << 20, ComputeCapability{9, 0}, 12040},
		{SimSpec{GPUs: 4, Model: "H200-141G"}, 4, "NVIDIA H200 141GB HBM3e", 144384 << 20, ComputeCapability{9, 0}, 13000},
		{SimSpec{GPUs: 3, Model: "b200-180g"}, 3, "NVIDIA B200 180GB HBM3e", 184320 << 20, ComputeCapability{10, 0}, 12080},
	}
	for _, tc := range tests {
		t.Run(tc.spec.Model+"/"+tc.name, func(t *testing.T) {
			h, _ := newSimHost(t, tc.spec)
			got := h.GPUs()
			if len(got) != tc.gpus {
				t.Fatalf("%d GPUs; want %d", len(got), tc.gpus)
			}
			for i, g := range got {
				want := Info{
					Index: i, UUID: SimUUID(i), Name: tc.name, MemoryTotalBytes: tc.memory,
					ComputeCapability: tc.cc, MIGMode: MIGDisabled, ComputeMode: ComputeModeDefault, CUDADriverVersion: tc.cuda,
				}
				if g != want {
					t.Errorf("GPU %d = %+v; want %+v", i, g, want)
				}
			}
		})
	}
}

func TestInventoryToleratesUnsupportedFields(t *testing.T) {
	dev := fakeDevice("GPU-11111111-2222-3333-4444-555555555555")
	dev.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
	dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
	dev.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	other := fakeDevice("GPU-66666666-7777-8888-9999-aaaaaaaaaaaa")
	other.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }

	h, err := New(newFakeLib(dev, other), testLog(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer h.Close()
	got := h.GPUs()
	want := []Info{
		{Index: 0, UUID: "GPU-11111111-2222-3333-4444-555555555555", MIGMode: MIGUnsupported, ComputeMode: ComputeModeUnknown, CUDADriverVersion: 13000},
		{Index: 1, UUID: "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa", MemoryTotalBytes: 40 << 30,
			ComputeCapability: ComputeCapability{8, 0}, MIGMode: MIGEnabled, ComputeMode: ComputeModeDefault, CUDADriverVersion: 13000},
	}
	if !slices.Equal(got, want) {
		t.Errorf("GPUs() =\n%+v\nwant\n%+v", got, want)
	}
}

func TestNewFailsWithoutUUIDAndShutsDown(t *testing.T) {
	tests := []struct {
		name    string
		lib     func() *fakeLib
		wantErr error
		says    string
	}{
		{"count fails", func() *fakeLib {
			l := newFakeLib()
			l.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			return l
		}, nvml.ERROR_UNKNOWN, "count devices"},
		{"handle fails", func() *fakeLib {
			l := newFakeLib(fakeDevice("GPU-x"))
			l.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
			return l
		}, ErrGPULost, "handle of GPU 0"},
		{"UUID fails", func() *fakeLib {
			d := fakeDevice("")
			d.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
			return newFakeLib(fakeDevice("GPU-a"), d)
		}, nvml.ERROR_NOT_SUPPORTED, "UUID of GPU 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := tc.lib()
			_, err := New(lib, testLog(t))
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("New error = %v; want %v saying %q", err, tc.wantErr, tc.says)
			}
			if n, m := len(lib.InitCalls()), len(lib.ShutdownCalls()); n != 1 || m != 1 {
				t.Errorf("Init called %d times, Shutdown %d; want 1 and 1", n, m)
			}
		})
	}
}

func TestCloseShutsDownOnceThenRefusesCalls(t *testing.T) {
	sim, err := NewSim(SimSpec{GPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(sim.NVML(), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := sim.initRefs(); got != 1 {
		t.Fatalf("NVML init refs after New = %d; want 1", got)
	}
	for i := range 2 {
		if err := h.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	// A second Shutdown would have hit ERROR_UNINITIALIZED and failed Close.
	if got := sim.initRefs(); got != 0 {
		t.Errorf("NVML init refs after Close = %d; want 0", got)
	}
	calls := map[string]func() error{
		"Usage":               func() error { _, err := h.Usage(0); return err },
		"UsageAll":            func() error { _, err := h.UsageAll(); return err },
		"SetExclusive":        func() error { return h.SetExclusive([]int{0}) },
		"RestoreComputeModes": h.RestoreComputeModes,
		"WatchXid":            func() error { return h.WatchXid(t.Context(), func(XidEvent) {}) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v; want ErrClosed", name, err)
		}
	}
	if got := len(h.GPUs()); got != 2 {
		t.Errorf("GPUs() after Close has %d entries; want the 2 cached", got)
	}
}

func TestCloseReportsShutdownFailure(t *testing.T) {
	lib := newFakeLib(fakeDevice("GPU-a"))
	lib.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	h, err := New(lib, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "nvml shutdown") {
		t.Errorf("Close = %v; want the shutdown failure", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close = %v; want nil", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times; want 1", n)
	}
}

func TestUnknownGPUIndex(t *testing.T) {
	h, _ := newSimHost(t, SimSpec{GPUs: 2})
	for _, i := range []int{-1, 2, 100} {
		if _, err := h.Usage(i); !errors.Is(err, ErrUnknownGPU) {
			t.Errorf("Usage(%d) = %v; want ErrUnknownGPU", i, err)
		}
	}
}

func TestStringers(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{MIGUnsupported.String(), "unsupported"},
		{MIGDisabled.String(), "disabled"},
		{MIGEnabled.String(), "enabled"},
		{MIGMode(9).String(), "MIGMode(9)"},
		{ComputeModeUnknown.String(), "unknown"},
		{ComputeModeDefault.String(), "default"},
		{ComputeModeExclusiveThread.String(), "exclusive_thread"},
		{ComputeModeProhibited.String(), "prohibited"},
		{ComputeModeExclusiveProcess.String(), "exclusive_process"},
		{ComputeMode(9).String(), "ComputeMode(9)"},
		{ComputeCapability{9, 0}.String(), "9.0"},
		{LevelApplication.String(), "application"},
		{LevelDevice.String(), "device"},
		{Level(0).String(), "Level(0)"},
		{ProcessCompute.String(), "compute"},
		{ProcessMPSClient.String(), "mps_client"},
		{ProcessKind(0).String(), "ProcessKind(0)"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q; want %q", tc.got, tc.want)
		}
	}
}

func TestComputeModeFromNVML(t *testing.T) {
	tests := []struct {
		in   nvml.ComputeMode
		want ComputeMode
	}{
		{nvml.COMPUTEMODE_DEFAULT, ComputeModeDefault},
		{nvml.COMPUTEMODE_EXCLUSIVE_THREAD, ComputeModeExclusiveThread},
		{nvml.COMPUTEMODE_PROHIBITED, ComputeModeProhibited},
		{nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, ComputeModeExclusiveProcess},
		{nvml.COMPUTEMODE_COUNT, ComputeModeUnknown},
		{nvml.ComputeMode(-1), ComputeModeUnknown},
	}
	for _, tc := range tests {
		if got := computeModeFromNVML(tc.in); got != tc.want {
			t.Errorf("computeModeFromNVML(%d) = %v; want %v", tc.in, got, tc.want)
		}
	}
}

// The Host keeps the driver version NVML reports, for what the driver's
// MPS offers; a library that cannot say leaves it empty.
func TestHostDriverVersion(t *testing.T) {
	sim, err := NewSim(SimSpec{GPUs: 1, Model: "h200-141g"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(sim.NVML(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got := h.DriverVersion(); got != sim.DriverVersion() || got == "" {
		t.Errorf("DriverVersion = %q; want the simulated %q", got, sim.DriverVersion())
	}
	if got := h.GPUs()[0].CUDADriverVersion; got != 13000 {
		t.Errorf("CUDADriverVersion = %d; want the simulated 13000", got)
	}
	lib := newFakeLib(fakeDevice("GPU-1"))
	lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
	lib.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	h2, err := New(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if got := h2.DriverVersion(); got != "" {
		t.Errorf("DriverVersion without an answer = %q; want empty", got)
	}
	if got := h2.GPUs()[0].CUDADriverVersion; got != 0 {
		t.Errorf("CUDADriverVersion without an answer = %d; want 0", got)
	}
}
