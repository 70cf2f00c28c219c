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

// versionsLocked is what status shows of the instance's driver and MPS
// versions (api.InstanceStatus.DriverVersion, MPSVersion).
func (in *instance) versionsLocked() (driver, mpsVersion string) {
	if in.daemon != nil {
		if v := in.daemon.BinaryVersion(); v > 0 {
			mpsVersion = strconv.Itoa(v)
		}
	}
	return in.driver, mpsVersion
}
