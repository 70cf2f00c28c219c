package mps

import (
	"testing"
	"time"
)

// A probe counts as carried back only by the daemon's own record of it:
// a record naming another pid, another source or another command leaves
// the log silent.
func TestLogSilentSince(t *testing.T) {
	d := &Daemon{pid: 4242}
	if _, n := d.LogSilentSince(); n != 0 {
		t.Fatal("silent before any probe")
	}
	at := time.Now()
	d.probeSent(at)
	d.probeSent(at.Add(time.Second)) // a later probe keeps the oldest
	for _, line := range []string{
		"[2026-11-29 19:55:59.317 Control 4243] Cmd:get_server_list", // another pid (forged)
		"[2026-11-29 19:55:59.317 Server 4242] Cmd:get_server_list",  // server.log's kind
		"[2026-11-29 19:55:59.317 Control 4242] Cmd:get_server_list 1",
		"[2026-11-29 19:55:59.317 Control 4242] Cmd:quit",
		"garbage Cmd:get_server_list",
	} {
		d.onControlLine(line, 0)
		if since, n := d.LogSilentSince(); n != 2 || !since.Equal(at) {
			t.Fatalf("after %q: %d probes unlogged since %v; want 2 since the first probe", line, n, since)
		}
	}
	d.onControlLine("[2026-11-29 19:55:59.317 Control 4242] Cmd:get_server_list\n", 0)
	if _, n := d.LogSilentSince(); n != 0 {
		t.Fatal("the daemon's own record of the probe did not count")
	}
}
