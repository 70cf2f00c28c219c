package launcher

import (
	"os"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

// TestRunSkewWarning: mps-launch warns, once, through an mpsd restart,
// when mpsd serves a lower API level than the session needs; never when
// it serves that level or a later one, nor when an mpsd from before
// levels serves all the session uses.
func TestRunSkewWarning(t *testing.T) {
	warning := "mps-launch: warning: mpsd v1.2.3 serves API level 2, but mps-launch " + buildinfo.Read().Version +
		" needs level 3 for this: upgrade mpsd, or use the mps-launch of mpsd's release\n"
	for _, tc := range []struct {
		name           string
		level, version string // the fake's headers ("": none)
		need           int    // 0: the request's own level
		stderr         string
	}{
		{"mpsd from before levels, request of the base level", "", "", 0, ""},
		{"same level", "2", "v1.2.3", 2, ""},
		{"newer mpsd", "5", "v2.0.0", 3, ""},
		{"older mpsd", "2", "v1.2.3", 3, warning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.fake.Serves(tc.level, tc.version)
			h.cfg.apiLevel = tc.need
			stdinR, stdinW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdinR.Close()
			defer stdinW.Close()
			h.cfg.Stdin = stdinR
			done := h.start(t.Context(), h.sh(`read line; exit 4`)...)
			lc := h.fake.NextLease(t)
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			h.fake.NextAttach(t)
			lc.End() // mpsd restarts: the same build answers the resume

			again := h.fake.NextLease(t)
			again.MustSend(t, apitest.Granted(api.LeaseRequest{SM: 25}, "lease-1", 1))
			if _, err := stdinW.WriteString("go\n"); err != nil {
				t.Fatal(err)
			}
			if code := h.wait(done); code != 4 {
				t.Errorf("exit %d, want 4", code)
			}
			if got := h.read("stderr"); got != tc.stderr {
				t.Errorf("stderr %q, want %q", got, tc.stderr)
			}
		})
	}
}

func TestRequestLevel(t *testing.T) {
	full := api.LeaseRequest{SM: 30, MemBytes: 1 << 30, GPUs: 1, Group: "g", Procs: 2, JobID: "42", GPUSelect: []string{"0"}, AttachPID: 1}
	for _, req := range []api.LeaseRequest{{}, full} {
		if got := requestLevel(req); got < api.LevelBase || got > api.APILevel {
			t.Errorf("requestLevel(%+v) = %d, outside %d-%d", req, got, api.LevelBase, api.APILevel)
		}
	}
}
