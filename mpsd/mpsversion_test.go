package mpsd

import "testing"

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
