package gpu

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNewSimSpec(t *testing.T) {
	tests := []struct {
		name     string
		spec     SimSpec
		wantGPUs int
		wantErr  error
		says     []string
	}{
		{"defaults", SimSpec{}, 2, nil, nil},
		{"eight h200", SimSpec{GPUs: 8, Model: "h200-141g"}, 8, nil, nil},
		{"model case and spaces", SimSpec{GPUs: 1, Model: " B200-180G "}, 1, nil, nil},
		{"max", SimSpec{GPUs: MaxSimGPUs, Model: "h100-80g"}, MaxSimGPUs, nil, nil},
		{"negative", SimSpec{GPUs: -1}, 0, ErrBadSimSpec, []string{"gpus: -1", "1..64"}},
		{"too many", SimSpec{GPUs: MaxSimGPUs + 1}, 0, ErrBadSimSpec, []string{"gpus: 65"}},
		{"unknown model", SimSpec{Model: "v100-16g"}, 0, ErrUnknownModel,
			[]string{`"v100-16g"`, "valid: a100-40g, b200-180g, h100-80g, h200-141g"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim, err := NewSim(tc.spec)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("NewSim = %v; want %v", err, tc.wantErr)
				}
				for _, s := range tc.says {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not say %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			lib := sim.NVML()
			if ret := lib.Init(); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			defer lib.Shutdown()
			n, ret := lib.DeviceGetCount()
			if ret != nvml.SUCCESS || n != tc.wantGPUs {
				t.Errorf("DeviceGetCount = %d, %v; want %d", n, ret, tc.wantGPUs)
			}
		})
	}
}

var uuidShape = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestSimUUID(t *testing.T) {
	seen := map[string]int{}
	prefixes := map[string]int{}
	for i := range MaxSimGPUs {
		u := SimUUID(i)
		if !uuidShape.MatchString(u) {
			t.Errorf("SimUUID(%d) = %q; not in NVML's format", i, u)
		}
		if !isFullUUID(strings.ToLower(u)) {
			t.Errorf("SimUUID(%d) = %q; not a full UUID to the selector parser", i, u)
		}
		if j, dup := seen[u]; dup {
			t.Errorf("SimUUID(%d) = SimUUID(%d) = %q", i, j, u)
		}
		seen[u] = i
		if i < 8 {
			p := u[:len("GPU-")+4]
			if j, dup := prefixes[p]; dup {
				t.Errorf("GPUs %d and %d of an 8-GPU host share the prefix %q", j, i, p)
			}
			prefixes[p] = i
		}
		if SimUUID(i) != u {
			t.Errorf("SimUUID(%d) is not stable", i)
		}
	}
}

