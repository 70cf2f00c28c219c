package mpslog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
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

// room is a logger's room for text in these tests (555's).
var room = Room{Line: 6183, Read: 6259}

func TestRecordMatchesNVIDIA(t *testing.T) {
	r, err := ReadRecord(bytes.NewReader(realRecord), room)
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
		{"control pads pid to 5", Record{Kind: Control, PID: 8578, Time: tm, Msg: "NEW UI"}, "[2026-01-02 03:04:05.006 Control  8578] NEW UI\n"},
		{"long pid", Record{Kind: Control, PID: 1234567, Time: tm, Msg: "x"}, "[2026-01-02 03:04:05.006 Control 1234567] x\n"},
		{"other", Record{Kind: Other, PID: 17, Time: tm, Msg: "Start"}, "[2026-01-02 03:04:05.006 Other    17] Start\n"},
		{"server", Record{Kind: Server, PID: 1035, Time: tm, Msg: "Server has started"}, "[2026-01-02 03:04:05.006 Server  1035] Server has started\n"},
		{"empty message", Record{Kind: Control, PID: 1, Time: tm, Msg: ""}, "[2026-01-02 03:04:05.006 Control     1] \n"},
		{"client", Record{Kind: Client, PID: 1, Time: tm, Msg: "c"}, "[2026-01-02 03:04:05.006 Client     1] c\n"},
		{"legacy server", Record{Kind: LegacyServer, PID: 1, Time: tm, Msg: "l"}, "[2026-01-02 03:04:05.006 Legacy Server     1] l\n"},
		{"own newline kept, none added", Record{Kind: Control, PID: 1, Time: tm, Msg: "Cmd:quit\n"}, "[2026-01-02 03:04:05.006 Control     1] Cmd:quit\n"},
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
		{"kind 5", append([]byte{5, 0xe0, 0xcd, 0xab}, realRecord[4:]...), ErrBadRecord},
		{"the daemon's end of log", End(1, time.Now()), ErrBadRecord},
		{"short text", realRecord[:60], io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ReadRecord(bytes.NewReader(tt.in), room); !errors.Is(err, tt.want) {
				t.Errorf("ReadRecord = %v; want %v", err, tt.want)
			}
		})
	}
}

func TestSinkRoutesByKind(t *testing.T) {
	var control, server bytes.Buffer
	s := NewSink(&control, &server)
	tm := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	s.Write(Record{Kind: Control, PID: 1, Time: tm, Msg: "to control"})
	s.Write(Record{Kind: Other, PID: 2, Time: tm, Msg: "to server"})
	if !strings.Contains(control.String(), "to control") || strings.Contains(control.String(), "to server") {
		t.Errorf("control.log got %q", control.String())
	}
	if !strings.Contains(server.String(), "to server") || strings.Contains(server.String(), "to control") {
		t.Errorf("server.log got %q", server.String())
	}
	NewSink(nil, nil).Write(Record{Kind: Control, PID: 1, Time: tm, Msg: "dropped"}) // must not panic
}

func TestSendFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	rec := Record{Kind: Other, PID: 42, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local), Msg: "hello"}
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
	got, err := ReadRecord(rd, room)
	if err != nil {
		t.Fatal(err)
	}
	sink.Write(got)
	if want := rec.Line(); out.String() != want {
		t.Errorf("through the FIFO: %q; want %q", out.String(), want)
	}
}

// header is a record header as anyone may write it: kind 3 (Other), pid
// 4242, 2026-01-02 03:04:05.006, declaring n bytes of text.
func header(n uint64) []byte {
	return Record{Kind: Other, PID: 4242, Time: time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.Local)}.header(magic|uint32(Other), n, "")
}

