package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Info is what mpsd knows about one GPU of the host. Everything but
// ComputeMode is fixed while the host runs; ComputeMode is the mode as this
// package last read or set it.
type Info struct {
	Index             int               // NVML index, the one CUDA_VISIBLE_DEVICES orders by default
	UUID              string            // GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
	Name              string            // product name, e.g. "NVIDIA A100-SXM4-40GB"
	MemoryTotalBytes  uint64            // framebuffer size as NVML reports it
	ComputeCapability ComputeCapability // CUDA compute capability
	MIGMode           MIGMode
	ComputeMode       ComputeMode
	// CUDADriverVersion is the CUDA version of the driver the GPU runs
	// under, as NVML reports it for the host (nvmlSystemGetCudaDriverVersion:
	// 13000 is CUDA 13.0); 0 when NVML cannot say. Its MPS control binary
	// is of that version.
	CUDADriverVersion int
}

// ComputeCapability is a CUDA compute capability such as 8.0.
type ComputeCapability struct {
	Major, Minor int
}

func (c ComputeCapability) String() string { return fmt.Sprintf("%d.%d", c.Major, c.Minor) }

// MIGMode is a GPU's current MIG mode.
type MIGMode int

const (
	// MIGUnsupported: the GPU has no MIG (pre-Ampere, consumer cards).
	MIGUnsupported MIGMode = iota
	MIGDisabled
	MIGEnabled
)

func (m MIGMode) String() string {
	switch m {
	case MIGUnsupported:
		return "unsupported"
	case MIGDisabled:
		return "disabled"
	case MIGEnabled:
		return "enabled"
	}
	return fmt.Sprintf("MIGMode(%d)", int(m))
}

// ComputeMode is a GPU's compute mode. MPS wants ExclusiveProcess (only the
// MPS server may then open a context) but works in Default too.
type ComputeMode int

const (
	// ComputeModeUnknown: NVML could not report the mode.
	ComputeModeUnknown ComputeMode = iota
	ComputeModeDefault
	ComputeModeExclusiveThread
	ComputeModeProhibited
	ComputeModeExclusiveProcess
)

func (m ComputeMode) String() string {
	switch m {
	case ComputeModeUnknown:
		return "unknown"
	case ComputeModeDefault:
		return "default"
	case ComputeModeExclusiveThread:
		return "exclusive_thread"
	case ComputeModeProhibited:
		return "prohibited"
	case ComputeModeExclusiveProcess:
		return "exclusive_process"
	}
	return fmt.Sprintf("ComputeMode(%d)", int(m))
}

func computeModeFromNVML(m nvml.ComputeMode) ComputeMode {
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return ComputeModeDefault
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return ComputeModeExclusiveThread
	case nvml.COMPUTEMODE_PROHIBITED:
		return ComputeModeProhibited
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return ComputeModeExclusiveProcess
	}
	return ComputeModeUnknown
}
