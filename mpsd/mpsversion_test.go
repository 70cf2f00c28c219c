package mpsd

import (
	"testing"

	"github.com/mpsd/mpsd/policy"
)

// CUDA_MPS_CLIENT_PRIORITY is set from 535 on (0 normal, 1 for a group
// below 0) and never for an older or unknown driver.
func TestClientPriority(t *testing.T) {
	for _, tt := range []struct {
		driver string
		prio   int
		want   string
		ok     bool
	}{
		{"580.159.04", -1, "1", true},
		{"580.159.04", 0, "0", true},
		{"550.163.01", 5, "0", true},
		{"535.261.03", -3, "1", true},
		{"530.30.02", -1, "", false},
		{"", -1, "", false},
		{"x.1", 0, "", false},
		{"0580.1", 0, "", false},
	} {
		if got, ok := clientPriority(tt.driver, tt.prio); got != tt.want || ok != tt.ok {
			t.Errorf("clientPriority(%q, %d) = %q, %v; want %q, %v", tt.driver, tt.prio, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzClientPriority: any driver version string and priority give "0" or
// "1" from 535 on, and nothing below or for what is no version.
func FuzzClientPriority(f *testing.F) {
	for _, v := range []string{"580.159.04", "535", "534.99", "", "99999999999999999999.1", "+580.1"} {
		f.Add(v, -1)
	}
	f.Fuzz(func(t *testing.T, v string, prio int) {
		got, ok := clientPriority(v, prio)
		if n := policy.DriverMajor(v); ok != (n >= clientPriorityFrom) || ok && got != map[bool]string{true: "1", false: "0"}[prio < 0] || !ok && got != "" {
			t.Fatalf("clientPriority(%q, %d) = %q, %v (major %d)", v, prio, got, ok, n)
		}
	})
}
