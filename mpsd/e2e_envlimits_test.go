package mpsd

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsenv"
)

// A lease's limits cannot fall open through its environment. MPS drops
// every pinned memory limit of a client one of whose
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT entries names a device it cannot see
// (the emulated client does as NVIDIA documents). The offender, a client
// given such a hand-built environment on the lease's GPU, falls open to its
// server's own limit, which mpsd holds to what the lease's uid was granted
// (1 GiB): its 2 GiB allocation fails as the lease's does. The
// lease's own command, launched from a shell whose stale MPS variables
// (a host index in CUDA_VISIBLE_DEVICES, limits for two GPUs) would have
// made the same mistake, runs with the lease's environment, which names
// its one GPU by UUID and one limit for it: its 2 GiB allocation fails
// with CUDA's out-of-memory error, and mps-launch says which of the
// caller's variables it ignored.
func TestLeaseEnvCannotFallOpen(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	const offender = "0=1024M,1=1024M"
	script := `echo "env|$CUDA_VISIBLE_DEVICES|$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT|$CUDA_MPS_PIPE_DIRECTORY"
"$0" --alloc 2G; echo "lease exit $?"
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=` + offender + ` "$0" --alloc 2G; echo "offender exit $?"`
	cmd := e.launch("--sm", "20", "--mem", "1G", "--", "/bin/sh", "-c", script, client)
	cmd.Env = append(cmd.Env, "CUDA_VISIBLE_DEVICES=1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30G,1=30G")
	r := run(t, cmd)
	if r.code != 0 {
		t.Fatalf("exit %d; stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	var leaseEnv map[string]string
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Split(line, "|"); len(f) == 4 && f[0] == "env" {
			leaseEnv = map[string]string{mpsenv.VisibleDevices: f[1], mpsenv.PinnedMemLimit: f[2], mpsenv.PipeDirectory: f[3]}
		}
	}
	if leaseEnv == nil {
		t.Fatalf("the command printed no environment: %q", r.stdout)
	}
	get := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	uuid := leaseEnv[mpsenv.VisibleDevices]
	if !strings.HasPrefix(uuid, "GPU-") || strings.Contains(uuid, ",") || leaseEnv[mpsenv.PinnedMemLimit] != "0=1024M" {
		t.Errorf("the lease's environment %v; want its one GPU by UUID and 0=1024M", leaseEnv)
	}
	if err := mpsenv.Check(get(leaseEnv)); err != nil {
		t.Errorf("the lease's environment fails the check: %v", err)
	}
	bad := map[string]string{mpsenv.VisibleDevices: uuid, mpsenv.PinnedMemLimit: offender, mpsenv.PipeDirectory: leaseEnv[mpsenv.PipeDirectory]}
	if err := mpsenv.Check(get(bad)); !errors.Is(err, mpsenv.ErrFallsOpen) {
		t.Errorf("the offender's environment passes the check (%v)", err)
	}

	// The lease holds: its 2 GiB allocation is refused (the client's 12).
	if !strings.Contains(r.stdout, "lease exit 12") || !strings.Contains(r.stdout, "mem0=1024M") {
		t.Errorf("the lease's client was not held to 1 GiB:\n%s%s", r.stdout, r.stderr)
	}
	// The offender falls open to its server's limit, the lease's 1 GiB
	// (not the group's 20 GiB): its allocation is refused too.
	if !strings.Contains(r.stdout, "offender exit 12") || strings.Contains(r.stdout, "mem0=20480M") || strings.Contains(r.stdout, "allocated 2147483648 bytes") {
		t.Errorf("the offender's client was not held to its server's limit (the lease's 1 GiB):\n%s%s", r.stdout, r.stderr)
	}
	for _, want := range []string{
		"ignoring CUDA_VISIBLE_DEVICES=1 from the environment: the lease sets CUDA_VISIBLE_DEVICES=" + uuid,
		"ignoring CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30G,1=30G from the environment: the lease sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("mps-launch's stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}
