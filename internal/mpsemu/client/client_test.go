package client

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestExitCodes(t *testing.T) {
	tests := []struct {
		code int
		name string
		exit int
	}{
		{ErrMemoryAllocation, "cudaErrorMemoryAllocation", 12},
		{ErrNoDevice, "cudaErrorNoDevice", 30},
		{ErrInvalidDevice, "cudaErrorInvalidDevice", 31},
		{ErrIllegalAddress, "cudaErrorIllegalAddress", 70},
		{ErrConnectionFailed, "cudaErrorMpsConnectionFailed", 85},
		{ErrRPCFailure, "cudaErrorMpsRpcFailure", 86},
		{ErrServerNotReady, "cudaErrorMpsServerNotReady", 87},
		{ErrMaxClientsReached, "cudaErrorMpsMaxClientsReached", 88},
		{ErrClientTerminated, "cudaErrorMpsClientTerminated", 90},
		{999, "cudaErrorUnknown", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if Name(tt.code) != tt.name || ExitCode(tt.code) != tt.exit {
				t.Errorf("%d: %s exit %d; want %s exit %d", tt.code, Name(tt.code), ExitCode(tt.code), tt.name, tt.exit)
			}
			e := &Error{Code: tt.code, Detail: "why"}
			if want := "CUDA error "; !strings.HasPrefix(e.Error(), want) || !strings.Contains(e.Error(), tt.name) {
				t.Errorf("Error() = %q", e.Error())
			}
		})
	}
}

func TestMainUsageAndNoServer(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		exit   int
		stderr string
	}{
		{"unknown flag", []string{"--bogus"}, 2, "flag provided but not defined"},
		{"bad size", []string{"--alloc", "lots"}, 2, "--alloc"},
		{"negative duration", []string{"--duration", "-1s"}, 2, "negative"},
		{"extra argument", []string{"x"}, 2, "unexpected"},
		{"no server", nil, 85, "CUDA error 805 cudaErrorMpsConnectionFailed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			env := func(k string) string {
				if k == "CUDA_MPS_PIPE_DIRECTORY" {
					return dir
				}
				return ""
			}
			var out, errb strings.Builder
			if got := Main(tt.args, env, &out, &errb); got != tt.exit || !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("exit %d stderr %q; want %d and %q", got, errb.String(), tt.exit, tt.stderr)
			}
		})
	}
}
