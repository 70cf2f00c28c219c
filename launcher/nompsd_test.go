package launcher

import (
	"path/filepath"
	"testing"
	"time"
)

// TestRunNoMpsdComing: a socket that nothing listens on, without the live
// marker a serving mpsd keeps beside it (what mpsctl shutdown of an mpsd
// that removed neither, or an mpsd stopped for good, leaves), is not
// waited for: mps-launch exits 125 at once, naming the socket, instead of
// waiting out its outage window and exiting 75 (which a batch system
// requeues, for ever). The command never runs.
func TestRunNoMpsdComing(t *testing.T) {
	h := newHarness(t, nil)
	h.cfg.ReconnectTimeout = time.Hour // only giving up at once ends the test in time
	h.cfg.Socket = refusingSocket(t, h.dir)
	start := time.Now()
	done := h.start(t.Context(), h.sh("echo ran > marker")...)
	if code := h.wait(done); code != ExitFailure {
		t.Errorf("exit %d, want %d; stderr %s", code, ExitFailure, h.read("stderr"))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %s; want at once", took)
	}
	want := "mps-launch: cannot reach mpsd at " + h.cfg.Socket + ": connection refused, and no mpsd is coming back to it (no " +
		filepath.Base(h.cfg.Socket) + ".live beside it: mpsctl shutdown ended mpsd, or none serves this socket); start mpsd, or name another socket with --socket or $MPSD_SOCKET\n"
	if got := h.read("stderr"); got != want {
		t.Errorf("stderr\n got %q\nwant %q", got, want)
	}
	if got := ranMarker(t, h); got != "" {
		t.Errorf("the command ran (%q)", got)
	}
}
