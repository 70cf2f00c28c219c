package deviceplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDeviceNodes(t *testing.T) {
	proc, dev := filepath.Join("testdata", "proc"), filepath.Join("testdata", "dev")
	specs := func(paths ...string) []string { return paths }
	for _, tc := range []struct {
		name  string
		proc  string
		uuids []string
		want  []string
		err   string
	}{
		{"one GPU and the control nodes that exist", proc, []string{"GPU-aa11bb22-cc33-dd44-ee55-ff6600770088"},
			specs("/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"), ""},
		{"two GPUs, UUIDs matched without case", proc, []string{"gpu-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "GPU-aa11bb22-cc33-dd44-ee55-ff6600770088"},
			specs("/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"), ""},
		{"no driver (simulated GPUs)", t.TempDir(), []string{"GPU-00000000-0000-0000-0000-000000000000"}, nil, ""},
		{"a GPU the driver does not list", proc, []string{"GPU-deadbeef-0000-0000-0000-000000000000"}, nil, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := deviceNodes(tc.proc, dev, tc.uuids)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, s := range got {
				if s.HostPath != s.ContainerPath || s.Permissions != "rw" {
					t.Errorf("spec %+v: want the same path inside and rw", s)
				}
				paths = append(paths, s.HostPath)
			}
			if strings.Join(paths, " ") != strings.Join(tc.want, " ") {
				t.Errorf("device nodes %v, want %v", paths, tc.want)
			}
		})
	}
}

func TestParseGPUInformation(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "proc", "driver", "nvidia", "gpus", "gpu-18-00.0", "information"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		in    string
		uuid  string
		minor int
		ok    bool
	}{
		{"driver 570", string(b), "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", 0, true},
		{"no minor", "GPU UUID: GPU-1\n", "", 0, false},
		{"no uuid", "Device Minor: 2\n", "", 0, false},
		{"minor out of range", "GPU UUID: GPU-1\nDevice Minor: 256\n", "", 0, false},
		{"path in uuid", "GPU UUID: GPU-../x\nDevice Minor: 1\n", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uuid, minor, ok := parseGPUInformation([]byte(tc.in))
			if uuid != tc.uuid || minor != tc.minor || ok != tc.ok {
				t.Errorf("= %q, %d, %v; want %q, %d, %v", uuid, minor, ok, tc.uuid, tc.minor, tc.ok)
			}
		})
	}
}

// The driver's information file is outside input: whatever it holds, a
// GPU it yields has a UUID and a minor that make a safe device path.
func FuzzParseGPUInformation(f *testing.F) {
	f.Add([]byte("GPU UUID: \t GPU-0f1e2d3c\nDevice Minor: \t 0\n"))
	f.Add([]byte("Device Minor: 300\nGPU UUID: GPU-x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		uuid, minor, ok := parseGPUInformation(b)
		if !ok {
			return
		}
		if !strings.HasPrefix(uuid, "GPU-") || strings.ContainsAny(uuid, "/ \t") || minor < 0 || minor > 255 {
			t.Fatalf("parseGPUInformation = %q, %d", uuid, minor)
		}
	})
}

// On a host with NVIDIA's driver, every GPU it lists yields its device
// node; elsewhere the test says why it skips.
func TestDeviceNodesOnThisHost(t *testing.T) {
	infos, _ := filepath.Glob("/proc/driver/nvidia/gpus/*/information")
	if len(infos) == 0 {
		t.Skip("no NVIDIA driver on this host (/proc/driver/nvidia/gpus is empty)")
	}
	for _, f := range infos {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		uuid, minor, ok := parseGPUInformation(b)
		if !ok {
			t.Errorf("%s: no GPU UUID and device minor in:\n%s", f, b)
			continue
		}
		specs, err := deviceNodes("/proc", "/dev", []string{uuid})
		if err != nil {
			t.Fatal(err)
		}
		if len(specs) == 0 || specs[0].HostPath != fmt.Sprintf("/dev/nvidia%d", minor) {
			t.Errorf("GPU %s (minor %d): device nodes %v", uuid, minor, specs)
		}
	}
}
