package server

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/cstr"
)

func TestConfigFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}
	tests := []struct {
		name    string
		env     map[string]string
		devices int
		mem     uint64
		max     int
		sm      float64
		wantErr bool
	}{
		{"defaults", nil, 1, DefaultDeviceMemory, 48, 100, false},
		{"two GPUs by UUID", map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, 2, DefaultDeviceMemory, 48, 100, false},
		{"memory and clients", map[string]string{"MPSEMU_DEVICE_MEMORY": "80G", "MPSEMU_MAX_CLIENTS": "4"}, 1, 80 * cstr.GiB, 4, 100, false},
		{"daemon's thread percentage", map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, 1, DefaultDeviceMemory, 48, 25, false},
		{"bad memory", map[string]string{"MPSEMU_DEVICE_MEMORY": "lots"}, 0, 0, 0, 0, true},
		{"too many clients", map[string]string{"MPSEMU_MAX_CLIENTS": "49"}, 0, 0, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ConfigFromEnv(env(tt.env))
			if tt.wantErr {
				if !errors.Is(err, ErrBadConfig) {
					t.Fatalf("err = %v; want ErrBadConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Devices) != tt.devices || cfg.DeviceMemory != tt.mem || cfg.MaxClients != tt.max || cfg.SM != tt.sm {
				t.Errorf("got %d devices, %d bytes, %d clients, sm %v", len(cfg.Devices), cfg.DeviceMemory, cfg.MaxClients, cfg.SM)
			}
		})
	}
}

func TestConfigFaultReset(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want time.Duration
		bad  bool
	}{
		{"", DefaultFaultReset, false},
		{"0", 0, false},
		{"250ms", 250 * time.Millisecond, false},
		{"-1s", 0, true},
		{"soon", 0, true},
		{"2h", 0, true},
	} {
		cfg, err := ConfigFromEnv(func(k string) string {
			if k == "MPSEMU_FAULT_RESET" {
				return tc.env
			}
			return ""
		})
		if tc.bad != errors.Is(err, ErrBadConfig) || (!tc.bad && cfg.FaultReset != tc.want) {
			t.Errorf("MPSEMU_FAULT_RESET=%q: %v, %v; want %v (bad %v)", tc.env, cfg.FaultReset, err, tc.want, tc.bad)
		}
	}
}

func TestVisibleDevices(t *testing.T) {
	tests := []struct {
		name, env string
		want      []string
	}{
		{"unset", "", []string{syntheticUUID(0)}},
		{"indexes", "0,2", []string{syntheticUUID(0), syntheticUUID(2)}},
		{"uuids", "GPU-x, MIG-y", []string{"GPU-x", "MIG-y"}},
		{"stops at invalid", "1,bogus,2", []string{syntheticUUID(1)}},
		{"none", "-1", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := VisibleDevices(tt.env)
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("VisibleDevices(%q) = %q; want %q", tt.env, got, tt.want)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"8G", 8 << 30, true}, {"8GiB", 8 << 30, true}, {"512M", 512 << 20, true},
		{"1.5G", 3 << 29, true}, {"1024", 1024, true}, {"2T", 2 << 40, true}, {"4k", 4096, true},
		{"", 0, false}, {"G", 0, false}, {"-1G", 0, false}, {"1e3", 0, false}, {"0x10", 0, false}, {"lots", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("ParseSize(%q) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
			}
		})
	}
}

// FuzzClientLimits feeds CUDA_MPS_PINNED_DEVICE_MEM_LIMIT values: never a
// panic, one limit per device, and each limit is what MPS's loose parser
// gives for some value in the string.
func FuzzClientLimits(f *testing.F) {
	for _, s := range []string{"0=8G,1=512M", "GPU-a=1G", "=", ",,", "0=", "9=1G", "0=1G,0=2G", "-1=4G"} {
		f.Add(s)
	}
	devices := []string{"GPU-a", "GPU-b"}
	f.Fuzz(func(t *testing.T, env string) {
		got := ClientLimits(env, devices)
		if len(got) != len(devices) {
			t.Fatalf("%d limits for %d devices", len(got), len(devices))
		}
		for i, v := range got {
			if v == 0 {
				continue
			}
			found := false
			for _, e := range strings.Split(env, ",") {
				if _, val, ok := strings.Cut(e, "="); ok && cstr.ParsePinnedLimit(strings.TrimSpace(val)) == v {
					found = true
				}
			}
			if !found {
				t.Fatalf("device %d limit %d comes from no entry of %q", i, v, env)
			}
		}
	})
}

// FuzzParseSize: accepted sizes are non-negative and the plain-number
// form round-trips.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"8G", "8GiB", "1.5G", "512", "", "G", "1e3", "9999999999T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			return
		}
		if strings.ContainsAny(s, ".") {
			return
		}
		if w, err := ParseSize(strings.TrimSpace(strings.TrimRight(strings.ToUpper(s), "KMGTIB"))); err == nil && w > v {
			t.Fatalf("%q = %d, smaller than its number %d", s, v, w)
		}
	})
}

// FuzzVisibleDevices: CUDA_VISIBLE_DEVICES never panics and never yields
// more devices than entries.
func FuzzVisibleDevices(f *testing.F) {
	for _, s := range []string{"", "0,1", "GPU-a,MIG-b", "-1", "1,x,2", ",,,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := VisibleDevices(s)
		if s != "" && len(got) > len(strings.Split(s, ",")) {
			t.Fatalf("%q gives %d devices", s, len(got))
		}
	})
}