func TestSimHooks(t *testing.T) {
	_, sim := newSimHost(t, SimSpec{GPUs: 2, Model: "a100-40g"})
	total := uint64(40960) << 20
	tests := []struct {
		name    string
		call    func() error
		wantErr error
		says    string
	}{
		{"fill the card", func() error { return sim.SetProcessMemory(0, 1, ProcessMPSClient, total) }, nil, ""},
		{"one byte more", func() error { return sim.SetProcessMemory(0, 2, ProcessMPSClient, 1) }, ErrSimOutOfMemory,
			"pid 2 wants 1 bytes, 0 of 42949672960 free"},
		{"shrinking is fine", func() error { return sim.SetProcessMemory(0, 1, ProcessMPSClient, total-10) }, nil, ""},
		{"other GPU is empty", func() error { return sim.SetProcessMemory(1, 2, ProcessCompute, total) }, nil, ""},
		{"unknown GPU", func() error { return sim.SetProcessMemory(2, 1, ProcessCompute, 1) }, ErrUnknownGPU, "simulated GPU 2"},
		{"bad pid", func() error { return sim.SetProcessMemory(0, 0, ProcessCompute, 1) }, nil, "bad pid 0"},
		{"bad kind", func() error { return sim.SetProcessMemory(0, 5, ProcessKind(7), 1) }, nil, "bad process kind 7"},
		{"remove on unknown GPU", func() error { return sim.RemoveProcess(-1, 1) }, ErrUnknownGPU, ""},
		{"utilization too high", func() error { return sim.SetUtilization(0, 1.5) }, nil, "out of range"},
		{"utilization NaN", func() error { return sim.SetUtilization(0, nan()) }, nil, "out of range"},
		{"utilization unknown GPU", func() error { return sim.SetUtilization(9, 0.5) }, ErrUnknownGPU, ""},
		{"inject on unknown GPU", func() error { return sim.InjectXid(9, 79, 0) }, ErrUnknownGPU, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if tc.wantErr == nil && tc.says == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("error %v does not wrap %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

// The simulated library behaves like NVML outside Init..Shutdown, so a Host
// that used it after Close would be caught.
func TestSimRefusesCallsWhenNotInitialised(t *testing.T) {
	sim, err := NewSim(SimSpec{GPUs: 1})
	must(t, err)
	lib := sim.NVML()
	if ret := lib.Shutdown(); ret != nvml.ERROR_UNINITIALIZED {
		t.Errorf("Shutdown before Init = %v; want ERROR_UNINITIALIZED", ret)
	}
	if _, ret := lib.DeviceGetCount(); ret != nvml.ERROR_UNINITIALIZED {
		t.Errorf("DeviceGetCount before Init = %v", ret)
	}
	if _, ret := lib.EventSetCreate(); ret != nvml.ERROR_UNINITIALIZED {
		t.Errorf("EventSetCreate before Init = %v", ret)
	}
	must(t, retErr(lib.Init()))
	dev, ret := lib.DeviceGetHandleByIndex(0)
	must(t, retErr(ret))
	must(t, retErr(lib.Shutdown()))
	checks := map[string]nvml.Return{}
	_, checks["GetUUID"] = dev.GetUUID()
	_, checks["GetMemoryInfo"] = dev.GetMemoryInfo()
	_, checks["GetComputeMode"] = dev.GetComputeMode()
	checks["SetComputeMode"] = dev.SetComputeMode(nvml.COMPUTEMODE_DEFAULT)
	_, checks["GetComputeRunningProcesses"] = dev.GetComputeRunningProcesses()
	for name, ret := range checks {
		if ret != nvml.ERROR_UNINITIALIZED {
			t.Errorf("%s after Shutdown = %v; want ERROR_UNINITIALIZED", name, ret)
		}
	}
}

// The library-level forms answer like the device methods, and the fixed
// facts the mock model carries come through.
func TestSimLibraryForms(t *testing.T) {
	sim, err := NewSim(SimSpec{GPUs: 2, Model: "b200-180g"})
	must(t, err)
	lib := sim.NVML()
	must(t, retErr(lib.Init()))
	defer lib.Shutdown()
	dev, ret := lib.DeviceGetHandleByUUID(SimUUID(1))
	must(t, retErr(ret))
	must(t, sim.SetProcessMemory(1, 10, ProcessMPSClient, 1<<30))
	must(t, sim.SetUtilization(1, 1))

	mem, ret := lib.DeviceGetMemoryInfo(dev)
	mem2, ret2 := lib.DeviceGetMemoryInfo_v2(dev)
	if ret != nvml.SUCCESS || ret2 != nvml.SUCCESS || mem.Used != 1<<30 || mem2.Used != mem.Used || mem.Free+mem.Used != mem.Total {
		t.Errorf("memory = %+v %v, v2 %+v %v", mem, ret, mem2, ret2)
	}
	if u, _ := lib.DeviceGetUtilizationRates(dev); u.Gpu != 100 {
		t.Errorf("utilization = %+v; want 100%%", u)
	}
	if p, _ := lib.DeviceGetPowerUsage(dev); p != 1000_000 {
		t.Errorf("power = %d mW; want the 1000 W board limit at full load", p)
	}
	if c, _ := lib.DeviceGetTemperature(dev, nvml.TEMPERATURE_GPU); c != 80 {
		t.Errorf("temperature = %d; want 80", c)
	}
	if _, ret := lib.DeviceGetTemperature(dev, nvml.TemperatureSensors(5)); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("unknown sensor = %v; want ERROR_INVALID_ARGUMENT", ret)
	}
	if ps, _ := lib.DeviceGetMPSComputeRunningProcesses(dev); len(ps) != 1 || ps[0].Pid != 10 {
		t.Errorf("MPS processes = %+v", ps)
	}
	if ps, _ := lib.DeviceGetComputeRunningProcesses(dev); len(ps) != 0 {
		t.Errorf("compute processes = %+v; want none", ps)
	}
	must(t, retErr(lib.DeviceSetComputeMode(dev, nvml.COMPUTEMODE_PROHIBITED)))
	if m, _ := lib.DeviceGetComputeMode(dev); m != nvml.COMPUTEMODE_PROHIBITED {
		t.Errorf("compute mode = %v", m)
	}
	if ret := dev.SetComputeMode(nvml.COMPUTEMODE_COUNT); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("bad compute mode = %v; want ERROR_INVALID_ARGUMENT", ret)
	}
	if types, _ := lib.DeviceGetSupportedEventTypes(dev); types != nvml.EventTypeXidCriticalError {
		t.Errorf("supported events = %#x", types)
	}
	set, ret := lib.EventSetCreate()
	must(t, retErr(ret))
	if ret := lib.DeviceRegisterEvents(dev, nvml.EventTypeAll, set); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("registering all event types = %v; want ERROR_NOT_SUPPORTED", ret)
	}
	must(t, retErr(lib.DeviceRegisterEvents(dev, nvml.EventTypeXidCriticalError, set)))
	must(t, sim.InjectXid(1, 79, 0))
	ev, ret := lib.EventSetWait(set, 0)
	if ret != nvml.SUCCESS || ev.EventData != 79 || ev.Device != dev {
		t.Errorf("EventSetWait = %+v, %v", ev, ret)
	}
	if _, ret := lib.EventSetWait(set, 0); ret != nvml.ERROR_TIMEOUT {
		t.Errorf("empty EventSetWait = %v; want ERROR_TIMEOUT", ret)
	}
	must(t, retErr(lib.EventSetFree(set)))
	if ret := set.Free(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("double Free = %v; want ERROR_INVALID_ARGUMENT", ret)
	}
	if _, ret := set.Wait(0); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("Wait on a freed set = %v; want ERROR_INVALID_ARGUMENT", ret)
	}
	if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("register on a freed set = %v; want ERROR_INVALID_ARGUMENT", ret)
	}

	if v, _ := lib.SystemGetDriverVersion(); v != "570.172.08" {
		t.Errorf("driver version = %q", v)
	}
	if v, _ := lib.SystemGetNVMLVersion(); v != "12.570.172.08" {
		t.Errorf("NVML version = %q", v)
	}
	if v, _ := lib.SystemGetCudaDriverVersion(); v != 12080 {
		t.Errorf("CUDA driver version = %d", v)
	}
	if d, ret := lib.DeviceGetHandleByPciBusId("00000000:02:00.0"); ret != nvml.SUCCESS || d != dev {
		t.Errorf("handle by bus ID = %v, %v; want GPU 1", d, ret)
	}
	if _, ret := lib.DeviceGetHandleByIndex(2); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("handle of GPU 2 = %v; want ERROR_INVALID_ARGUMENT", ret)
	}
	pci, _ := dev.GetPciInfo()
	if got := cString(pci.BusId[:]); got != "00000000:02:00.0" {
		t.Errorf("PCI bus ID = %q", got)
	}
	if got := cString(pci.BusIdLegacy[:]); got != "0000:02:00.0" {
		t.Errorf("legacy PCI bus ID = %q", got)
	}
	if i, _ := dev.GetIndex(); i != 1 {
		t.Errorf("index = %d", i)
	}
	if i, _ := dev.GetMinorNumber(); i != 1 {
		t.Errorf("minor = %d", i)
	}
	if a, _ := dev.GetArchitecture(); a != nvml.DEVICE_ARCH_BLACKWELL {
		t.Errorf("architecture = %v", a)
	}
	if b, _ := dev.GetBrand(); b != nvml.BRAND_NVIDIA {
		t.Errorf("brand = %v", b)
	}
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func retErr(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return ret
}

