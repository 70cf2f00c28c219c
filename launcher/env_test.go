package launcher

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

// TestRunLeaseEnvWins: the caller's own MPS variables (a stale pinned
// limit for two GPUs, a host index in CUDA_VISIBLE_DEVICES) never reach
// the command: it runs with the lease's, and mps-launch says what it
// ignored.
func TestRunLeaseEnvWins(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.Environ = append(h.cfg.Environ, "CUDA_VISIBLE_DEVICES=1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30G,1=30G", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25")
	done := h.start(t.Context(), h.sh(`echo "$CUDA_VISIBLE_DEVICES|$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT|$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" > env`)...)
	lc := h.fake.NextLease(t)
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if code := h.wait(done); code != 0 {
		t.Fatalf("exit %d; stderr %s", code, h.read("stderr"))
	}
	if got, want := h.read("env"), "GPU-fake-0|0=1024M|25\n"; got != want {
		t.Errorf("command environment %q, want %q", got, want)
	}
	stderr := h.read("stderr")
	for _, want := range []string{
		"mps-launch: ignoring CUDA_VISIBLE_DEVICES=1 from the environment: the lease sets CUDA_VISIBLE_DEVICES=GPU-fake-0\n",
		"mps-launch: ignoring CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30G,1=30G from the environment: the lease sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M\n",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") {
		t.Errorf("stderr warns of a caller value equal to the lease's:\n%s", stderr)
	}
	lc.WaitReleased(t)
}

// TestRunRefusesUnsafeLeaseEnv: a lease whose MPS environment would let
// the command run without its limits (a pinned limit for a device it
// cannot see, which makes MPS drop every one; no pipe directory) is
// refused: the command never runs and mps-launch exits 125 saying why.
func TestRunRefusesUnsafeLeaseEnv(t *testing.T) {
	for _, tc := range []struct {
		name, key, value, says string
	}{
		{"a device the command cannot see", api.EnvPinnedMemLimit, "0=1024M,1=1024M", "names a device the client does not see"},
		{"no pipe directory", api.EnvPipeDirectory, "", "CUDA_MPS_PIPE_DIRECTORY is unset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			done := h.start(t.Context(), h.sh("echo ran > marker")...)
			lc := h.fake.NextLease(t)
			ev := apitest.Granted(lc.Request, "lease-1", 1)
			if tc.value == "" {
				delete(ev.Lease.Env, tc.key)
			} else {
				ev.Lease.Env[tc.key] = tc.value
			}
			lc.MustSend(t, ev)
			if code := h.wait(done); code != ExitFailure {
				t.Errorf("exit %d, want %d", code, ExitFailure)
			}
			if s := h.read("stderr"); !strings.Contains(s, "lease lease-1") || !strings.Contains(s, tc.says) {
				t.Errorf("stderr %q, want it to name the lease and say %q", s, tc.says)
			}
			if _, err := os.Stat(h.path("marker")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the command ran under an unsafe environment (%v)", err)
			}
			lc.WaitReleased(t)
		})
	}
}

// TestRunDividesShareAmongProcs: with --procs 4 the command's environment
// gives each process a quarter of --sm (rounded down) and names the
// count; a lease that does not divide the share (an mpsd that ignored
// procs, a percentage above the part, none at all: each process would get
// its server's default) is refused: the command never runs, exit 125.
func TestRunDividesShareAmongProcs(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.SM, h.cfg.Procs = 30, 4
	done := h.start(t.Context(), h.sh(`echo "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|$MPSD_PROCS" > env`)...)
	lc := h.fake.NextLease(t)
	if lc.Request.Procs != 4 || lc.Request.SM != 30 {
		t.Errorf("request %+v, want sm 30 and procs 4", lc.Request)
	}
	lc.MustSend(t, apitest.Granted(lc.Request, "lease-1", 1))
	if code := h.wait(done); code != 0 {
		t.Fatalf("exit %d; stderr %s", code, h.read("stderr"))
	}
	if got, want := h.read("env"), "7|4\n"; got != want {
		t.Errorf("command environment %q, want %q", got, want)
	}
	lc.WaitReleased(t)

	for _, tc := range []struct {
		name string
		mut  func(*api.Lease)
		says string
	}{
		{"the lease is for one process", func(l *api.Lease) { l.Procs = 0; l.Env[api.EnvThreadPercentage] = "30" }, "among 1 processes, not the 4 of --procs"},
		{"the whole share for each", func(l *api.Lease) { l.Env[api.EnvThreadPercentage] = "30" }, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="30" is no percentage in (0, 7]`},
		{"no percentage", func(l *api.Lease) { delete(l.Env, api.EnvThreadPercentage) }, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is unset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.cfg.SM, h.cfg.Procs = 30, 4
			done := h.start(t.Context(), h.sh("echo ran > marker")...)
			lc := h.fake.NextLease(t)
			ev := apitest.Granted(lc.Request, "lease-1", 1)
			tc.mut(ev.Lease)
			lc.MustSend(t, ev)
			if code := h.wait(done); code != ExitFailure {
				t.Errorf("exit %d, want %d", code, ExitFailure)
			}
			if s := h.read("stderr"); !strings.Contains(s, "lease lease-1") || !strings.Contains(s, tc.says) {
				t.Errorf("stderr %q, want it to name the lease and say %q", s, tc.says)
			}
			if _, err := os.Stat(h.path("marker")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the command ran under a share it would exceed (%v)", err)
			}
			lc.WaitReleased(t)
		})
	}
}
