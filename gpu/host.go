package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Host is the set of GPUs of one machine, seen through one nvml.Interface.
// It is safe for concurrent use. Every NVML call it makes happens between a
// successful Init and its single Shutdown in Close.
type Host struct {
	lib  nvml.Interface
	log  *slog.Logger
	devs []device // by NVML index; fixed after New
	// driver is the driver version NVML reported at New ("580.159.04"),
	// "" when it could not say.
	driver string

	// mu is read-held around every NVML call made on a caller's behalf and
	// write-held by Close, so Shutdown never races a call in flight.
	mu     sync.RWMutex
	closed bool

	stop     chan struct{}  // closed by Close: Xid watchers return
	watchers sync.WaitGroup // running Xid watchers; Close waits for them
	watching atomic.Bool    // one Xid watcher per host

	modeMu sync.Mutex
	modes  []ComputeMode            // current compute mode by index, as last read or set
	saved  map[int]nvml.ComputeMode // modes to restore, only for GPUs this Host changed
}

type device struct {
	handle nvml.Device
	info   Info // ComputeMode lives in Host.modes
}

// New initialises NVML through lib and reads the inventory of the host.
// Production passes nvml.New(); simulation passes Sim.NVML().
//
// When Init fails New makes no other NVML call and returns an error wrapping
// both ErrNVMLUnavailable and the nvml.Return (errors.Is works with either).
// When Init succeeds but the inventory cannot be read, New shuts NVML down
// again and returns the inventory error. A nil log discards log output.
func New(lib nvml.Interface, log *slog.Logger) (*Host, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, initError(ret)
	}
	h := &Host{lib: lib, log: log, stop: make(chan struct{}), saved: map[int]nvml.ComputeMode{}}
	if err := h.readInventory(); err != nil {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("gpu: nvml shutdown: %w", ret))
		}
		return nil, err
	}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		h.driver = v
	} else {
		log.Warn("NVML reports no driver version", "err", nvmlErr(ret))
	}
	switch v, ret := lib.SystemGetCudaDriverVersion(); {
	case ret != nvml.SUCCESS:
		log.Warn("NVML reports no CUDA driver version", "err", nvmlErr(ret))
	case v > 0:
		for i := range h.devs {
			h.devs[i].info.CUDADriverVersion = v
		}
	}
	for _, d := range h.devs {
		log.Debug("gpu found", "index", d.info.Index, "uuid", d.info.UUID, "name", d.info.Name,
			"memory_bytes", d.info.MemoryTotalBytes, "compute_capability", d.info.ComputeCapability.String(),
			"mig", d.info.MIGMode.String(), "compute_mode", h.modes[d.info.Index].String())
	}
	return h, nil
}

// initError explains a failed Init to an operator. The message must not need
// NVML: after a failed Init nothing of the library may be called.
func initError(ret nvml.Return) error {
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		return fmt.Errorf("%w: NVML not found (%w): is the NVIDIA driver installed? use --simulate to run without GPUs",
			ErrNVMLUnavailable, ret)
	}
	return fmt.Errorf("%w: NVML init failed (%w): is the NVIDIA driver installed and loaded, and may this user open /dev/nvidia*? use --simulate to run without GPUs",
		ErrNVMLUnavailable, ret)
}

// nvmlErr turns a failed Return into an error; a lost GPU also matches
// ErrGPULost so callers need not know NVML's codes.
func nvmlErr(ret nvml.Return) error {
	if ret == nvml.ERROR_GPU_IS_LOST {
		return fmt.Errorf("%w (%w)", ErrGPULost, ret)
	}
	return ret
}

// optional sorts an NVML answer for a field that may be missing: ok when
// there is a value, a nil error when the GPU merely does not support it.
func optional(ret nvml.Return) (ok bool, err error) {
	switch ret {
	case nvml.SUCCESS:
		return true, nil
	case nvml.ERROR_NOT_SUPPORTED:
		return false, nil
	}
	return false, nvmlErr(ret)
}

// DriverVersion is the NVIDIA driver's version as NVML reported it when
// the Host was made ("580.159.04"), or "" when NVML could not say. The
// driver decides what its MPS offers.
func (h *Host) DriverVersion() string { return h.driver }

