package gpu

import "errors"

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrNVMLUnavailable: nvml.Init failed (no libnvidia-ml, no driver, no
	// permission). No other NVML call was made after it.
	ErrNVMLUnavailable = errors.New("gpu: NVML unavailable")
	// ErrClosed: the Host was closed; NVML is shut down.
	ErrClosed = errors.New("gpu: host closed")
	// ErrUnknownGPU: an index or UUID names no GPU of this host.
	ErrUnknownGPU = errors.New("gpu: unknown GPU")
	// ErrBadSelector: a device selector is malformed or matches nothing.
	ErrBadSelector = errors.New("gpu: bad device selector")
	// ErrAmbiguousSelector: a UUID prefix matches more than one GPU.
	ErrAmbiguousSelector = errors.New("gpu: ambiguous device selector")
	// ErrGPULost: NVML reports the GPU fell off the bus or is otherwise lost
	// (ERROR_GPU_IS_LOST); the watchdog treats it like a device-level fault.
	ErrGPULost = errors.New("gpu: GPU is lost")
	// ErrXidUnsupported: no GPU of the host can deliver Xid events, so the
	// Xid watcher has nothing to watch. Health must come from elsewhere.
	ErrXidUnsupported = errors.New("gpu: Xid events not supported")
	// ErrWatcherRunning: WatchXid was called while another watcher of the
	// same Host is still running; one event loop per host is enough.
	ErrWatcherRunning = errors.New("gpu: Xid watcher already running")
	// ErrUnknownModel: a simulation spec names a GPU model this package does
	// not simulate.
	ErrUnknownModel = errors.New("gpu: unknown simulated GPU model")
	// ErrBadSimSpec: a simulation spec is out of range.
	ErrBadSimSpec = errors.New("gpu: bad simulation spec")
	// ErrSimOutOfMemory: a simulated allocation would exceed the GPU memory.
	ErrSimOutOfMemory = errors.New("gpu: simulated GPU out of memory")
	// ErrSimNotWatched: an Xid was injected on a simulated GPU that no event
	// set is registered on, so, as on real hardware, nobody would see it.
	ErrSimNotWatched = errors.New("gpu: no Xid event set registered on simulated GPU")
)