// What NVIDIA's 535, 550 and 555 daemons wrote to server.log for forged
// records (each followed by a record "M"): the text as a C string with a
// newline appended unless it ends with one, the header's fields printed as
// they are.
func TestLineAsNVIDIA(t *testing.T) {
	const pre = "[2026-01-02 03:04:05.006 Other  4242] "
	for _, tc := range []struct{ text, line string }{
		{"ab\n", pre + "ab\n"},
		{"a\nb", pre + "a\nb\n"},
		{"a\x00b", pre + "a"},
		{"\n", pre + "\n"},
		{"ab\n\n", pre + "ab\n\n"},
		{"a\nb\x00cde", pre + "a\nb"},
		{"ab\x00\n", pre + "ab"},
		{"", pre + "\n"},
	} {
		b := append(header(uint64(len(tc.text))), tc.text...)
		r, err := ReadRecord(bytes.NewReader(b), room)
		if err != nil {
			t.Fatalf("%q: %v", tc.text, err)
		}
		if got := r.Line(); got != tc.line {
			t.Errorf("text %q: %q, want NVIDIA's %q", tc.text, got, tc.line)
		}
	}
	// Fields as written, signed: seen with a forged pid, year, month, day,
	// hour, minute, second and millisecond.
	for _, tc := range []struct {
		word int
		v    uint32
		line string
	}{
		{1, 0xffffffff, "[2026-01-02 03:04:05.006 Other    -1] T\n"},
		{1, 1 << 31, "[2026-01-02 03:04:05.006 Other -2147483648] T\n"},
		{2, 0xffffffff, "[-1-01-02 03:04:05.006 Other  4242] T\n"},
		{3, 13, "[2026-13-02 03:04:05.006 Other  4242] T\n"},
		{3, 0, "[2026-00-02 03:04:05.006 Other  4242] T\n"},
		{4, 40, "[2026-01-40 03:04:05.006 Other  4242] T\n"},
		{5, 77, "[2026-01-02 03:04:05.006 Other  4242] T\n"}, // the unused word
		{6, 99, "[2026-01-02 99:04:05.006 Other  4242] T\n"},
		{7, 100, "[2026-01-02 03:100:05.006 Other  4242] T\n"},
		{8, 61, "[2026-01-02 03:04:61.006 Other  4242] T\n"},
		{9, 5000, "[2026-01-02 03:04:05.5000 Other  4242] T\n"},
	} {
		b := append(header(1), 'T')
		binary.LittleEndian.PutUint32(b[4*tc.word:], tc.v)
		r, err := ReadRecord(bytes.NewReader(b), room)
		if err != nil {
			t.Fatalf("word %d = %d: %v", tc.word, tc.v, err)
		}
		if got := r.Line(); got != tc.line {
			t.Errorf("word %d = %d: %q, want NVIDIA's %q", tc.word, tc.v, got, tc.line)
		}
		if again, err := ReadRecord(bytes.NewReader(r.Encode()), room); err != nil || again.Line() != tc.line {
			t.Errorf("word %d = %d: re-encoded, %q (%v)", tc.word, tc.v, again.Line(), err)
		}
	}
}

// records is n records of the daemon's own kind, what follows a poisoned
// header in its FIFO.
func records(n int) []byte {
	var b []byte
	for i := 0; i < n; i++ {
		b = append(b, Record{Kind: Control, PID: 777, Time: time.Now(), Msg: "Cmd:get_server_list\n"}.Encode()...)
	}
	return b
}

// A header declaring more text than the logger has room for swallows what
// comes after it, the daemon's records included: nothing is logged, and
// once Read+1 bytes have come the logger overruns (NVIDIA's daemon crashes
// there). A length in the header's last eight bytes counts whole.
func TestPoisonedRecordSwallowsLaterRecords(t *testing.T) {
	for _, n := range []uint64{0xffffffff, uint64(room.Read) + 1, 1 << 32, 0xdead << 32} {
		var out bytes.Buffer
		sink := NewSink(&out, &out)
		later := records(3)
		// Everything there is, but less than room: the logger waits on.
		err := sink.Pump(bytes.NewReader(append(header(n), later...)), room)
		if !errors.Is(err, io.ErrUnexpectedEOF) || out.Len() != 0 {
			t.Errorf("length %#x, then %d bytes: Pump = %v, logged %q; want it waiting for text, nothing logged", n, len(later), err, out.String())
		}
		// Read bytes still wait; one more overruns, still nothing logged.
		text := records(room.Read/headerSize + 1)
		err = sink.Pump(bytes.NewReader(append(header(n), text[:room.Read]...)), room)
		if !errors.Is(err, io.ErrUnexpectedEOF) || out.Len() != 0 {
			t.Errorf("length %#x, then %d bytes: Pump = %v, logged %q; want it waiting", n, room.Read, err, out.String())
		}
		err = sink.Pump(bytes.NewReader(append(header(n), text...)), room)
		if !errors.Is(err, ErrOverrun) || out.Len() != 0 {
			t.Errorf("length %#x, then %d bytes: Pump = %v, logged %q; want ErrOverrun, nothing logged", n, len(text), err, out.String())
		}
	}
	// Line bytes of text are a record, logged in full, and the next record
	// follows; a record one byte longer kills the daemon once it is all
	// there, one longer than Read once Read+1 bytes are.
	for _, tc := range []struct {
		n, sent int
		want    error
	}{
		{room.Line, room.Line, io.EOF},
		{room.Line + 1, room.Line, io.ErrUnexpectedEOF},
		{room.Line + 1, room.Line + 1, ErrOverrun},
		{room.Read, room.Read, ErrOverrun},
		{room.Read + 2, room.Read, io.ErrUnexpectedEOF},
		{room.Read + 2, room.Read + 1, ErrOverrun},
	} {
		text := strings.Repeat("A", tc.sent)
		stream := append(header(uint64(tc.n)), text...)
		if tc.n == tc.sent {
			stream = append(stream, records(1)...)
		}
		var out bytes.Buffer
		err := NewSink(&out, &out).Pump(bytes.NewReader(stream), room)
		logged := strings.Contains(out.String(), text+"\n") && strings.Contains(out.String(), "Cmd:get_server_list\n")
		if !errors.Is(err, tc.want) || logged != (tc.want == io.EOF) {
			t.Errorf("a record of %d bytes, %d sent: Pump = %v, logged %d bytes; want %v", tc.n, tc.sent, err, out.Len(), tc.want)
		}
	}
}

