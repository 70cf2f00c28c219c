package mpsd

import (
	"strconv"

	"github.com/mpsd/mpsd/policy"
)

// clientPriorityFrom is the oldest driver whose MPS takes
// CUDA_MPS_CLIENT_PRIORITY: every generation the project knows, from 535
// on (their control daemons take set_default_client_priority and their
// manual pages document the variable); what older ones do is not known,
// so they are not given it.
const clientPriorityFrom = 535

// clientPriority is the CUDA_MPS_CLIENT_PRIORITY of a lease of a group
// whose priority is prio, on the driver of version driver: MPS knows two
// levels, so a group below 0 gets 1 (below normal) and any other 0
// (normal). ok is false where the driver's MPS has no client priority (or
// the driver is unknown): the variable is then not set. Either way it is
// a scheduling hint to the GPU, not a share.
func clientPriority(driver string, prio int) (string, bool) {
	if policy.DriverMajor(driver) < clientPriorityFrom {
		return "", false
	}
	if prio < 0 {
		return "1", true
	}
	return "0", true
}

// mpsVersionFrom is the oldest driver whose MPS control binary states its
// version (a 580 daemon logs "CUDA MPS Control binary version: 13000" as it
// starts, docs/gpu-probe); older ones state none, so none is shown.
const mpsVersionFrom = 580

// versionsLocked is what status shows of the instance's driver and MPS
// versions (api.InstanceStatus.DriverVersion, MPSVersion), and
// mpsd_mps_info: both from NVML, which no tenant writes. The MPS version
// is the CUDA version of the driver (nvmlSystemGetCudaDriverVersion): the
// control binary ships with the driver and is of its CUDA version (580.159.04:
// NVML's CUDA 13.0, the binary's 13000). It is never read from control.log:
// any member can write a version line into the log FIFO in the daemon's
// name (and before 580, where the daemon writes none, theirs would be the
// only one).
func (in *instance) versionsLocked() (driver, mpsVersion string) {
	cuda := 0
	if len(in.gpus) > 0 {
		cuda = in.gpus[0].CUDADriverVersion
	}
	return in.driver, mpsVersionOf(in.driver, cuda)
}

// mpsVersionOf is the MPS control binary version shown for a driver of
// version driver whose NVML reports CUDA version cuda: "" before
// mpsVersionFrom or when either is unknown.
func mpsVersionOf(driver string, cuda int) string {
	if cuda <= 0 || policy.DriverMajor(driver) < mpsVersionFrom {
		return ""
	}
	return strconv.Itoa(cuda)
}
