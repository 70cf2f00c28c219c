package mpslog

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// realRecord is what NVIDIA's 550 nvidia-cuda-mps-control wrote into a
// running daemon's log FIFO (strace), and realLine what that daemon then
// wrote to server.log.
var (
	realRecord = []byte("\x03\xe0\xcd\xab\x3b\x36\x00\x00\xea\x07\x00\x00\x0b\x00\x00\x00\x1d\x00\x00\x00\x00\x00\x00\x00" +
		"\x13\x00\x00\x00\x31\x00\x00\x00\x05\x00\x00\x00\xf1\x00\x00\x00\x2b\x00\x00\x00\x00\x00\x00\x00" +
		"Using log directory: /tmp/emuexp/s.x9ju/log")
	realLine = "[2026-11-29 19:49:05.241 Other 13883] Using log directory: /tmp/emuexp/s.x9ju/log\n"
)

func TestRecordMatchesNVIDIA(t *testing.T) {
	r, err := ReadRecord(bytes.NewReader(realRecord))
	if err != nil {
		t.Fatalf("ReadRecord: %v", err)
	}
	if got := r.Line(); got != realLine {
		t.Errorf("Line() = %q; want %q", got, realLine)
	}
	if got := r.Encode(); !bytes.Equal(got, realRecord) {
		t.Errorf("Encode() = %q; want NVIDIA's bytes %q", got, realRecord)
	}
}

func TestLine(t *testing.T) {
	tm := time.Date(2026, 1, 2, 3, 4, 5, 6_789_000, time.Local)
	tests := []struct {
		name string
		r    Record
		want string
	}{
		{"control pads pid to 5", Record{Control, 8578, tm, "NEW UI"}, "[2026-01-02 03:04:05.006 Control  8578] NEW UI\n"},
		{"long pid", Record{Control, 1234567, tm, "x"}, "[2026-01-02 03:04:05.006 Control 1234567] x\n"},
		{"other", Record{Other, 17, tm, "Start"}, "[2026-01-02 03:04:05.006 Other    17] Start\n"},
		{"server", Record{Server, 1035, tm, "Server has started"}, "[2026-01-02 03:04:05.006 Server  1035] Server has started\n"},
		{"empty message", Record{Control, 1, tm, ""}, "[2026-01-02 03:04:05.006 Control     1] \n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Line(); got != tt.want {
				t.Errorf("Line() = %q; want %q", got, tt.want)
			}
		})
	}
}

func TestReadRecordErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"short header", realRecord[:20], io.ErrUnexpectedEOF},
		{"bad magic", append([]byte{0, 0, 0, 0}, realRecord[4:]...), ErrBadRecord},
		{"short text", realRecord[:60], io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ReadRecord(bytes.NewReader(tt.in)); !errors.Is(err, tt.want) {
				t.Errorf("ReadRecord = %v; want %v", err, tt.want)
			}
		})
	}
}

func TestSinkRoutesByKind(t *testing.T) {
	var control, server bytes.Buffer
	s := NewSink(&control, &server)
	tm := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	s.Write(Record{Control, 1, tm, "to control"})
	s.Write(Record{Other, 2, tm, "to server"})
	if !strings.Contains(control.String(), "to control") || strings.Contains(control.String(), "to server") {
		t.Errorf("control.log got %q", control.String())
	}
	if !strings.Contains(server.String(), "to server") || strings.Contains(server.String(), "to control") {
		t.Errorf("server.log got %q", server.String())
	}
	NewSink(nil, nil).Write(Record{Control, 1, tm, "dropped"}) // must not panic
}

func TestSendFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	rec := Record{Other, 42, time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local), "hello"}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// No reader: MPS processes must not block, they drop the line.
	if err := SendFIFO(path, rec); !errors.Is(err, syscall.ENXIO) {
		t.Fatalf("SendFIFO without reader = %v; want ENXIO", err)
	}
	rd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if err := SendFIFO(path, rec); err != nil {
		t.Fatalf("SendFIFO: %v", err)
	}
	var out bytes.Buffer
	sink := NewSink(nil, &out)
	got, err := ReadRecord(rd)
	if err != nil {
		t.Fatal(err)
	}
	sink.Write(got)
	if want := rec.Line(); out.String() != want {
		t.Errorf("through the FIFO: %q; want %q", out.String(), want)
	}
}

// FuzzReadRecord feeds arbitrary FIFO bytes (any process may write there):
// decoding must not panic, and what decodes must encode back to the same
// record.
func FuzzReadRecord(f *testing.F) {
	f.Add(realRecord)
	f.Add(realRecord[:48])
	f.Add([]byte{})
	f.Add(Record{Control, 1, time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local), "Cmd:quit"}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ReadRecord(bytes.NewReader(b))
		if err != nil {
			return
		}
		_ = r.Line()
		again, err := ReadRecord(bytes.NewReader(r.Encode()))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if again.Msg != r.Msg || again.PID != r.PID || again.Kind&0xff != r.Kind&0xff {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}
	})
}
