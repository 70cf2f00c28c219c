package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/mpsd"
)

// The emulator is found where simulate.emulator_dir says, else (not next
// to this test binary) in bin/emu under the working directory; where it
// is not, the error is a config error that says where mpsd looked.
func TestEmulatorDir(t *testing.T) {
	dir := t.TempDir()
	emu := filepath.Join(dir, "bin", "emu")
	if err := os.MkdirAll(emu, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(emu, mps.DefaultControl), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := emulatorDir(emu); err != nil || got != emu {
		t.Errorf("configured: %q, %v; want %q", got, err, emu)
	}
	if _, err := emulatorDir(dir); !errors.Is(err, mpsd.ErrConfig) || !strings.Contains(err.Error(), "simulate.emulator_dir "+dir+" has no "+mps.DefaultControl) {
		t.Errorf("configured without the programs: %v", err)
	}

	t.Chdir(dir)
	if got, err := emulatorDir(""); err != nil || got != emu {
		t.Errorf("bin/emu under the working directory: %q, %v; want %q", got, err, emu)
	}
	t.Chdir(t.TempDir())
	_, err := emulatorDir("")
	if !errors.Is(err, mpsd.ErrConfig) || !strings.Contains(err.Error(), "no MPS emulator found for --simulate (looked in ") || !strings.Contains(err.Error(), "bin/emu") {
		t.Errorf("nowhere: %v", err)
	}
}
