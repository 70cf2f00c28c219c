package gpu

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// simModes reads the compute modes straight from the simulated GPUs,
// bypassing the Host's cache.
func simModes(t *testing.T, sim *Sim) []nvml.ComputeMode {
	t.Helper()
	sim.mu.Lock()
	defer sim.mu.Unlock()
	var out []nvml.ComputeMode
	for _, d := range sim.devs {
		out = append(out, d.mode)
	}
	return out
}

func hostModes(h *Host) []ComputeMode {
	var out []ComputeMode
	for _, g := range h.GPUs() {
		out = append(out, g.ComputeMode)
	}
	return out
}

func TestSetExclusiveAndRestore(t *testing.T) {
	const (
		def  = nvml.COMPUTEMODE_DEFAULT
		proh = nvml.COMPUTEMODE_PROHIBITED
		excl = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	)
	h, sim := newSimHost(t, SimSpec{GPUs: 4})
	// GPU 2 starts prohibited (so restore must not mean "default"), GPU 3
	// starts exclusive (so restore must leave it alone).
	if ret := sim.devs[2].SetComputeMode(proh); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := sim.devs[3].SetComputeMode(excl); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}

	must(t, h.SetExclusive([]int{0, 2, 3}))
	checkModes(t, simModes(t, sim), []nvml.ComputeMode{excl, def, excl, excl})
	if got, want := hostModes(h), []ComputeMode{ComputeModeExclusiveProcess, ComputeModeDefault,
		ComputeModeExclusiveProcess, ComputeModeExclusiveProcess}; !slices.Equal(got, want) {
		t.Errorf("GPUs() modes = %v; want %v", got, want)
	}

	// Setting again must not overwrite the remembered original modes.
	must(t, h.SetExclusive([]int{0, 2}))
	must(t, h.RestoreComputeModes())
	checkModes(t, simModes(t, sim), []nvml.ComputeMode{def, def, proh, excl})
	if got, want := hostModes(h), []ComputeMode{ComputeModeDefault, ComputeModeDefault,
		ComputeModeProhibited, ComputeModeExclusiveProcess}; !slices.Equal(got, want) {
		t.Errorf("GPUs() modes after restore = %v; want %v", got, want)
	}

	// Idempotent: an operator's later change survives a second restore.
	if ret := sim.devs[0].SetComputeMode(proh); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	must(t, h.RestoreComputeModes())
	checkModes(t, simModes(t, sim), []nvml.ComputeMode{proh, def, proh, excl})
}

func TestCloseRestoresComputeModes(t *testing.T) {
	sim, err := NewSim(SimSpec{GPUs: 2})
	must(t, err)
	h, err := New(sim.NVML(), testLog(t))
	must(t, err)
	must(t, h.SetExclusive([]int{1}))
	must(t, h.Close())
	// Read back through a fresh Init, as a later mpsd would.
	if ret := sim.NVML().Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer sim.NVML().Shutdown()
	checkModes(t, simModes(t, sim), []nvml.ComputeMode{nvml.COMPUTEMODE_DEFAULT, nvml.COMPUTEMODE_DEFAULT})
}

func TestSetExclusiveErrors(t *testing.T) {
	t.Run("unknown index changes nothing", func(t *testing.T) {
		h, sim := newSimHost(t, SimSpec{GPUs: 2})
		err := h.SetExclusive([]int{0, 5})
		if !errors.Is(err, ErrUnknownGPU) || !strings.Contains(err.Error(), "index 5") {
			t.Fatalf("SetExclusive = %v; want ErrUnknownGPU naming index 5", err)
		}
		checkModes(t, simModes(t, sim), []nvml.ComputeMode{nvml.COMPUTEMODE_DEFAULT, nvml.COMPUTEMODE_DEFAULT})
	})

	t.Run("failures name the GPU and the rest proceed", func(t *testing.T) {
		var mu sync.Mutex
		modes := map[string]nvml.ComputeMode{}
		dev := func(uuid string, setRet, getRet nvml.Return) nvml.Device {
			d := fakeDevice(uuid)
			d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
				mu.Lock()
				defer mu.Unlock()
				return modes[uuid], getRet
			}
			d.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
				if setRet == nvml.SUCCESS {
					mu.Lock()
					modes[uuid] = m
					mu.Unlock()
				}
				return setRet
			}
			return d
		}
		lib := newFakeLib(
			dev("GPU-a", nvml.ERROR_NO_PERMISSION, nvml.SUCCESS),
			dev("GPU-b", nvml.SUCCESS, nvml.SUCCESS),
			dev("GPU-c", nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED),
		)
		h, err := New(lib, testLog(t))
		must(t, err)
		defer h.Close()

		err = h.SetExclusive([]int{0, 1, 2})
		if !errors.Is(err, nvml.ERROR_NO_PERMISSION) || !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) {
			t.Fatalf("SetExclusive = %v; want both failures", err)
		}
		for _, s := range []string{"set compute mode of GPU 0 (GPU-a)", "read compute mode of GPU 2 (GPU-c)"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
		mu.Lock()
		if modes["GPU-b"] != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
			t.Errorf("GPU 1 mode = %v; want exclusive despite the other failures", modes["GPU-b"])
		}
		mu.Unlock()
		must(t, h.RestoreComputeModes())
		mu.Lock()
		defer mu.Unlock()
		if modes["GPU-b"] != nvml.COMPUTEMODE_DEFAULT {
			t.Errorf("GPU 1 mode after restore = %v; want default", modes["GPU-b"])
		}
	})

	t.Run("failed restore is retried", func(t *testing.T) {
		dev := fakeDevice("GPU-a")
		var mode nvml.ComputeMode
		var fail bool
		dev.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return mode, nvml.SUCCESS }
		dev.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
			if fail {
				return nvml.ERROR_NO_PERMISSION
			}
			mode = m
			return nvml.SUCCESS
		}
		h, err := New(newFakeLib(dev), testLog(t))
		must(t, err)
		defer h.Close()
		must(t, h.SetExclusive([]int{0}))
		fail = true
		err = h.RestoreComputeModes()
		if !errors.Is(err, nvml.ERROR_NO_PERMISSION) || !strings.Contains(err.Error(), "restore compute mode of GPU 0 (GPU-a) to default") {
			t.Fatalf("RestoreComputeModes = %v; want the failure naming GPU 0", err)
		}
		fail = false
		must(t, h.RestoreComputeModes())
		if mode != nvml.COMPUTEMODE_DEFAULT {
			t.Errorf("mode after retried restore = %v; want default", mode)
		}
	})
}

func checkModes(t *testing.T, got, want []nvml.ComputeMode) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("modes = %v; want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("GPU %d compute mode = %v; want %v", i, got[i], want[i])
		}
	}
}
