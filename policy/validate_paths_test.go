package policy

import (
	"errors"
	"strings"
	"testing"
)

// A run_dir too long for MPS's socket paths, and exclusive_process on a GPU
// that groups share, are refused with the key and the reason.
func TestHostLimits(t *testing.T) {
	gpus := []GPU{{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", Memory: 40 << 30}, {Index: 1, UUID: "GPU-11111111-1111-1111-1111-111111111111", Memory: 40 << 30}}
	for _, tc := range []struct {
		name, yaml, key, msg string
	}{
		{"run_dir fits", "run_dir: /run/mpsd\ngroups: {inference: {users: [\"1\"], memory: 1G}}\n", "", ""},
		{"run_dir too long", "run_dir: /" + strings.Repeat("r", 40) + "\ngroups: {inference: {users: [\"1\"], memory: 1G}}\n",
			"run_dir", "more than the 107 a unix socket path may have"},
		{"exclusive on shared GPUs", "mps: {compute_mode: exclusive_process}\ngroups: {a: {users: [\"1\"], memory: 1G}, b: {users: [\"1\"], memory: 1G}}\n",
			"mps.compute_mode", "GPU 0 is shared by groups a, b"},
		{"exclusive on separate GPUs", "mps: {compute_mode: exclusive_process}\ngroups: {a: {users: [\"1\"], memory: 1G, gpus: [\"0\"]}, b: {users: [\"1\"], memory: 1G, gpus: [\"1\"]}}\n", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader("version: 1\n"+tc.yaml), Host{GPUs: gpus})
			if tc.key == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			wantProblem(t, err, tc.key, tc.msg)
		})
	}
}

// wantProblem fails t unless err is a ConfigError with a problem at key
// whose message contains msg.
func wantProblem(t *testing.T, err error, key, msg string) {
	t.Helper()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Parse error %v, want a ConfigError", err)
	}
	for _, p := range ce.Problems {
		if p.Key == key && strings.Contains(p.Message, msg) {
			return
		}
	}
	t.Fatalf("problems %v lack %s: %q", ce.Problems, key, msg)
}
