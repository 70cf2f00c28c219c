package mps

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

func TestScanBinaryVersion(t *testing.T) {
	for in, want := range map[string]int{
		"CUDA MPS Control binary version: 13000": 13000,
		"CUDA MPS Control binary version: 13010": 13010,
	} {
		if v, ok := scanBinaryVersion(in); !ok || v != want {
			t.Errorf("%q: %d, %v; want %d", in, v, ok, want)
		}
	}
	for _, in := range []string{"", "CUDA MPS Control binary version: ", "CUDA MPS Control binary version: 0",
		"CUDA MPS Control binary version: -1", "CUDA MPS Control binary version: 13000 ", "CUDA MPS Control binary version: 013000",
		"CUDA MPS Server for Linux/Unix. Binary version: 13000", "x CUDA MPS Control binary version: 13000"} {
		if v, ok := scanBinaryVersion(in); ok {
			t.Errorf("%q: %d; want no version", in, v)
		}
	}
}

func FuzzScanBinaryVersion(f *testing.F) {
	f.Add("CUDA MPS Control binary version: 13000")
	f.Add("CUDA MPS Control binary version: 99999999999999999999")
	f.Fuzz(func(t *testing.T, m string) {
		v, ok := scanBinaryVersion(m)
		if ok && (v <= 0 || "CUDA MPS Control binary version: "+strconv.Itoa(v) != m) {
			t.Fatalf("%q: %d", m, v)
		}
	})
}

// waitVersion waits up to 5 s for the handle's LoggedBinaryVersion to be want.
func waitVersion(t *testing.T, d *Daemon, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for d.LoggedBinaryVersion() != want {
		if time.Now().After(deadline) {
			t.Fatalf("LoggedBinaryVersion = %d; want %d", d.LoggedBinaryVersion(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A 580 daemon's version line is learned from control.log, at its start
// and on adoption; an older daemon has none. Only the first line in the
// daemon's own name counts: a version written into the log FIFO later, or
// in another process's name, changes nothing.
func TestBinaryVersion(t *testing.T) {
	for gen, want := range map[string]int{"580": 13000, "555": 0} {
		t.Run(gen, func(t *testing.T) {
			t.Parallel()
			cfg := newConfig(t, emuBackend(t, gen))
			in := start(t, cfg)
			in.startServer(t) // the follower has read past the start lines
			waitVersion(t, in.d, want)
			fifo := filepath.Join(cfg.PipeDir, "log")
			const marker = 4194303 // above any pid: the record names no server
			for _, r := range []mpslog.Record{
				{Kind: mpslog.Control, PID: in.d.PID() + 1, Msg: "CUDA MPS Control binary version: 77000"},
				{Kind: mpslog.Control, PID: in.d.PID(), Msg: "CUDA MPS Control binary version: 99000"},
				// Read after the lines above: its event marks them read.
				{Kind: mpslog.Control, PID: in.d.PID(), Msg: "Server " + strconv.Itoa(marker) + " exited with status 1"},
			} {
				if gen == "555" && r.PID == in.d.PID() && r.Msg != "Server "+strconv.Itoa(marker)+" exited with status 1" {
					continue // would be taken: a hint, which mpsd neither shows nor uses
				}
				r.Time = time.Now()
				if err := mpslog.SendFIFO(fifo, r); err != nil {
					t.Fatal(err)
				}
			}
			in.waitEvent(t, "the marker record", kindPID(UnverifiedRecord, marker))
			if got := in.d.LoggedBinaryVersion(); got != want {
				t.Errorf("after forged version lines: %d; want %d", got, want)
			}
			// A new handle on the same daemon reads it from the log.
			d2, err := Adopt(testCtx(t, 10*time.Second), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			if got := d2.LoggedBinaryVersion(); got != want {
				t.Errorf("adopted: %d; want %d", got, want)
			}
		})
	}
}
