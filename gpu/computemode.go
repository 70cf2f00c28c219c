package gpu

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SetExclusive puts the GPUs with the given indexes into EXCLUSIVE_PROCESS
// compute mode, so only one process (the MPS server) can open a context on
// them. For every GPU it actually changes it remembers the mode it found, the
// first time only, so RestoreComputeModes and Close put back the operator's
// mode and not an intermediate one. GPUs already exclusive are left alone and
// are not restored later.
//
// All indexes are checked before any GPU is touched. A GPU that fails does not
// stop the others; the joined errors name each GPU that failed.
func (h *Host) SetExclusive(indexes []int) error {
	devs := make([]device, 0, len(indexes))
	for _, i := range indexes {
		d, err := h.device(i)
		if err != nil {
			return fmt.Errorf("gpu: set exclusive compute mode: %w", err)
		}
		devs = append(devs, d)
	}
	if err := h.acquire(); err != nil {
		return err
	}
	defer h.release()
	h.modeMu.Lock()
	defer h.modeMu.Unlock()

	var errs []error
	for _, d := range devs {
		if err := h.setExclusiveLocked(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (h *Host) setExclusiveLocked(d device) error {
	i := d.info.Index
	cur, ret := d.handle.GetComputeMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: read compute mode of GPU %d (%s): %w", i, d.info.UUID, nvmlErr(ret))
	}
	h.modes[i] = computeModeFromNVML(cur)
	if cur == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		return nil
	}
	if ret := d.handle.SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: set compute mode of GPU %d (%s) to exclusive_process: %w", i, d.info.UUID, nvmlErr(ret))
	}
	if _, ok := h.saved[i]; !ok {
		h.saved[i] = cur
	}
	h.modes[i] = ComputeModeExclusiveProcess
	h.log.Info("compute mode set", "index", i, "uuid", d.info.UUID,
		"from", computeModeFromNVML(h.saved[i]).String(), "to", ComputeModeExclusiveProcess.String())
	return nil
}

// RestoreComputeModes puts back the compute mode of every GPU SetExclusive
// changed. It is idempotent: a restored GPU is forgotten, so a second call
// does nothing, while a GPU that failed stays remembered for the next call
// (Close makes one). The joined errors name each GPU that failed.
func (h *Host) RestoreComputeModes() error {
	if err := h.acquire(); err != nil {
		return err
	}
	defer h.release()
	return h.restoreComputeModes()
}

// restoreComputeModes is RestoreComputeModes without the closed check, for
// Close, which runs it after marking the Host closed and before Shutdown.
func (h *Host) restoreComputeModes() error {
	h.modeMu.Lock()
	defer h.modeMu.Unlock()
	indexes := make([]int, 0, len(h.saved))
	for i := range h.saved {
		indexes = append(indexes, i)
	}
	slices.Sort(indexes)
	var errs []error
	for _, i := range indexes {
		d, mode := h.devs[i], h.saved[i]
		if ret := d.handle.SetComputeMode(mode); ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("gpu: restore compute mode of GPU %d (%s) to %s: %w",
				i, d.info.UUID, computeModeFromNVML(mode), nvmlErr(ret)))
			continue
		}
		delete(h.saved, i)
		h.modes[i] = computeModeFromNVML(mode)
		h.log.Info("compute mode restored", "index", i, "uuid", d.info.UUID, "to", h.modes[i].String())
	}
	return errors.Join(errs...)
}
