// Package gpu owns the host's GPUs as mpsd sees them, through go-nvml's
// nvml.Interface: inventory and device selectors, live usage, Xid health
// events and compute-mode handling, plus a simulated host built on go-nvml's
// mock GPUs for tests and mpsd --simulate.
package gpu