func (h *Host) readInventory() error {
	n, ret := h.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: count devices: %w", nvmlErr(ret))
	}
	if n == 0 {
		h.log.Warn("NVML reports no GPUs on this host")
	}
	h.devs = make([]device, 0, n)
	h.modes = make([]ComputeMode, 0, n)
	for i := range n {
		d, mode, err := h.readDevice(i)
		if err != nil {
			return err
		}
		h.devs = append(h.devs, d)
		h.modes = append(h.modes, mode)
	}
	return nil
}

// readDevice fails only when the GPU cannot be identified: without a UUID
// nothing can name it. Other facts are best effort and logged when missing,
// so one sick GPU does not keep mpsd from using the healthy ones.
func (h *Host) readDevice(i int) (device, ComputeMode, error) {
	handle, ret := h.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return device{}, 0, fmt.Errorf("gpu: handle of GPU %d: %w", i, nvmlErr(ret))
	}
	uuid, ret := handle.GetUUID()
	if ret != nvml.SUCCESS {
		return device{}, 0, fmt.Errorf("gpu: UUID of GPU %d: %w", i, nvmlErr(ret))
	}
	info := Info{Index: i, UUID: uuid}
	log := h.log.With("index", i, "uuid", uuid)
	missing := func(what string, err error) {
		if err != nil {
			log.Warn("cannot read GPU property", "property", what, "err", err)
		}
	}

	name, ret := handle.GetName()
	if ok, err := optional(ret); ok {
		info.Name = name
	} else {
		missing("name", err)
	}
	mem, ret := handle.GetMemoryInfo()
	if ok, err := optional(ret); ok {
		info.MemoryTotalBytes = mem.Total
	} else {
		missing("memory", err)
	}
	major, minor, ret := handle.GetCudaComputeCapability()
	if ok, err := optional(ret); ok {
		info.ComputeCapability = ComputeCapability{Major: major, Minor: minor}
	} else {
		missing("compute capability", err)
	}
	cur, _, ret := handle.GetMigMode()
	if ok, err := optional(ret); ok {
		info.MIGMode = MIGDisabled
		if cur == nvml.DEVICE_MIG_ENABLE {
			info.MIGMode = MIGEnabled
		}
	} else {
		missing("MIG mode", err)
	}
	mode := ComputeModeUnknown
	cm, ret := handle.GetComputeMode()
	if ok, err := optional(ret); ok {
		mode = computeModeFromNVML(cm)
	} else {
		missing("compute mode", err)
	}
	return device{handle: handle, info: info}, mode, nil
}

// acquire guards an NVML call against a concurrent Close; release ends it.
func (h *Host) acquire() error {
	h.mu.RLock()
	if h.closed {
		h.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (h *Host) release() { h.mu.RUnlock() }

// GPUs returns the inventory in index order. It makes no NVML call and keeps
// answering after Close.
func (h *Host) GPUs() []Info {
	h.modeMu.Lock()
	defer h.modeMu.Unlock()
	out := make([]Info, len(h.devs))
	for i, d := range h.devs {
		out[i] = d.info
		out[i].ComputeMode = h.modes[i]
	}
	return out
}

// Select resolves device selectors (see Select) against this host's GPUs.
func (h *Host) Select(selectors []string) ([]Info, error) {
	return Select(h.GPUs(), selectors)
}

func (h *Host) device(index int) (device, error) {
	if index < 0 || index >= len(h.devs) {
		return device{}, fmt.Errorf("%w: index %d (host has %d GPUs)", ErrUnknownGPU, index, len(h.devs))
	}
	return h.devs[index], nil
}

// Close stops running Xid watchers, restores every compute mode this Host
// changed, and shuts NVML down, exactly once. Later calls return nil and do
// nothing; other methods then return ErrClosed. The error joins the restore
// and shutdown failures; NVML is shut down even when a restore failed.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.stop)
	h.mu.Unlock()
	// Watchers make NVML calls outside mu; they must be gone (their event
	// sets freed) before Shutdown unloads the library under them.
	h.watchers.Wait()

	err := h.restoreComputeModes()
	if ret := h.lib.Shutdown(); ret != nvml.SUCCESS {
		err = errors.Join(err, fmt.Errorf("gpu: nvml shutdown: %w", ret))
	}
	return err
}
