package gpu

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		xids []uint64
		want Level
	}{
		{[]uint64{13, 31, 43, 45, 68, 109}, LevelApplication},
		{[]uint64{48, 63, 64, 74, 79, 92, 94, 95, 119, 120}, LevelDevice},
		{[]uint64{0, 1, 12, 14, 110, 999, 1 << 40}, LevelDevice}, // unknown: the safer guess
	}
	for _, tc := range tests {
		for _, x := range tc.xids {
			if got := Classify(x); got != tc.want {
				t.Errorf("Classify(%d) = %v; want %v", x, got, tc.want)
			}
		}
	}
}

func TestXidEventsFromSimulatedHost(t *testing.T) {
	h, sim := newSimHost(t, SimSpec{GPUs: 4})
	if err := sim.InjectXid(0, 79, 0); !errors.Is(err, ErrSimNotWatched) {
		t.Fatalf("InjectXid with no watcher = %v; want ErrSimNotWatched", err)
	}
	w := startWatcher(t, h)
	waitClosed(t, sim.XidWatched(), "the Xid watcher to wait for events")

	tests := []struct {
		gpu  int
		xid  uint64
		pid  int
		want Level
	}{
		{3, 79, 0, LevelDevice},
		{1, 13, 4321, LevelApplication},
		{2, 31, 77, LevelApplication},
		{0, 48, 0, LevelDevice},
		{1, 12345, 0, LevelDevice},
	}
	for _, tc := range tests {
		before := time.Now()
		must(t, sim.InjectXid(tc.gpu, tc.xid, tc.pid))
		ev := w.next(t)
		want := XidEvent{GPU: tc.gpu, UUID: SimUUID(tc.gpu), Xid: tc.xid, PID: tc.pid, Level: tc.want, Time: ev.Time}
		if ev != want {
			t.Errorf("event = %+v; want %+v", ev, want)
		}
		if ev.Time.Before(before) {
			t.Errorf("event time %v is before the injection at %v", ev.Time, before)
		}
	}
	if err := w.stop(t); err != nil {
		t.Errorf("WatchXid after cancel = %v; want nil", err)
	}
	if n := sim.liveEventSets(); n != 0 {
		t.Errorf("%d event sets left after the watcher stopped; want 0 (freed)", n)
	}
	if err := sim.InjectXid(0, 79, 0); !errors.Is(err, ErrSimNotWatched) {
		t.Errorf("InjectXid after the watcher stopped = %v; want ErrSimNotWatched", err)
	}
}

func TestXidWatcherOnePerHost(t *testing.T) {
	h, sim := newSimHost(t, SimSpec{GPUs: 1})
	w := startWatcher(t, h)
	waitClosed(t, sim.XidWatched(), "the first watcher")
	if err := h.WatchXid(t.Context(), func(XidEvent) {}); !errors.Is(err, ErrWatcherRunning) {
		t.Errorf("second WatchXid = %v; want ErrWatcherRunning", err)
	}
	must(t, w.stop(t))
	// The slot is free again once the first watcher is gone.
	w2 := startWatcher(t, h)
	waitClosed(t, sim.XidWatched(), "the second watcher")
	must(t, sim.InjectXid(0, 94, 0))
	if ev := w2.next(t); ev.Xid != 94 {
		t.Errorf("second watcher got %+v", ev)
	}
	must(t, w2.stop(t))
}

func TestCloseStopsXidWatcher(t *testing.T) {
	sim, err := NewSim(SimSpec{GPUs: 2})
	must(t, err)
	h, err := New(sim.NVML(), testLog(t))
	must(t, err)
	w := startWatcher(t, h)
	waitClosed(t, sim.XidWatched(), "the watcher")
	must(t, h.Close())
	if err := w.result(t); !errors.Is(err, ErrClosed) {
		t.Errorf("WatchXid after Close = %v; want ErrClosed", err)
	}
	if n := sim.liveEventSets(); n != 0 {
		t.Errorf("%d event sets left after Close; want 0", n)
	}
	if refs := sim.initRefs(); refs != 0 {
		t.Errorf("NVML init refs after Close = %d; want 0", refs)
	}
}

