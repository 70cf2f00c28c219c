package mps

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// TestServerCaps: a running server's caps read and set in one call of the
// control program each, on a server of two devices of which one has no
// limit (the daemon answers nothing for it: read per device), and what
// the daemon reports of a limit of 1 GiB or more (whole GiB, floored).
// Only the emulator has a ready server.
func TestServerCaps(t *testing.T) {
	for _, gen := range emutest.Generations {
		t.Run("emu-"+gen, func(t *testing.T) {
			t.Parallel()
			cfg := newConfig(t, emuBackend(t, gen))
			cfg.VisibleDevices = []string{"GPU-00000000-0000-4000-8000-0000000000a0", "GPU-00000000-0000-4000-8000-0000000000a1"}
			cfg.DefaultThreadPercentage = 50
			cfg.DefaultPinnedMem = map[int]int64{0: 4 << 30}
			in := start(t, cfg)
			d := in.d
			ctx := testCtx(t, 20*time.Second)
			runClient(t, d, "--duration", "1m")
			server := in.waitEvent(t, "server started", kind(ServerStarted)).PID
			in.waitEvent(t, "server ready", kindPID(ServerReady, server))

			caps, err := d.ServerCaps(ctx, server, 2)
			if err != nil || caps.ThreadPercentage != 50 || !slices.Equal(caps.PinnedMem, []int64{4 << 30, 0}) {
				t.Errorf("ServerCaps = %+v, %v; want 50%%, [4 GiB, none]", caps, err)
			}
			caps, err = d.SetServerCaps(ctx, server, 30, []int64{3 << 30, 1536 << 20})
			if err != nil || caps.ThreadPercentage != 30 || !slices.Equal(caps.PinnedMem, []int64{3 << 30, 1 << 30}) {
				t.Errorf("SetServerCaps = %+v, %v; want 30%%, [3 GiB, 1 GiB as reported of 1536 MiB]", caps, err)
			}
			if caps, err := d.ServerCaps(ctx, server, 2); err != nil || caps.ThreadPercentage != 30 {
				t.Errorf("ServerCaps after set = %+v, %v", caps, err)
			}
			if _, err := d.ServerCaps(ctx, 1, 2); !errors.Is(err, ErrServerNotFound) {
				t.Errorf("ServerCaps of no server: %v; want ErrServerNotFound", err)
			}
			if _, err := d.SetServerCaps(ctx, 1, 30, []int64{1 << 30}); !errors.Is(err, ErrServerNotFound) {
				t.Errorf("SetServerCaps of no server: %v; want ErrServerNotFound", err)
			}
			for _, bad := range []struct {
				p   float64
				mem []int64
			}{{0, []int64{1 << 30}}, {101, []int64{1 << 30}}, {30, nil}, {30, []int64{1000}}} {
				if _, err := d.SetServerCaps(ctx, server, bad.p, bad.mem); !errors.Is(err, ErrInvalidValue) {
					t.Errorf("SetServerCaps(%v, %v): %v; want ErrInvalidValue", bad.p, bad.mem, err)
				}
			}
		})
	}
}

func TestReportedPinnedMem(t *testing.T) {
	for _, tc := range [][2]int64{{512 << 20, 512 << 20}, {512<<20 + 5, 512 << 20}, {1 << 30, 1 << 30}, {1536 << 20, 1 << 30}, {20 << 30, 20 << 30}} {
		if got := ReportedPinnedMem(tc[0]); got != tc[1] {
			t.Errorf("ReportedPinnedMem(%d) = %d, want %d", tc[0], got, tc[1])
		}
	}
}
