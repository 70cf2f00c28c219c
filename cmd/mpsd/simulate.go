package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/simhost"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/mpsd"
	"github.com/mpsd/mpsd/policy"
)

// simulation makes opts run on simulated GPUs with the MPS emulator's
// programs instead of NVIDIA's (--simulate), as the config's simulate
// section describes them: the GPUs' number and model, and where the
// emulator is (simulate.emulator_dir, next to the mpsd binary or in
// bin/emu). The daemon sees an NVML library, an MPS configuration, the
// Xid report socket run beside it and an Xid injector; nothing else of
// it knows it is simulated.
func simulation(opts *mpsd.Options, log *slog.Logger) error {
	// The simulate section decides the GPUs, which the daemon's full
	// check of the config needs: read the file once without them first.
	pre, err := policy.LoadFile(opts.ConfigPath, policy.Host{Users: opts.Users})
	if err != nil {
		return fmt.Errorf("%w: %w", mpsd.ErrConfig, err)
	}
	sim, err := gpu.NewSim(gpu.SimSpec{GPUs: pre.Simulate.GPUs, Model: pre.Simulate.Model})
	if err != nil {
		return fmt.Errorf("%w: simulate: %w", mpsd.ErrConfig, err)
	}
	opts.NVML = sim.NVML()
	opts.XidInjector = sim
	opts.MPS = func(base mps.Config, l mpsd.Layout) (mps.Config, error) {
		dir, err := emulatorDir(pre.Simulate.EmulatorDir)
		if err != nil {
			return mps.Config{}, err
		}
		return simhost.MPS(base, dir, l.StateDir, sim.DriverVersion()), nil
	}
	opts.Beside = func(l mpsd.Layout) (func(), error) {
		return simhost.ServeXidReports(sim, l.StateDir, log.With("component", "sim"))
	}
	return nil
}

// emulatorDir finds the emulator's programs: the configured directory,
// else next to the mpsd binary (or in its emu/ subdirectory, as make
// build lays them out), else bin/emu under the working directory.
func emulatorDir(configured string) (string, error) {
	var tried []string
	has := func(dir string) bool {
		tried = append(tried, dir)
		st, err := os.Stat(filepath.Join(dir, mps.DefaultControl))
		return err == nil && !st.IsDir()
	}
	if configured != "" {
		if has(configured) {
			return filepath.Abs(configured)
		}
		return "", fmt.Errorf("%w: simulate.emulator_dir %s has no %s", mpsd.ErrConfig, configured, mps.DefaultControl)
	}
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		for _, c := range []string{dir, filepath.Join(dir, "emu")} {
			if has(c) {
				return c, nil
			}
		}
	}
	if has("bin/emu") {
		return filepath.Abs("bin/emu")
	}
	return "", fmt.Errorf("%w: no MPS emulator found for --simulate (looked in %s); run make build or set simulate.emulator_dir", mpsd.ErrConfig, strings.Join(tried, ", "))
}
