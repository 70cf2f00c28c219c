package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/mpsd/mpsd/api"
)

func writeFile(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), mode); err != nil {
		t.Fatal(err)
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b, filepath.Join(a, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(a, "tool"), 0o644) // found first, not executable
	writeFile(t, filepath.Join(b, "tool"), 0o755)
	writeFile(t, filepath.Join(a, "plain"), 0o644)
	writeFile(t, filepath.Join(b, "run"), 0o755)
	t.Chdir(b)

	for _, tc := range []struct {
		name, cmd, path string
		want            string
		err             error
	}{
		{"first executable on PATH wins", "tool", a + ":" + b, filepath.Join(b, "tool"), nil},
		{"only a non-executable match", "plain", a + ":" + b, "", ErrNotExecutable},
		{"nowhere", "nope", a + ":" + b, "", ErrCommandNotFound},
		{"empty PATH", "tool", "", "", ErrCommandNotFound},
		{"empty PATH entry is the working directory", "run", a + "::", "./run", nil},
		{"dot entry", "run", ".", "./run", nil},
		{"a directory is not a command", "sub", a, "", ErrNotExecutable},
		{"absolute path", filepath.Join(b, "tool"), "", filepath.Join(b, "tool"), nil},
		{"relative path", "./run", "", "./run", nil},
		{"path not executable", filepath.Join(a, "plain"), "", "", ErrNotExecutable},
		{"path missing", filepath.Join(a, "missing"), "", "", ErrCommandNotFound},
		{"path through a file", filepath.Join(a, "plain", "x"), "", "", ErrCommandNotFound},
		{"path is a directory", a, "", "", ErrNotExecutable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := lookPath(tc.cmd, tc.path)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("lookPath(%q) = %q, %v; want %v", tc.cmd, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("lookPath(%q) = %q, %v; want %q", tc.cmd, got, err, tc.want)
			}
		})
	}
}

func TestChildEnv(t *testing.T) {
	lease := &api.Lease{ID: "l-9", Group: "inference", SM: 30, MemBytes: 1 << 30, Attempt: 2, GPUUUIDs: []string{"GPU-1"}, Env: map[string]string{
		api.EnvPipeDirectory:    "/run/mpsd/inference/GPU-1/pipe",
		api.EnvThreadPercentage: "30",
		api.EnvPinnedMemLimit:   "0=1024M",
		EnvVisibleDevices:       "GPU-1",
		api.EnvAttempt:          "7", // the lease's own fields win over its env
	}}
	caller := []string{
		"PATH=/usr/bin",
		"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
		"HOME=/root",
		trampolineEnv + "=1",
		"MPSD_GROUP=stale",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30", // the same value: no conflict
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G,1=2G",
		"CUDA_VISIBLE_DEVICES=1",
		"EMPTY=",
	}
	want := []string{
		"PATH=/usr/bin",
		"HOME=/root",
		"EMPTY=",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M",
		"CUDA_MPS_PIPE_DIRECTORY=/run/mpsd/inference/GPU-1/pipe",
		"CUDA_VISIBLE_DEVICES=GPU-1",
		"MPSD_ATTEMPT=2",
		"MPSD_GROUP=inference",
		"MPSD_LEASE_ID=l-9",
	}
	got, conflicts := childEnv(caller, lease)
	if !slices.Equal(got, want) {
		t.Errorf("childEnv\n got %q\nwant %q", got, want)
	}
	wantConflicts := []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G,1=2G", "CUDA_VISIBLE_DEVICES=1"}
	if !slices.Equal(conflicts, wantConflicts) {
		t.Errorf("conflicts %q, want %q", conflicts, wantConflicts)
	}
}

