package gpu

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Usage is a live reading of one GPU. A nil field is one the GPU does not
// report (NVML answered NOT_SUPPORTED) or could not report this time.
type Usage struct {
	Index            int
	UUID             string
	MemoryTotalBytes uint64   // live when NVML answers, else from the inventory
	MemoryUsedBytes  *uint64  // framebuffer in use, all processes and the driver's reserve
	Utilization      *float64 // 0..1: share of the last sample period a kernel was running
	TemperatureC     *uint32  // GPU core temperature, degrees Celsius
	PowerWatts       *float64 // board power draw
	// Processes is the per-process memory of compute processes and MPS
	// clients, by PID. Nil when the GPU supports neither process list.
	Processes []ProcessMemory
}

// ProcessKind says which NVML list a process came from.
type ProcessKind int

const (
	// ProcessCompute: a process with its own CUDA context on the GPU, from
	// GetComputeRunningProcesses (an MPS server is one of these).
	ProcessCompute ProcessKind = iota + 1
	// ProcessMPSClient: a client of an MPS server, from
	// GetMPSComputeRunningProcesses.
	ProcessMPSClient
)

func (k ProcessKind) String() string {
	switch k {
	case ProcessCompute:
		return "compute"
	case ProcessMPSClient:
		return "mps_client"
	}
	return fmt.Sprintf("ProcessKind(%d)", int(k))
}

// ProcessMemory is one process's share of a GPU's memory.
type ProcessMemory struct {
	PID       int
	Kind      ProcessKind
	UsedBytes *uint64 // nil when NVML cannot attribute memory (e.g. unprivileged, some MPS setups)
}

// Usage reads the live usage of the GPU with the given index. Fields NVML
// does not support are left nil and are no error. Any other failure also
// leaves its field nil, and is returned, joined, next to the partial Usage,
// so a metrics scrape can use what was read; a lost GPU matches ErrGPULost.
func (h *Host) Usage(index int) (Usage, error) {
	d, err := h.device(index)
	if err != nil {
		return Usage{}, err
	}
	if err := h.acquire(); err != nil {
		return Usage{}, err
	}
	defer h.release()
	return readUsage(d)
}

// UsageAll reads the usage of every GPU in index order; see Usage for the
// meaning of the error.
func (h *Host) UsageAll() ([]Usage, error) {
	if err := h.acquire(); err != nil {
		return nil, err
	}
	defer h.release()
	out := make([]Usage, len(h.devs))
	var errs []error
	for i, d := range h.devs {
		var err error
		out[i], err = readUsage(d)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

func readUsage(d device) (Usage, error) {
	u := Usage{Index: d.info.Index, UUID: d.info.UUID, MemoryTotalBytes: d.info.MemoryTotalBytes}
	var errs []error
	field := func(what string, ret nvml.Return) bool {
		ok, err := optional(ret)
		if err != nil {
			errs = append(errs, fmt.Errorf("gpu: %s of GPU %d (%s): %w", what, d.info.Index, d.info.UUID, err))
		}
		return ok
	}

	if mem, ret := d.handle.GetMemoryInfo(); field("memory", ret) {
		u.MemoryTotalBytes = mem.Total
		u.MemoryUsedBytes = &mem.Used
	}
	if util, ret := d.handle.GetUtilizationRates(); field("utilization", ret) {
		r := float64(min(util.Gpu, 100)) / 100
		u.Utilization = &r
	}
	if t, ret := d.handle.GetTemperature(nvml.TEMPERATURE_GPU); field("temperature", ret) {
		u.TemperatureC = &t
	}
	if mw, ret := d.handle.GetPowerUsage(); field("power", ret) {
		w := float64(mw) / 1000
		u.PowerWatts = &w
	}

	compute, ret := d.handle.GetComputeRunningProcesses()
	haveCompute := field("compute processes", ret)
	clients, ret := d.handle.GetMPSComputeRunningProcesses()
	haveClients := field("MPS client processes", ret)
	if haveCompute || haveClients {
		u.Processes = mergeProcesses(compute, clients)
	}
	return u, errors.Join(errs...)
}

// mergeProcesses lists each PID once, sorted. A PID in both lists is taken
// as an MPS client: that is the more specific answer.
func mergeProcesses(compute, clients []nvml.ProcessInfo) []ProcessMemory {
	byPID := make(map[uint32]ProcessMemory, len(compute)+len(clients))
	add := func(list []nvml.ProcessInfo, kind ProcessKind) {
		for _, p := range list {
			pm := ProcessMemory{PID: int(p.Pid), Kind: kind}
			// NVML_VALUE_NOT_AVAILABLE (-1 as unsigned) means the driver
			// cannot attribute the memory, not that the process holds 16 EiB.
			if p.UsedGpuMemory != ^uint64(0) {
				used := p.UsedGpuMemory
				pm.UsedBytes = &used
			}
			byPID[p.Pid] = pm
		}
	}
	add(compute, ProcessCompute)
	add(clients, ProcessMPSClient)
	out := make([]ProcessMemory, 0, len(byPID))
	for _, pm := range byPID {
		out = append(out, pm)
	}
	slices.SortFunc(out, func(a, b ProcessMemory) int { return a.PID - b.PID })
	return out
}

// Processes reads only the process lists of the GPU with the given index
// (what Usage's Processes holds), for callers that look at them often:
// two NVML calls rather than Usage's six. mpsList says whether the GPU
// answered the MPS client list (GetMPSComputeRunningProcesses); procs is
// nil when it supports neither list.
func (h *Host) Processes(index int) (procs []ProcessMemory, mpsList bool, err error) {
	d, err := h.device(index)
	if err != nil {
		return nil, false, err
	}
	if err := h.acquire(); err != nil {
		return nil, false, err
	}
	defer h.release()
	compute, cret := d.handle.GetComputeRunningProcesses()
	clients, mret := d.handle.GetMPSComputeRunningProcesses()
	okC, errC := optional(cret)
	okM, errM := optional(mret)
	if errC != nil || errM != nil {
		return nil, false, errors.Join(wrapGPU(index, "compute processes", errC), wrapGPU(index, "MPS client processes", errM))
	}
	if !okC && !okM {
		return nil, false, nil
	}
	return mergeProcesses(compute, clients), okM, nil
}

func wrapGPU(index int, what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("gpu %d: %s: %w", index, what, err)
}