func TestXidRegistration(t *testing.T) {
	notSupported := func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
	lost := func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_GPU_IS_LOST }

	t.Run("unsupported GPUs are skipped", func(t *testing.T) {
		a, b := fakeDevice("GPU-a"), fakeDevice("GPU-b")
		a.RegisterEventsFunc = notSupported
		var masks []uint64
		b.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
			masks = append(masks, mask)
			return nvml.SUCCESS
		}
		events := make(chan nvml.EventData, 1)
		set := chanEventSet(events, nil)
		lib := newFakeLib(a, b)
		lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
		h, err := New(lib, testLog(t))
		must(t, err)
		defer h.Close()

		w := startWatcher(t, h)
		events <- nvml.EventData{Device: b, EventType: nvml.EventTypeXidCriticalError, EventData: 63}
		if ev := w.next(t); ev.GPU != 1 || ev.UUID != "GPU-b" || ev.Xid != 63 || ev.Level != LevelDevice || ev.PID != 0 {
			t.Errorf("event = %+v; want Xid 63 on GPU 1", ev)
		}
		must(t, w.stop(t))
		if len(masks) != 1 || masks[0] != nvml.EventTypeXidCriticalError {
			t.Errorf("registered masks = %v; want one critical-Xid mask", masks)
		}
		if n := len(set.FreeCalls()); n != 1 {
			t.Errorf("event set freed %d times; want 1", n)
		}
	})

	tests := []struct {
		name     string
		register []func(uint64, nvml.EventSet) nvml.Return
		want     []error
		says     string
	}{
		{"no GPUs", nil, []error{ErrXidUnsupported}, "on any of 0 GPUs"},
		{"no GPU supports events", []func(uint64, nvml.EventSet) nvml.Return{notSupported, notSupported},
			[]error{ErrXidUnsupported}, "on any of 2 GPUs"},
		{"unsupported and lost", []func(uint64, nvml.EventSet) nvml.Return{notSupported, lost},
			[]error{ErrXidUnsupported, ErrGPULost}, "register Xid events on GPU 1 (GPU-1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var devs []nvml.Device
			for i, reg := range tc.register {
				d := fakeDevice("GPU-" + string(rune('0'+i)))
				d.RegisterEventsFunc = reg
				devs = append(devs, d)
			}
			set := chanEventSet(nil, nil)
			lib := newFakeLib(devs...)
			lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
			h, err := New(lib, testLog(t))
			must(t, err)
			defer h.Close()
			err = h.WatchXid(t.Context(), func(XidEvent) { t.Error("unexpected event") })
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Errorf("WatchXid = %v; want it to wrap %v", err, want)
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("WatchXid = %v; want it to say %q", err, tc.says)
			}
			if n := len(set.FreeCalls()); n != 1 {
				t.Errorf("event set freed %d times; want 1", n)
			}
		})
	}

	t.Run("event set creation fails", func(t *testing.T) {
		lib := newFakeLib(fakeDevice("GPU-a"))
		lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
		h, err := New(lib, testLog(t))
		must(t, err)
		defer h.Close()
		err = h.WatchXid(t.Context(), func(XidEvent) {})
		if !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "create Xid event set") {
			t.Errorf("WatchXid = %v; want the creation failure", err)
		}
	})
}

func TestXidLoopEdgeCases(t *testing.T) {
	dev := fakeDevice("GPU-a")
	events := make(chan nvml.EventData, 4)
	// Unbuffered: the send below returns only once a Wait has taken the
	// error, so the events after it prove the loop survived it.
	waitErrs := make(chan nvml.Return)
	set := chanEventSet(events, waitErrs)
	lib := newFakeLib(dev)
	lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	h, err := New(lib, testLog(t))
	must(t, err)
	defer h.Close()
	w := startWatcher(t, h)

	// A failed wait (here a lost GPU) is logged and the loop carries on.
	waitErrs <- nvml.ERROR_GPU_IS_LOST
	// Events of other types are not Xids.
	events <- nvml.EventData{Device: dev, EventType: nvml.EventTypeSingleBitEccError, EventData: 1}
	// A device NVML names but this Host never enumerated: found by UUID.
	sameUUID := fakeDevice("GPU-a")
	events <- nvml.EventData{Device: sameUUID, EventType: nvml.EventTypeXidCriticalError, EventData: 95}
	// A device nobody knows, and no device at all.
	events <- nvml.EventData{Device: fakeDevice("GPU-z"), EventType: nvml.EventTypeXidCriticalError, EventData: 13}
	events <- nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 79}

	want := []XidEvent{
		{GPU: 0, UUID: "GPU-a", Xid: 95, Level: LevelDevice},
		{GPU: -1, Xid: 13, Level: LevelApplication},
		{GPU: -1, Xid: 79, Level: LevelDevice},
	}
	for _, wv := range want {
		ev := w.next(t)
		wv.Time = ev.Time
		if ev != wv {
			t.Errorf("event = %+v; want %+v", ev, wv)
		}
	}
	must(t, w.stop(t))
	// One Wait for the error and one per event, at the least.
	if n := len(set.WaitCalls()); n < 5 {
		t.Errorf("Wait called %d times; want at least 5 (the failed wait must not end the loop)", n)
	}
}

// A device type that cannot be compared with == must not crash the loop.
type uncomparableDevice struct {
	*mock.Device
	_ []int
}

func TestXidEventFromUncomparableDevice(t *testing.T) {
	dev := fakeDevice("GPU-a")
	events := make(chan nvml.EventData, 1)
	set := chanEventSet(events, nil)
	lib := newFakeLib(dev)
	lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	h, err := New(lib, testLog(t))
	must(t, err)
	defer h.Close()
	w := startWatcher(t, h)
	events <- nvml.EventData{Device: uncomparableDevice{Device: fakeDevice("GPU-a")}, EventType: nvml.EventTypeXidCriticalError, EventData: 74}
	if ev := w.next(t); ev.GPU != 0 || ev.Xid != 74 {
		t.Errorf("event = %+v; want Xid 74 on GPU 0", ev)
	}
	must(t, w.stop(t))
}

func TestWatchXidNilHandler(t *testing.T) {
	h, _ := newSimHost(t, SimSpec{GPUs: 1})
	if err := h.WatchXid(t.Context(), nil); err == nil {
		t.Error("WatchXid(nil handler) = nil; want an error")
	}
}
