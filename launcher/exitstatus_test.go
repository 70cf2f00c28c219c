package launcher

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

// The release tells mpsd how the command ended, for its history: its exit
// status, and the signal's name when one killed it.
func TestReleaseSendsExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name, script, body string
	}{
		{"success", `exit 0`, `{"attempt":1,"exit_status":0}`},
		{"failure", `exit 7`, `{"attempt":1,"exit_status":7}`},
		{"signal", `kill -KILL $$`, `{"attempt":1,"exit_status":137,"signal":"SIGKILL"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.cfg.RevokeGrace = 20 * time.Millisecond
			h.fake.Answer("POST", api.ReleasePath("lease-1"), apitest.Answer{Status: 200, Body: "{}\n"})
			done := h.start(t.Context(), h.sh(tc.script)...)
			lc := h.fake.NextLease(t)
			lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
			h.fake.NextAttach(t)
			h.wait(done)
			var bodies []string
			for _, r := range h.fake.Requests() {
				if r.Path == api.ReleasePath("lease-1") {
					bodies = append(bodies, r.Body)
				}
			}
			if len(bodies) != 1 || bodies[0] != tc.body {
				t.Errorf("releases %q; want one, %s", bodies, tc.body)
			}
		})
	}
}

// An mpsd older than the exit status refuses the field: the launcher asks
// again without it, the attempt kept.
func TestReleaseToMpsdWithoutExitStatus(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.RevokeGrace = 20 * time.Millisecond
	refusal := fmt.Sprintf(`{"code":%q,"message":"release request: json: unknown field \"exit_status\""}`+"\n", api.CodeBadRequest)
	h.fake.Answer("POST", api.ReleasePath("lease-1"), apitest.Answer{Status: http.StatusBadRequest, Body: refusal})
	done := h.start(t.Context(), h.sh(`exit 3`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	h.fake.NextAttach(t)
	if code := h.wait(done); code != 3 {
		t.Errorf("exit %d, want the command's 3", code)
	}
	var bodies []string
	for _, r := range h.fake.Requests() {
		if r.Path == api.ReleasePath("lease-1") {
			bodies = append(bodies, r.Body)
		}
	}
	// Each ask is the pair (the fake, unlike an older mpsd, refuses the
	// second too, so the release is asked for again at the exit).
	want := [2]string{`{"attempt":1,"exit_status":3}`, `{"attempt":1}`}
	for i, b := range bodies {
		if b != want[i%2] {
			t.Errorf("release %d: %s; want %s", i+1, b, want[i%2])
		}
	}
	if len(bodies) < 2 {
		t.Errorf("releases %q; want the status refused, then asked without it", bodies)
	}
}
