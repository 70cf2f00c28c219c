// Package simhost is how mpsd runs without GPUs, for `mpsd --simulate`
// and mpsd's own tests: simulated GPUs (gpu.Sim) stand in for NVML, and
// the MPS emulator's programs (internal/mpsemu) for NVIDIA's. It makes
// the pieces; cmd/mpsd (or a test) hands them to mpsd.New, which knows
// them only as an NVML library, an MPS configuration, a service run
// beside it and an Xid injector. Package mpsd never imports it
// (internal/archtest).
package simhost

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/mps"
)

// XidSocket is where the simulated GPUs hear the emulated control
// daemons' Xid reports: in mpsd's state directory, which only root may
// enter, under a name the next mpsd uses too (the daemons it adopts keep
// the socket they were started with).
func XidSocket(stateDir string) string { return filepath.Join(stateDir, "sim-xid.sock") }

// ProcsFile is where the simulated GPUs keep the MPS process table the
// emulated daemons reported (gpu.Sim.KeepMPSProcs), in mpsd's state
// directory beside XidSocket.
func ProcsFile(stateDir string) string { return filepath.Join(stateDir, "sim-procs.json") }

// MPS is base, mpsd's MPS configuration (its Env starting with PATH),
// changed to run the emulator's programs in emulatorDir. Simulation only
// changes where the programs are found: the emulator's control program,
// and its directory first on the daemons' PATH, so the control daemon
// starts the emulated server exactly as NVIDIA's starts the real one. The
// emulator's knobs (MPSEMU_* of this process's environment) and the Xid
// socket under stateDir are added to the daemons' environment, and the
// simulated driver's version, so the emulated daemons behave as that
// driver's do (an MPSEMU_DRIVER passed through still overrides it).
func MPS(base mps.Config, emulatorDir, stateDir, driverVersion string) mps.Config {
	c := base
	c.ControlPath = filepath.Join(emulatorDir, mps.DefaultControl)
	c.Env = make([]string, 0, len(base.Env)+2)
	for _, kv := range base.Env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			kv = "PATH=" + emulatorDir + ":" + path
		}
		c.Env = append(c.Env, kv)
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "MPSEMU_") {
			c.Env = append(c.Env, kv)
		}
	}
	if driverVersion != "" {
		c.Env = append(c.Env, gpu.EnvDriverVersion+"="+driverVersion)
	}
	c.Env = append(c.Env, gpu.EnvXidSocket+"="+XidSocket(stateDir))
	return c
}

// ServeXidReports serves sim's Xid socket under stateDir (see XidSocket
// and gpu.Sim.ServeXidReports) until stop: the emulated daemons report
// their clients' faults there as the driver reports Xids. mpsd's
// root-only state directory keeps the socket from tenants
// (ServeXidReports also checks the uid).
func ServeXidReports(sim *gpu.Sim, stateDir string, log *slog.Logger) (stop func(), err error) {
	// What the emulated daemons reported of their servers' clients is
	// kept beside the socket, so that the next mpsd's simulated GPUs know
	// the clients a real driver would still list.
	if err := sim.KeepMPSProcs(ProcsFile(stateDir)); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	stop, err = sim.ServeXidReports(XidSocket(stateDir), log)
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	return stop, nil
}