// TestChildEnvVisibleDevices: the command sees the lease's GPUs by UUID in
// place of the caller's (Slurm's) host indexes, from the lease's
// environment or, from a lease without it, its GPU list; only a lease
// naming no GPU leaves the caller's value.
func TestChildEnvVisibleDevices(t *testing.T) {
	caller := []string{"PATH=/usr/bin", "CUDA_VISIBLE_DEVICES=1,3"}
	lease := func(env string, uuids ...string) *api.Lease {
		l := &api.Lease{ID: "l-1", Group: "g", GPUUUIDs: uuids, Attempt: 1, Env: map[string]string{}}
		if env != "" {
			l.Env[EnvVisibleDevices] = env
		}
		return l
	}
	for _, tc := range []struct {
		name  string
		lease *api.Lease
		want  string
	}{
		{"from the lease's environment", lease("GPU-b,GPU-d", "GPU-b", "GPU-d"), "CUDA_VISIBLE_DEVICES=GPU-b,GPU-d"},
		{"from its GPU list", lease("", "GPU-b", "GPU-d"), "CUDA_VISIBLE_DEVICES=GPU-b,GPU-d"},
		{"lease without GPUs", lease(""), "CUDA_VISIBLE_DEVICES=1,3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, _ := childEnv(caller, tc.lease)
			var got []string
			for _, kv := range env {
				if strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
					got = append(got, kv)
				}
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("CUDA_VISIBLE_DEVICES entries %q, want exactly %q", got, tc.want)
			}
		})
	}
}

func TestGetenv(t *testing.T) {
	env := []string{"A=1", "AB=2", "A=3", "B"}
	for _, tc := range []struct{ name, want string }{{"A", "1"}, {"AB", "2"}, {"B", ""}, {"C", ""}} {
		if got := getenv(env, tc.name); got != tc.want {
			t.Errorf("getenv(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   int
	}{
		{"success", "exit 0", 0},
		{"own code", "exit 3", 3},
		{"255", "exit 255", 255},
		{"SIGKILL", "kill -KILL $$", 137},
		{"SIGTERM", "kill -TERM $$", 143},
		{"SIGSEGV", "kill -SEGV $$", 139},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("/bin/sh", "-c", tc.script)
			_ = cmd.Run() // the status is what is tested
			if got := exitStatus(cmd.ProcessState.Sys().(syscall.WaitStatus)); got != tc.want {
				t.Errorf("exitStatus = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"usage", fmt.Errorf("%w: --sm", ErrUsage), ExitFailure},
		{"unreachable", fmt.Errorf("%w at /s", ErrUnreachable), ExitFailure},
		{"not found", fmt.Errorf("%w: x", ErrCommandNotFound), ExitNotFound},
		{"not executable", fmt.Errorf("%w: x", ErrNotExecutable), ExitNotExecutable},
		{"wait timeout", &api.Error{Code: api.CodeWaitTimeout, Message: "m"}, ExitTempFail},
		{"attempts used up", &api.Error{Code: api.CodeAttemptsExhausted, Message: "m"}, ExitTempFail},
		{"unavailable", &api.Error{Code: api.CodeUnavailable, Message: "m"}, ExitTempFail},
		{"wrapped temporary", fmt.Errorf("launcher: x: %w", &api.Error{Code: api.CodeWaitTimeout, Message: "m"}), ExitTempFail},
		{"cancelled", &api.Error{Code: api.CodeCancelled, Message: "m"}, ExitCancelled},
		{"wrapped cancelled", fmt.Errorf("launcher: x: %w", &api.Error{Code: api.CodeCancelled, Message: "m"}), ExitCancelled},
		{"refused", &api.Error{Code: api.CodeRefused, Message: "m"}, ExitFailure},
		{"bad request", &api.Error{Code: api.CodeBadRequest, Message: "m"}, ExitFailure},
		{"unknown code", &api.Error{Code: "new-in-v1.5", Message: "m"}, ExitFailure},
		{"protocol", fmt.Errorf("%w: x", ErrProtocol), ExitFailure},
		{"lost", fmt.Errorf("%w: x", ErrLost), ExitTempFail},
		{"anything else", errors.New("boom"), ExitFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}
