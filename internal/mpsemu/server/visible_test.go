package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/mpsemu/client"
	"github.com/mpsd/mpsd/internal/mpsemu/cstr"
	"github.com/mpsd/mpsd/internal/mpsemu/server"
)

// TestClientVisibleDevices: a client sees the server's devices its
// CUDA_VISIBLE_DEVICES selects (UUIDs, unique UUID prefixes, or the
// server's own indexes 0..n-1), in that order, and its pinned limits are
// relative to them: an entry for a device it does not see drops them all
// (NVIDIA's documented fall-open), so it may allocate up to its server's
// limit.
func TestClientVisibleDevices(t *testing.T) {
	cfg := testConfig(t)
	cfg.Pinned = []uint64{20 * cstr.GiB, 20 * cstr.GiB}
	startServer(t, cfg)
	a, b := cfg.Devices[0], cfg.Devices[1]
	for i, tc := range []struct {
		name, visible string
		unset         bool
		pinned        string
		alloc         uint64
		device        int
		line          string // in the limits line
		code          int
	}{
		{name: "unset: every device", unset: true, pinned: "0=1G,1=2G", line: "devices=2 mem0=1024M mem1=2048M"},
		{name: "by UUID, reordered", visible: b + "," + a, pinned: "0=1G,1=2G", line: "devices=2 mem0=1024M mem1=2048M"},
		{name: "the second device only", visible: b, pinned: "0=1G", alloc: 2 * cstr.GiB, line: "devices=1 mem0=1024M", code: client.ErrMemoryAllocation},
		{name: "a UUID prefix", visible: "GPU-bbbb", pinned: "0=1G", line: "devices=1 mem0=1024M"},
		{name: "the server's index", visible: "1", pinned: "GPU-bbbbbbbb-0000-4000-8000-000000000001=3G", line: "devices=1 mem0=3072M"},
		{name: "an entry for an invisible device falls open", visible: b, pinned: "0=1G,1=1G", alloc: 2 * cstr.GiB, line: "devices=1 mem0=20480M"},
		{name: "an invisible UUID falls open", visible: b, pinned: "0=1G," + a + "=1G", alloc: 2 * cstr.GiB, line: "devices=1 mem0=20480M"},
		{name: "the list ends at a device not there", visible: b + ",GPU-cc," + a, pinned: "0=1G", line: "devices=1 mem0=1024M"},
		{name: "a host index past the server's", visible: "2", code: client.ErrNoDevice},
		{name: "empty selects none", visible: "", code: client.ErrNoDevice},
		{name: "--device past what it sees", visible: a, alloc: cstr.GiB, device: 1, line: "devices=1", code: client.ErrInvalidDevice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			err := client.Run(context.Background(), client.Options{PipeDir: cfg.PipeDir, PID: 900 + i,
				EnvVisible: tc.visible, HasVisible: !tc.unset, EnvPinned: tc.pinned, Alloc: tc.alloc, AllocDevice: tc.device}, &out)
			var ce *client.Error
			switch {
			case tc.code == 0 && err != nil:
				t.Fatalf("Run: %v", err)
			case tc.code != 0 && (!errors.As(err, &ce) || ce.Code != tc.code):
				t.Fatalf("Run = %v; want CUDA error %d", err, tc.code)
			}
			if !strings.Contains(out.String(), tc.line) {
				t.Errorf("output %q lacks %q", out.String(), tc.line)
			}
		})
	}
}

// FuzzClientDevices: never a panic; what a client sees is distinct
// devices of the server, at most one per entry.
func FuzzClientDevices(f *testing.F) {
	for _, s := range []string{"", "0,1", "GPU-a", "GPU-", "1,0,1", "MIG-x,0", ",,", "-1"} {
		f.Add(s, true)
	}
	devices := []string{"GPU-aa", "GPU-ab"}
	f.Fuzz(func(t *testing.T, env string, has bool) {
		got := server.ClientDevices(env, has, devices)
		if has && len(got) > len(strings.Split(env, ",")) {
			t.Fatalf("%q gives %d devices", env, len(got))
		}
		seen := map[int]bool{}
		for _, d := range got {
			if d < 0 || d >= len(devices) || seen[d] {
				t.Fatalf("%q gives %v", env, got)
			}
			seen[d] = true
		}
	})
}
