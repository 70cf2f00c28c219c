package launcher

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

func itoa(n int) string { return strconv.Itoa(n) }

func TestIsTerminal(t *testing.T) {
	_, slave := apitest.OpenPTY(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f, err := os.Create(t.TempDir() + "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct {
		name string
		f    *os.File
		want bool
	}{{"pty", slave, true}, {"pipe", w, false}, {"file", f, false}, {"nil", nil, false}} {
		if got := isTerminal(tc.f); got != tc.want {
			t.Errorf("isTerminal(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestStatusLine(t *testing.T) {
	var buf bytes.Buffer
	s := statusLine{w: &buf, live: true}
	s.update(3, "inference", "", 1500*time.Millisecond)
	s.update(1, "", "", 62*time.Second)
	s.update(2, "a", "GPU 0 quarantined", 3*time.Second)
	s.granted(&api.Lease{ID: "a-1", Group: "a"}, 4*time.Second) // the live line is cleared, not followed
	s.clear()
	s.clear() // nothing shown: nothing to clear
	want := "\rmps-launch: queued, position 3 in group inference, waited 1s\x1b[K" +
		"\rmps-launch: queued, position 1, waited 1m2s\x1b[K" +
		"\rmps-launch: queued, position 2 in group a (GPU 0 quarantined), waited 3s\x1b[K" +
		"\r\x1b[K"
	if buf.String() != want {
		t.Errorf("status output\n got %q\nwant %q", buf.String(), want)
	}
	buf.Reset()
	off := statusLine{w: &buf}
	off.update(1, "g", "", time.Second)
	off.update(1, "g", "waiting for room", 2*time.Second)
	off.granted(&api.Lease{ID: "g-1", Group: "g"}, 3*time.Second)
	off.clear()
	if buf.Len() != 0 {
		t.Errorf("an off status line wrote %q", buf.String())
	}
}

// TestStatusLineLogged is the queue status where stderr is no terminal (a
// batch job's log): a line as the wait begins, one per change of reason
// (a new position alone says nothing), one at the grant, and the same
// again for the wait after a requeue.
func TestStatusLineLogged(t *testing.T) {
	type call struct {
		position int
		reason   string
		at       time.Duration
		grant    bool // granted instead of an update
	}
	for _, tc := range []struct {
		name   string
		prefix string
		calls  []call
		want   string
	}{
		{"granted at once", "mps-launch: ", []call{{grant: true, at: 0}}, ""},
		{"one wait", "mps-launch: ", []call{
			{position: 3, reason: "waiting for room"},
			{position: 2, reason: "waiting for room", at: 5 * time.Second},
			{position: 1, reason: "waiting for room", at: 9 * time.Second},
			{grant: true, at: 72 * time.Second},
		}, "mps-launch: queued, position 3 in group a (waiting for room)\n" +
			"mps-launch: granted lease a-7 in group a after waiting 1m12s\n"},
		{"reasons change", "mps-launch: job 42: ", []call{
			{position: 1, reason: "waiting for room"},
			{position: 1, reason: "waiting for room; GPU 0 quarantined", at: 2 * time.Second},
			{position: 2, reason: "waiting for room; GPU 0 quarantined", at: 3 * time.Second},
			{position: 1, reason: "state directory /var/lib/mpsd cannot be written (no space left on device); no lease is granted until it can", at: 61 * time.Second},
			{position: 1, reason: "waiting for room", at: 62 * time.Second},
			{grant: true, at: 63 * time.Second},
		}, "mps-launch: job 42: queued, position 1 in group a (waiting for room)\n" +
			"mps-launch: job 42: still queued, position 1 in group a (waiting for room; GPU 0 quarantined), waited 2s\n" +
			"mps-launch: job 42: still queued, position 1 in group a (state directory /var/lib/mpsd cannot be written (no space left on device); no lease is granted until it can), waited 1m1s\n" +
			"mps-launch: job 42: still queued, position 1 in group a (waiting for room), waited 1m2s\n" +
			"mps-launch: job 42: granted lease a-7 in group a after waiting 1m3s\n"},
		{"no reason from an older mpsd", "mps-launch: ", []call{
			{position: 4}, {position: 3, at: time.Second}, {grant: true, at: 2 * time.Second},
		}, "mps-launch: queued, position 4 in group a\n" +
			"mps-launch: granted lease a-7 in group a after waiting 2s\n"},
		{"a wait after a requeue", "mps-launch: ", []call{
			{position: 1, reason: "waiting for room"}, {grant: true, at: time.Second},
			{position: 1, reason: "waiting for room", at: 0}, {grant: true, at: 3 * time.Second},
		}, "mps-launch: queued, position 1 in group a (waiting for room)\n" +
			"mps-launch: granted lease a-7 in group a after waiting 1s\n" +
			"mps-launch: queued, position 1 in group a (waiting for room)\n" +
			"mps-launch: granted lease a-7 in group a after waiting 3s\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			s := statusLine{w: &buf, logged: true, prefix: tc.prefix}
			for _, c := range tc.calls {
				if c.grant {
					s.granted(&api.Lease{ID: "a-7", Group: "a"}, c.at)
				} else {
					s.update(c.position, "a", c.reason, c.at)
				}
			}
			s.clear() // nothing to erase in a log
			if buf.String() != tc.want {
				t.Errorf("logged\n got %q\nwant %q", buf.String(), tc.want)
			}
		})
	}
}
