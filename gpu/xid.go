package gpu

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Level is how far an Xid reaches.
type Level int

const (
	// LevelApplication: the fault belongs to one process (a bad kernel, a
	// bad address); the GPU itself is fine.
	LevelApplication Level = iota + 1
	// LevelDevice: the GPU is in trouble; everything on it is affected.
	LevelDevice
)

func (l Level) String() string {
	switch l {
	case LevelApplication:
		return "application"
	case LevelDevice:
		return "device"
	}
	return fmt.Sprintf("Level(%d)", int(l))
}

// applicationXids are faults the driver attributes to the process that
// caused them: 13 graphics engine exception, 31 MMU fault, 43 GPU stopped
// processing (a killed or hung context), 45 preemptive cleanup after a
// context ended, 68 video processor exception, 109 context switch timeout.
// NVIDIA's k8s-device-plugin skips the same set when marking GPUs unhealthy.
var applicationXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// Classify returns the level of an Xid. Besides the well-known device-level
// Xids (48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the
// bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120
// GSP errors) every Xid not known to be application-level is device-level:
// NVIDIA adds Xids with new drivers, and wrongly calling a GPU fault an
// application fault would keep placing work on a broken GPU, while the
// opposite mistake only costs a recoverable restart.
func Classify(xid uint64) Level {
	if applicationXids[xid] {
		return LevelApplication
	}
	return LevelDevice
}

// XidEvent is a hardware fault report from one GPU.
type XidEvent struct {
	GPU   int    // NVML index; -1 when NVML named a device this Host does not know
	UUID  string // empty when GPU is -1
	Xid   uint64
	PID   int // the faulting process when known, else 0 (NVML's event data carries no PID)
	Level Level
	Time  time.Time // when the event was received
}

// xidWaitTimeout bounds one EventSet.Wait: NVML's wait cannot be interrupted,
// so this is how long a cancelled watcher may take to notice.
const xidWaitTimeout = 100 * time.Millisecond

// eventPIDSource is implemented by event sets that know which process raised
// the event Wait last returned. Real NVML's do not; the simulated host's
// does, so injected faults can name a client.
type eventPIDSource interface {
	lastEventPID() int
}

// WatchXid runs this host's Xid event loop until ctx is cancelled (it then
// returns nil) or the Host is closed (it returns ErrClosed). It registers
// every GPU for critical Xid events in one NVML event set; GPUs that cannot
// deliver them are logged and skipped, and if none can it returns an error
// wrapping ErrXidUnsupported. handle is called from the loop's goroutine, one
// event at a time; it must not block for long (hand the event to a channel).
// Only one watcher per Host may run; a second gets ErrWatcherRunning.
func (h *Host) WatchXid(ctx context.Context, handle func(XidEvent)) error {
	return h.WatchXidThen(ctx, handle, nil)
}

// WatchXidThen is WatchXid that calls registered (when not nil) once the
// GPUs are registered for Xid events, or once it returns without having
// registered them: from then on no Xid is missed.
func (h *Host) WatchXidThen(ctx context.Context, handle func(XidEvent), registered func()) error {
	var once sync.Once
	done := func() {
		if registered != nil {
			once.Do(registered)
		}
	}
	defer done()
	if handle == nil {
		return errors.New("gpu: watch Xid: nil handler")
	}
	if err := h.acquire(); err != nil {
		return err
	}
	if !h.watching.CompareAndSwap(false, true) {
		h.release()
		return ErrWatcherRunning
	}
	h.watchers.Add(1)
	h.release()
	defer func() {
		h.watching.Store(false)
		h.watchers.Done()
	}()

	set, ret := h.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: create Xid event set: %w", nvmlErr(ret))
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			h.log.Error("cannot free Xid event set", "err", nvmlErr(ret))
		}
	}()
	if err := h.registerXid(set); err != nil {
		return err
	}
	done()
	h.log.Debug("Xid watcher started")
	return h.xidLoop(ctx, set, handle)
}

func (h *Host) registerXid(set nvml.EventSet) error {
	var errs []error
	registered := 0
	for _, d := range h.devs {
		ret := d.handle.RegisterEvents(nvml.EventTypeXidCriticalError, set)
		switch ret {
		case nvml.SUCCESS:
			registered++
		case nvml.ERROR_NOT_SUPPORTED:
			h.log.Warn("GPU cannot report Xid events; its hardware faults will only be seen through MPS",
				"index", d.info.Index, "uuid", d.info.UUID)
		default:
			err := fmt.Errorf("gpu: register Xid events on GPU %d (%s): %w", d.info.Index, d.info.UUID, nvmlErr(ret))
			h.log.Error("GPU not watched for Xid events", "index", d.info.Index, "uuid", d.info.UUID, "err", err)
			errs = append(errs, err)
		}
	}
	if registered == 0 {
		return errors.Join(append([]error{fmt.Errorf("%w on any of %d GPUs", ErrXidUnsupported, len(h.devs))}, errs...)...)
	}
	return nil
}

func (h *Host) xidLoop(ctx context.Context, set nvml.EventSet, handle func(XidEvent)) error {
	timeoutMs := uint32(xidWaitTimeout / time.Millisecond)
	pids, _ := set.(eventPIDSource)
	for {
		select {
		case <-ctx.Done():
			h.log.Debug("Xid watcher stopped")
			return nil
		case <-h.stop:
			return ErrClosed
		default:
		}
		data, ret := set.Wait(timeoutMs)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		default:
			// Some failures (a lost GPU) return at once; pause so a
			// persistent one does not spin a core.
			h.log.Warn("Xid event wait failed", "err", nvmlErr(ret))
			select {
			case <-ctx.Done():
			case <-h.stop:
			case <-time.After(xidWaitTimeout):
			}
			continue
		}
		if data.EventType&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		ev := XidEvent{GPU: -1, Xid: data.EventData, Level: Classify(data.EventData), Time: time.Now()}
		if i := h.indexOf(data.Device); i >= 0 {
			ev.GPU, ev.UUID = i, h.devs[i].info.UUID
		}
		if pids != nil {
			ev.PID = pids.lastEventPID()
		}
		h.log.Warn("Xid event", "index", ev.GPU, "uuid", ev.UUID, "xid", ev.Xid, "pid", ev.PID, "level", ev.Level.String())
		handle(ev)
	}
}

// indexOf finds the GPU an event names. Handles are compared first because a
// GPU that has just faulted may no longer answer GetUUID; comparing
// interfaces whose dynamic type is not comparable would panic, hence the
// check. -1 when the device is unknown.
func (h *Host) indexOf(dev nvml.Device) int {
	if dev == nil {
		return -1
	}
	if reflect.TypeOf(dev).Comparable() {
		for i, d := range h.devs {
			if reflect.TypeOf(d.handle) == reflect.TypeOf(dev) && d.handle == dev {
				return i
			}
		}
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return -1
	}
	for i, d := range h.devs {
		if d.info.UUID == uuid {
			return i
		}
	}
	return -1
}
