package mps

import (
	"strings"
	"time"
)

// Whether the control daemon's log still carries the daemon's own records.
//
// NVIDIA's control daemon copies every record (its own, and whatever
// anyone writes into the world-writable log FIFO of its pipe directory)
// through one logger into control.log and server.log. One record header
// written into the FIFO whose length field is huge (0xffffffff) makes that
// logger wait for gigabytes of text: every later record, the daemon's own
// included, is swallowed, and the log says nothing again (docs/security.md).
//
// Each Probe is a get_server_list, which the daemon logs as
// "Cmd:get_server_list" under its own pid. The handle notes when a probe
// was sent and when such a record of the daemon's came back; probes not
// carried back mean the log is lost (LogSilentSince), which the caller
// decides from, with its probe interval: the record of the probe just
// answered may still be on its way to the follower, and one sent while
// the daemon started may have been written before the follower's offset. A record someone forges can only
// make a working log look working: after a poisoning, forged records are
// swallowed with the rest.

// probeEcho is the record the daemon logs for a probe.
const probeEcho = "Cmd:get_server_list"

// logEcho is what the handle knows of its probes' records.
type logEcho struct {
	// sent: when the oldest probe whose record has not come back yet was
	// sent; zero when every probe's has. n: how many probes were sent
	// since the last record came back.
	sent time.Time
	n    int
	// seen: when the last one came back.
	seen time.Time
}

// probeSent notes a probe sent at now.
func (d *Daemon) probeSent(now time.Time) {
	d.mu.Lock()
	if d.echo.sent.IsZero() {
		d.echo.sent = now
	}
	d.echo.n++
	d.mu.Unlock()
}

// onControlLine is the control.log follower's callback: it notes a probe's
// record (the daemon's own get_server_list) and hands the line on.
func (d *Daemon) onControlLine(line string, start int64) {
	if strings.Contains(line, probeEcho) {
		if l, ok := ParseLogLine(line); ok && l.Source == "Control" && l.PID == d.pid && l.Message == probeEcho {
			d.mu.Lock()
			d.echo.sent, d.echo.n, d.echo.seen = time.Time{}, 0, time.Now()
			d.mu.Unlock()
		}
	}
	d.onLogLine(line, start)
}

// LogSilentSince reports when the oldest probe was sent whose record the
// daemon's control.log has not carried back yet, and how many probes have
// been sent since a record last came back (0: every probe's has). A
// daemon whose log is lost answers probes but never logs them again.
func (d *Daemon) LogSilentSince() (since time.Time, probes int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.echo.sent, d.echo.n
}