// A record declaring 4 GiB is read without holding 4 GiB, or even its
// room: the text is discarded as it comes.
func TestPoisonedRecordHoldsNoText(t *testing.T) {
	stream := append(header(0xffffffff), bytes.Repeat([]byte{'x'}, room.Read+1)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadRecord(bytes.NewReader(stream), room)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrOverrun) {
		t.Fatalf("ReadRecord = %v, want ErrOverrun", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("reading a record declaring 4 GiB allocated %d bytes", got)
	}
}

// Through a real FIFO: the poisoned header waits for text that a later
// writer's records become; the logger logs none of them.
func TestPoisonedFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	rd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- NewSink(&out, &out).Pump(rd, room) }()
	if n, err := WriteRaw(path, header(0xffffffff)); n != headerSize || err != nil {
		t.Fatalf("WriteRaw = %d, %v", n, err)
	}
	for i := 0; i < 10; i++ {
		if err := SendFIFO(path, Record{Kind: Control, PID: 1, Time: time.Now(), Msg: "swallowed"}); err != nil {
			t.Fatal(err)
		}
	}
	// The daemon's end of log is swallowed too: the logger does not stop.
	if n, err := WriteRaw(path, End(1, time.Now())); n != headerSize || err != nil {
		t.Fatalf("WriteRaw = %d, %v", n, err)
	}
	select {
	case err := <-done:
		t.Fatalf("the logger stopped (%v) inside a record declaring 4 GiB", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Closing the FIFO ends the wait (the emulated daemon never does).
	rd.Close()
	<-done
	if out.String() != "" {
		t.Errorf("logged after the poisoned header: %q", out.String())
	}
}

// syncBuffer is a bytes.Buffer safe for the logger goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// WriteFIFO writes as NVIDIA's control program announces itself: it fails
// at once without a reader, and waits while the FIFO is full (a daemon
// whose logger stopped), where SendFIFO gives up.
func TestWriteFIFOWaitsWhileFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := Record{Kind: Other, PID: 42, Time: time.Now(), Msg: "Using log directory: /x"}
	if err := WriteFIFO(path, rec); !errors.Is(err, syscall.ENXIO) {
		t.Fatalf("WriteFIFO without reader = %v; want ENXIO", err)
	}
	rd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	filled, err := WriteRaw(path, make([]byte, 1<<20))
	if !errors.Is(err, syscall.EAGAIN) || filled == 0 {
		t.Fatalf("filling the FIFO: %d bytes, %v; want EAGAIN once full", filled, err)
	}
	if err := SendFIFO(path, rec); !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("SendFIFO to a full FIFO = %v; want EAGAIN", err)
	}
	done := make(chan error, 1)
	go func() { done <- WriteFIFO(path, rec) }()
	select {
	case err := <-done:
		t.Fatalf("WriteFIFO to a full FIFO returned %v without waiting", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := io.CopyN(io.Discard, rd, int64(filled)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WriteFIFO once drained: %v", err)
	}
	if got, err := ReadRecord(rd, room); err != nil || got.Msg != rec.Msg {
		t.Errorf("after the drain the FIFO holds %+v (%v)", got, err)
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzReadRecord feeds arbitrary FIFO bytes (any process may write there):
// decoding must not panic, must read no more than a header and Read+1
// bytes of text, and what decodes must render and encode back to the same
// line.
func FuzzReadRecord(f *testing.F) {
	f.Add(realRecord)
	f.Add(realRecord[:48])
	f.Add([]byte{})
	f.Add(Record{Kind: Control, PID: 1, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local), Msg: "Cmd:quit\n"}.Encode())
	f.Add(append(header(0xffffffff), records(3)...))
	f.Add(append(header(8), "a\x00b\nc\r\n"...))
	f.Add(End(1, time.Now()))
	f.Fuzz(func(t *testing.T, b []byte) {
		cr := &countingReader{r: bytes.NewReader(b)}
		r, err := ReadRecord(cr, room)
		if cr.n > headerSize+room.Read+1 {
			t.Fatalf("read %d bytes for one record, room %+v", cr.n, room)
		}
		if err != nil {
			return
		}
		if cr.n != headerSize+len(r.Msg) {
			t.Fatalf("read %d bytes for a record of %d bytes of text", cr.n, len(r.Msg))
		}
		line := r.Line()
		if len(r.Msg) > MaxMsg {
			return // Encode cuts it, as the daemon cuts its own
		}
		again, err := ReadRecord(bytes.NewReader(r.Encode()), room)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if again.Msg != r.Msg || again.PID != r.PID || again.Kind != r.Kind || again.Line() != line {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}
	})
}
