package launcher

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

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
	s := statusLine{w: &buf, on: true}
	s.update(3, "inference", "", 1500*time.Millisecond)
	s.update(1, "", "", 62*time.Second)
	s.update(2, "a", "GPU 0 quarantined", 3*time.Second)
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
	off.clear()
	if buf.Len() != 0 {
		t.Errorf("an off status line wrote %q", buf.String())
	}
}
