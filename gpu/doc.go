// Package gpu owns the host's GPUs as mpsd sees them, through go-nvml's
// nvml.Interface: inventory and device selectors, live usage, Xid health
// events and compute-mode handling, plus a simulated host built on go-nvml's
// mock GPUs for tests and mpsd --simulate.
//
// A Host is built by New from any nvml.Interface: nvml.New() on a real host,
// Sim.NVML() for a simulated one. The Host never knows which it has; the
// simulated host only differs below the nvml.Interface line, so every code
// path above it (inventory, usage, the Xid event set, compute mode) is the one
// production runs.
//
// NVML safety: New calls Init first and, when Init fails, makes no other NVML
// call at all (a call into an unloaded libnvidia-ml kills the process); it
// returns an error wrapping ErrNVMLUnavailable that tells the operator what to
// do. Close restores compute modes, stops the Xid watchers and then calls
// Shutdown exactly once; afterwards every method returns ErrClosed without
// touching NVML.
//
// Answers NVML does not support (ERROR_NOT_SUPPORTED) are never fatal: the
// field they would fill is left absent. Xid events are classified as
// application-level (only the faulting process is affected) or device-level
// (the whole GPU is); unknown Xids are treated as device-level.
//
// The package never decides policy (which group may use which GPU, whether a
// fault requeues leases), never starts processes, never touches cgroups or
// MPS, and never changes a GPU setting except the compute mode it is asked to
// set, which it remembers and restores. Selectors and Xid classification are
// pure functions; only Host logs, through the *slog.Logger it is given.
package gpu
