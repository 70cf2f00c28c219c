package mpsd

import (
	"testing"

	"github.com/mpsd/mpsd/mps"
)

// What reconciliation does not report as a process beside MPS: a server
// mpsd knows, the MPS server program from the directory mpsd runs MPS
// from, and a process exiting (its program unreadable). Alice's and Bob's
// own programs, and a server program elsewhere, are reported.
func TestNotBypass(t *testing.T) {
	d := &Daemon{mpsBase: mps.Config{Env: []string{"PATH=/opt/nvidia/bin:/usr/bin"}}}
	for _, tt := range []struct {
		name     string
		isServer bool
		exe      string
		want     bool
	}{
		{"a server mpsd knows", true, "/opt/nvidia/bin/nvidia-cuda-mps-server", true},
		{"the MPS server program mpsd runs", false, "/opt/nvidia/bin/nvidia-cuda-mps-server", true},
		{"exiting: its program unreadable", false, "", true},
		{"alice's program", false, "/home/alice/infer", false},
		{"bob's copy of the server program", false, "/home/bob/nvidia-cuda-mps-server", false},
	} {
		if got := d.notBypass(tt.isServer, procFacts{uid: 64001, exe: tt.exe}); got != tt.want {
			t.Errorf("%s: notBypass = %v, want %v", tt.name, got, tt.want)
		}
	}
}
