package mpsd

import (
	"slices"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/policy"
)

// The control daemons get the config's program and PATH, and of mpsd's
// own environment only the locale, home and library path: the emulator's
// knobs (MPSEMU_*) reach them only when cmd/mpsd simulates (Options.MPS).
func TestMPSBaseEnvironment(t *testing.T) {
	t.Setenv("LANG", "C.UTF-8")
	t.Setenv("MPSEMU_DRIVER", "535")
	t.Setenv("MPSD_UNRELATED", "1")
	cfg := &policy.Config{MPS: policy.MPSConfig{Control: "/usr/bin/nvidia-cuda-mps-control", Path: "/usr/bin:/bin"}}
	c := mpsBase(cfg)
	if c.ControlPath != cfg.MPS.Control {
		t.Errorf("ControlPath %q, want the config's", c.ControlPath)
	}
	if len(c.Env) == 0 || c.Env[0] != "PATH=/usr/bin:/bin" || !slices.Contains(c.Env, "LANG=C.UTF-8") {
		t.Errorf("Env %q: want the config's PATH first and LANG", c.Env)
	}
	for _, kv := range c.Env {
		if strings.HasPrefix(kv, "MPSEMU_") || strings.HasPrefix(kv, "MPSD_") {
			t.Errorf("Env passes %q on", kv)
		}
	}
}
