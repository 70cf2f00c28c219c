package simhost

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/mps"
)

// The emulator's programs take the place of NVIDIA's: its control
// program, its directory first on PATH, the emulator's knobs of this
// process's environment and the Xid socket added; nothing else of base
// changes, and base itself is left as it was.
func TestMPS(t *testing.T) {
	t.Setenv("MPSEMU_DRIVER", "535")
	base := mps.Config{ControlPath: "/usr/bin/nvidia-cuda-mps-control", Env: []string{"PATH=/usr/bin:/bin", "LANG=C"}, Multiuser: true}
	baseEnv := slices.Clone(base.Env)
	got := MPS(base, "/opt/emu", "/var/lib/mpsd", "570.172.08")
	if got.ControlPath != "/opt/emu/"+mps.DefaultControl {
		t.Errorf("ControlPath %q", got.ControlPath)
	}
	want := []string{"PATH=/opt/emu:/usr/bin:/bin", "LANG=C", "MPSEMU_DRIVER=535", gpu.EnvDriverVersion + "=570.172.08", gpu.EnvXidSocket + "=" + filepath.Join("/var/lib/mpsd", "sim-xid.sock")}
	for _, kv := range want {
		if !slices.Contains(got.Env, kv) {
			t.Errorf("Env %q lacks %q", got.Env, kv)
		}
	}
	if got.Env[0] != want[0] {
		t.Errorf("Env %q, want PATH first", got.Env)
	}
	for _, kv := range got.Env {
		if !slices.Contains(want, kv) && !strings.HasPrefix(kv, "MPSEMU_") {
			t.Errorf("Env has %q, neither base's nor the emulator's", kv)
		}
	}
	if got.Env[len(got.Env)-1] != want[len(want)-1] {
		t.Errorf("Env %q: the Xid socket is not last, so an inherited %s would win", got.Env, gpu.EnvXidSocket)
	}
	if !got.Multiuser {
		t.Error("the rest of base is lost")
	}
	if !slices.Equal(base.Env, baseEnv) {
		t.Errorf("base's Env changed to %q", base.Env)
	}
	if XidSocket("/s") != "/s/sim-xid.sock" {
		t.Errorf("XidSocket = %q", XidSocket("/s"))
	}
}
