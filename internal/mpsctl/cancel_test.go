package mpsctl

import (
	"net/http"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// cancel posts one CancelRequest per lease, in order, with the signal by
// name or number and the grace only with a signal, and prints one line
// each; a refusal stops it with mpsd's message.
func TestCancel(t *testing.T) {
	running := ok(t, api.CancelResult{Lease: "l-1", Was: api.LeaseRunning, Signalled: 2})
	for _, tc := range []struct {
		name   string
		args   []string
		rep    reply
		bodies []api.CancelRequest
		code   int
		stdout string
		stderr string
	}{
		{
			name: "two leases, no signal", args: []string{"cancel", "l-1", "l-2"},
			rep:    ok(t, api.CancelResult{Lease: "l-1", Was: api.LeaseQueued}),
			bodies: []api.CancelRequest{{Lease: "l-1"}, {Lease: "l-2"}},
			stdout: "cancelled lease l-1 (was queued)\ncancelled lease l-1 (was queued)\n",
		},
		{
			name: "signal by name, grace", args: []string{"cancel", "--signal", "term", "--grace", "2s", "l-1"},
			rep: running, bodies: []api.CancelRequest{{Lease: "l-1", Signal: 15, GraceMs: 2000}},
			stdout: "cancelled lease l-1 (was running; SIGTERM reached 2 process(es), all ended within the grace)\n",
		},
		{
			name: "signal by number after the lease", args: []string{"cancel", "l-1", "--signal=2"},
			rep:    ok(t, api.CancelResult{Lease: "l-1", Was: api.LeaseRunning, Signalled: 1, Killed: true}),
			bodies: []api.CancelRequest{{Lease: "l-1", Signal: 2, GraceMs: api.DefaultCancelGrace.Milliseconds()}},
			stdout: "cancelled lease l-1 (was running; SIGINT reached 1 process(es), the rest were killed after the grace)\n",
		},
		{
			name: "refused", args: []string{"cancel", "l-9", "l-1"},
			rep:    reply{status: http.StatusForbidden, body: `{"code":"forbidden","message":"lease l-9 is not yours (only its owner or an mpsd admin may cancel it)"}`},
			bodies: []api.CancelRequest{{Lease: "l-9"}},
			code:   ExitFailure,
			stderr: "mpsctl: cancel l-9: lease l-9 is not yours (only its owner or an mpsd admin may cancel it)\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"POST " + api.PathCancel: tc.rep})
			r := mpsctl(t, Config{}, []string{api.EnvSocket + "=" + fake.socket}, tc.args...)
			if r.code != tc.code || r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
			reqs := fake.requests()
			if len(reqs) != len(tc.bodies) {
				t.Fatalf("requests %+v; want %d", reqs, len(tc.bodies))
			}
			for i, q := range reqs {
				got, err := api.DecodeCancelRequest(strings.NewReader(q.body))
				if err != nil || got != tc.bodies[i] {
					t.Errorf("request %d: %s decodes to %+v, %v; want %+v", i, q.body, got, err, tc.bodies[i])
				}
			}
		})
	}
}

func TestCancelUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cancel"}, "mpsctl: cancel: missing LEASE"},
		{[]string{"cancel", "../x"}, "mpsctl: cancel: lease id \"../x\""},
		{[]string{"cancel", "--signal", "NOPE", "l-1"}, `mpsctl: cancel: invalid value "NOPE" for flag --signal: unknown signal`},
		{[]string{"cancel", "--signal", "65", "l-1"}, `mpsctl: cancel: invalid value "65" for flag --signal: not a signal number (1-64)`},
		{[]string{"cancel", "--grace", "2h", "l-1"}, "mpsctl: cancel: --grace 2h0m0s is out of range"},
	} {
		r := mpsctl(t, Config{}, nil, tc.args...)
		if r.code != ExitUsage || !strings.HasPrefix(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