// FuzzNewSim: the simulate section of a config is outside input; any model
// string and count either builds a host or fails with a spec sentinel.
func FuzzNewSim(f *testing.F) {
	for _, m := range []string{"", "a100-40g", "H100-80G", " h200-141g", "b200-180g", "v100", "a100-40g\x00", "ä"} {
		f.Add(m, 2)
	}
	f.Add("a100-40g", -3)
	f.Add("a100-40g", 1<<40)
	f.Fuzz(func(t *testing.T, model string, n int) {
		sim, err := NewSim(SimSpec{GPUs: n, Model: model})
		if err != nil {
			if !errors.Is(err, ErrBadSimSpec) && !errors.Is(err, ErrUnknownModel) {
				t.Fatalf("NewSim(%d, %q) = %v; wraps no spec sentinel", n, model, err)
			}
			return
		}
		want := n
		if want == 0 {
			want = DefaultSimGPUs
		}
		if len(sim.devs) != want {
			t.Fatalf("NewSim(%d, %q) built %d GPUs", n, model, len(sim.devs))
		}
	})
}

// DriverVersion, which the MPS emulator is given, is what NVML reports;
// NVML's own version carries it. The default model's driver takes
// -multiuser-server (555 or newer), so a config with a multiuser group
// (the Kubernetes example's) starts under --simulate without a model.
func TestSimDriverVersion(t *testing.T) {
	for _, m := range SimModels() {
		sim, err := NewSim(SimSpec{GPUs: 1, Model: m})
		if err != nil {
			t.Fatal(err)
		}
		v, ret := sim.NVML().SystemGetDriverVersion()
		if ret != nvml.SUCCESS || v != sim.DriverVersion() {
			t.Errorf("%s: NVML driver version %q, %v; DriverVersion %q", m, v, ret, sim.DriverVersion())
		}
		if nv, _ := sim.NVML().SystemGetNVMLVersion(); !strings.HasSuffix(nv, "."+v) {
			t.Errorf("%s: NVML version %q does not carry the driver's %q", m, nv, v)
		}
	}
	sim, err := NewSim(SimSpec{})
	if err != nil {
		t.Fatal(err)
	}
	major, _, _ := strings.Cut(sim.DriverVersion(), ".")
	if n, err := strconv.Atoi(major); err != nil || n < 555 {
		t.Errorf("default model %s: driver %s; want 555 or newer (multiuser servers)", DefaultSimModel, sim.DriverVersion())
	}
}
