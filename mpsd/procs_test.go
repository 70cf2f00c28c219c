package mpsd

import (
	"log/slog"
	"strconv"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/internal/mpsenv"
	"github.com/mpsd/mpsd/policy"
)

// The lease protocol's bound on procs is MPS's client limit, which policy
// holds max_clients to.
func TestMaxProcsIsMPSClientLimit(t *testing.T) {
	if api.MaxProcs != policy.MaxClientsLimit {
		t.Errorf("api.MaxProcs = %d, policy.MaxClientsLimit = %d", api.MaxProcs, policy.MaxClientsLimit)
	}
}

// A lease of several processes has its share divided among them in the
// environment its launcher gets (rounded down, so together they stay
// within it), says so in the lease and in status, and its environment
// still passes the launcher's checks.
func TestLeaseSharePerProcess(t *testing.T) {
	in := &instance{key: "a/0", gpus: []gpu.Info{{Index: 0, UUID: "GPU-0a"}, {Index: 1, UUID: "GPU-1b"}}, pipeDir: "/run/mpsd/a/GPU-0a/pipe"}
	for _, tc := range []struct {
		sm, procs int
		pct       string
	}{
		{30, 0, "30"}, {30, 1, "30"}, {30, 4, "7"}, {100, 3, "33"}, {8, 8, "1"},
	} {
		l := &lease{id: "a-000000000001", group: "a", attempt: 1, inst: in, log: slog.New(slog.DiscardHandler),
			req: policy.Request{Group: "a", SM: tc.sm, Mem: 1 << 30, GPUs: 2, Procs: tc.procs}}
		al := l.apiLeaseLocked()
		want := max(tc.procs, 1)
		if got := al.Env[api.EnvThreadPercentage]; got != tc.pct {
			t.Errorf("sm %d over %d processes: %s=%q, want %q", tc.sm, tc.procs, api.EnvThreadPercentage, got, tc.pct)
		}
		if al.Procs != want || al.SM != tc.sm || al.Env[api.EnvProcs] != strconv.Itoa(want) {
			t.Errorf("sm %d over %d processes: lease sm %d procs %d %s=%q", tc.sm, tc.procs, al.SM, al.Procs, api.EnvProcs, al.Env[api.EnvProcs])
		}
		if err := al.Validate(); err != nil {
			t.Errorf("granted lease: %v", err)
		}
		getenv := func(k string) (string, bool) { v, ok := al.Env[k]; return v, ok }
		pct, err := mpsenv.WorkerPercentage(tc.sm, want)
		if err != nil {
			t.Fatal(err)
		}
		if err := mpsenv.Check(getenv); err != nil {
			t.Errorf("environment falls open: %v", err)
		}
		if err := mpsenv.CheckShare(getenv, pct); err != nil {
			t.Errorf("environment exceeds the share: %v", err)
		}
		st := l.statusLocked()
		if st.SM != tc.sm || st.Procs != want || st.SMPerProcess != pct || st.Clients != nil {
			t.Errorf("status sm %d procs %d sm_per_process %d clients %v; want %d, %d, %d and none before a reading", st.SM, st.Procs, st.SMPerProcess, st.Clients, tc.sm, want, pct)
		}
	}
}
