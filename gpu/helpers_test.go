package gpu

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitLimit bounds every wait for an event so a broken feature fails the
// test instead of hanging it; it is a deadline, not a timing assertion.
const waitLimit = 10 * time.Second

// testLog sends the Host's log lines to the test's own output.
func testLog(t *testing.T) *slog.Logger {
	t.Helper()
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var _ io.Writer = tWriter{}

// newSimHost builds a simulated host and a Host over it, closed at cleanup.
func newSimHost(t *testing.T, spec SimSpec) (*Host, *Sim) {
	t.Helper()
	sim, err := NewSim(spec)
	if err != nil {
		t.Fatalf("NewSim(%+v): %v", spec, err)
	}
	h, err := New(sim.NVML(), testLog(t))
	if err != nil {
		t.Fatalf("New(sim): %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h, sim
}

// nvmlTrap is an nvml.Interface where every method records its name and
// answers ERROR_UNINITIALIZED, except Init, which answers initRet.
type nvmlTrap struct {
	*mock.Interface
	mu    sync.Mutex
	calls []string
}

func newNVMLTrap(t *testing.T, initRet nvml.Return) *nvmlTrap {
	t.Helper()
	trap := &nvmlTrap{Interface: &mock.Interface{}}
	v := reflect.ValueOf(trap.Interface).Elem()
	retType := reflect.TypeFor[nvml.Return]()
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		if f.Kind() != reflect.Func || !strings.HasSuffix(sf.Name, "Func") {
			continue
		}
		name := strings.TrimSuffix(sf.Name, "Func")
		f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value {
			trap.mu.Lock()
			trap.calls = append(trap.calls, name)
			trap.mu.Unlock()
			outs := make([]reflect.Value, f.Type().NumOut())
			for j := range outs {
				out := f.Type().Out(j)
				outs[j] = reflect.Zero(out)
				if out == retType {
					ret := nvml.ERROR_UNINITIALIZED
					if name == "Init" {
						ret = initRet
					}
					outs[j] = reflect.ValueOf(ret)
				}
			}
			return outs
		}))
	}
	// Every method of nvml.Interface must be trapped, or a call could slip
	// past the trap as a nil-func panic instead of being recorded.
	iface := reflect.TypeFor[nvml.Interface]()
	for i := range iface.NumMethod() {
		m := iface.Method(i).Name
		if f := v.FieldByName(m + "Func"); !f.IsValid() || f.IsNil() {
			t.Fatalf("trap does not cover nvml.Interface.%s", m)
		}
	}
	return trap
}

func (tr *nvmlTrap) Calls() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.calls...)
}

// fakeDevice is a plain go-nvml mock GPU (not the Sim) whose methods answer
// like a healthy A100; tests replace single XxxFunc fields to break it.
func fakeDevice(uuid string) *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetNameFunc: func() (string, nvml.Return) { return "NVIDIA A100-SXM4-40GB", nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 40 << 30, Used: 1 << 30, Free: 39 << 30}, nvml.SUCCESS
		},
		GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return 8, 0, nvml.SUCCESS },
		GetMigModeFunc:               func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS },
		GetComputeModeFunc:           func() (nvml.ComputeMode, nvml.Return) { return nvml.COMPUTEMODE_DEFAULT, nvml.SUCCESS },
		SetComputeModeFunc:           func(nvml.ComputeMode) nvml.Return { return nvml.SUCCESS },
		GetUtilizationRatesFunc:      func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 42}, nvml.SUCCESS },
		GetTemperatureFunc:           func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 51, nvml.SUCCESS },
		GetPowerUsageFunc:            func() (uint32, nvml.Return) { return 123456, nvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1 << 20}}, nvml.SUCCESS
		},
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: 200, UsedGpuMemory: 2 << 20}}, nvml.SUCCESS
		},
		RegisterEventsFunc: func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS },
	}
}

// fakeLib is a plain go-nvml mock library over the given devices, counting
// Init and Shutdown.
type fakeLib struct {
	*mock.Interface
}

func newFakeLib(devs ...nvml.Device) *fakeLib {
	return &fakeLib{Interface: &mock.Interface{
		InitFunc:                       func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "580.159.04", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 13000, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}}
}

// chanEventSet is a mock event set fed by a channel, for event data the Sim
// never produces (foreign devices, other event types, wait errors).
func chanEventSet(ch <-chan nvml.EventData, waitErr <-chan nvml.Return) *mock.EventSet {
	return &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			timer := time.NewTimer(time.Duration(ms) * time.Millisecond)
			defer timer.Stop()
			select {
			case d := <-ch:
				return d, nvml.SUCCESS
			case r := <-waitErr:
				return nvml.EventData{}, r
			case <-timer.C:
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
}

// watcher runs h.WatchXid in a goroutine owned by the test.
type watcher struct {
	events chan XidEvent
	done   chan error
	cancel context.CancelFunc
}

func startWatcher(t *testing.T, h *Host) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{events: make(chan XidEvent, 16), done: make(chan error, 1), cancel: cancel}
	go func() { w.done <- h.WatchXid(ctx, func(e XidEvent) { w.events <- e }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(waitLimit):
			t.Error("Xid watcher did not stop")
		}
	})
	return w
}

// stop cancels the watcher and returns what WatchXid returned.
func (w *watcher) stop(t *testing.T) error {
	t.Helper()
	w.cancel()
	return w.result(t)
}

func (w *watcher) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.done:
		w.done <- err // let the cleanup see it too
		return err
	case <-time.After(waitLimit):
		t.Fatal("Xid watcher did not return")
		return nil
	}
}

func (w *watcher) next(t *testing.T) XidEvent {
	t.Helper()
	select {
	case ev := <-w.events:
		return ev
	case err := <-w.done:
		w.done <- err
		t.Fatalf("Xid watcher returned %v before delivering an event", err)
	case <-time.After(waitLimit):
		t.Fatal("no Xid event delivered")
	}
	return XidEvent{}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// initRefs is how many NVML Inits the simulated library has not yet seen
// matched by a Shutdown.
func (s *Sim) initRefs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refs
}

// liveEventSets is how many simulated event sets are not yet freed.
func (s *Sim) liveEventSets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sets)
}
