package mpslog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Kind says which MPS process wrote a line; it selects the file and the
// word in the line's bracket.
type Kind uint32

// Kinds seen in NVIDIA's logs and record headers (NVIDIA's 535, 550 and
// 555 daemons render 0 Control, 1 Server, 2 Client, 3 Other, 4 Legacy
// Server; a record of any other kind stops their logger). Control lines go
// to control.log, everything else to server.log. A server writes its
// start-up lines as Other and the rest as Server (docs/gpu-probe).
const (
	Control      Kind = 0
	Server       Kind = 1
	Client       Kind = 2
	Other        Kind = 3
	LegacyServer Kind = 4
)

func (k Kind) String() string {
	switch k {
	case Control:
		return "Control"
	case Server:
		return "Server"
	case Client:
		return "Client"
	case LegacyServer:
		return "Legacy Server"
	}
	return "Other"
}

// ErrBadRecord is returned by ReadRecord for a header that is not an MPS
// log record: a wrong magic number (the daemon's own end-of-log header is
// one) or a kind above LegacyServer. NVIDIA's logger thread stops there,
// for good.
var ErrBadRecord = errors.New("mpslog: not an MPS log record")

// ErrOverrun is returned by ReadRecord once more text of one record has
// arrived than NVIDIA's logger has room for: NVIDIA's daemon then dies
// (SIGSEGV, the text having overwritten its logger thread's stack).
var ErrOverrun = errors.New("mpslog: record text overran the logger's buffer")

// Room is how much text of one record NVIDIA's logger thread survives,
// measured on each generation's daemon (control.Generation.LogRoom): a
// record of up to Line bytes of text is logged; one declaring more kills
// the daemon once Read+1 bytes of its text, or all of it if that is less,
// have come in. Until then the logger waits for them, and whatever is
// written into the FIFO meanwhile, the daemon's own records included, is
// that text.
type Room struct{ Line, Read int }

// Record is one log message with its time of writing and writer's pid.
type Record struct {
	Kind Kind
	PID  int
	Time time.Time
	Msg  string
	// stamp is the header's date and time as read: NVIDIA's daemon prints
	// the fields as they are (a forged month 13 stays 13), so a record
	// read from a FIFO is rendered from them, not from Time.
	stamp stamp
}

// stamp is the date and time fields of a record header, as written.
type stamp struct {
	set                                  bool
	year, month, day, hour, min, sec, ms int32
}

func stampOf(t time.Time) stamp {
	return stamp{true, int32(t.Year()), int32(t.Month()), int32(t.Day()), int32(t.Hour()),
		int32(t.Minute()), int32(t.Second()), int32(t.Nanosecond() / int(time.Millisecond))}
}

func (r Record) stampOrTime() stamp {
	if r.stamp.set {
		return r.stamp
	}
	return stampOf(r.Time)
}

// Line renders r as MPS writes it: "[2026-11-29 19:34:42.913 Control  8578]
// message\n". As NVIDIA's daemon does, it prints the text as a C string
// with a newline appended unless the text ends with one: text from a NUL
// byte on is not printed, and (the newline being appended after the text)
// neither is the newline then.
func (r Record) Line() string {
	s := r.stampOrTime()
	msg := r.Msg
	if i := strings.IndexByte(msg, 0); i >= 0 {
		msg = msg[:i]
	} else if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	return fmt.Sprintf("[%d-%02d-%02d %02d:%02d:%02d.%03d %s %5d] %s",
		s.year, s.month, s.day, s.hour, s.min, s.sec, s.ms, r.Kind, int32(r.PID), msg)
}

const (
	magic      = 0xabcde000
	endMagic   = 0xedcba000
	magicMask  = 0xffffff00
	headerSize = 48
	// MaxMsg bounds a record's text so a whole record stays below PIPE_BUF
	// and reaches the FIFO in one atomic write. NVIDIA's daemon cuts its
	// own records' text there too (a 4095-byte command is logged as its
	// first 4044 bytes after "Cmd:").
	MaxMsg = 4096 - headerSize
)

// Encode lays r out as NVIDIA's daemon does: twelve little-endian uint32
// (magic|kind, pid, year, month, day, 0, hour, minute, second, millisecond,
// text length, 0) followed by the text without terminator.
func (r Record) Encode() []byte {
	msg := r.Msg
	if len(msg) > MaxMsg {
		msg = msg[:MaxMsg]
	}
	return r.header(magic|uint32(r.Kind&0xff), uint64(len(msg)), msg)
}

// End is the header NVIDIA's daemon writes into its own FIFO when it exits,
// after its last line: its logger thread stops at it (a bad magic, to the
// reader) and the daemon, which waits for that thread, then exits. Should
// the logger be inside a record that has not ended, it never gets there,
// and the daemon never exits.
func End(pid int, t time.Time) []byte {
	return Record{PID: pid, Time: t}.header(endMagic, 0, "")
}

func (r Record) header(first uint32, n uint64, msg string) []byte {
	s := r.stampOrTime()
	h := []uint32{
		first, uint32(r.PID), uint32(s.year), uint32(s.month), uint32(s.day), 0,
		uint32(s.hour), uint32(s.min), uint32(s.sec), uint32(s.ms), uint32(n), uint32(n >> 32),
	}
	b := make([]byte, headerSize, headerSize+len(msg))
	for i, v := range h {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return append(b, msg...)
}

// ReadRecord reads one record from a FIFO stream as NVIDIA's logger thread
// does. That thread takes the header's last eight bytes as the text's
// length and waits for that much text, whatever comes, with room for about
// 6 KiB of it (Room): a longer record kills its daemon (ErrOverrun) once
// enough of its text has come in. So a header declaring 4 GiB swallows
// everything written after it, the daemon's own records included, until
// the daemon dies about 6 KiB later. ReadRecord holds at most room.Line
// bytes of text, never the declared length. A header that is no record's
// is ErrBadRecord; anything else that stops the stream, its error.
//
// NVIDIA's logger, given a length of 2^38 or more, either waits like this
// or stops (as at a bad header), at random from run to run; ReadRecord
// always waits.
func ReadRecord(rd io.Reader, room Room) (Record, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(rd, h[:]); err != nil {
		return Record{}, err
	}
	u := func(i int) uint32 { return binary.LittleEndian.Uint32(h[4*i:]) }
	first := u(0)
	if first&magicMask != magic || Kind(first&0xff) > LegacyServer {
		return Record{}, ErrBadRecord
	}
	n := uint64(u(10)) | uint64(u(11))<<32
	if n > uint64(room.Line) {
		// Wait for the text, keeping none of it, until it overruns.
		fatal := min(n, uint64(room.Read)+1)
		got, err := io.CopyN(io.Discard, rd, int64(fatal))
		if uint64(got) == fatal {
			return Record{}, fmt.Errorf("%w: %d bytes of text declared, %d came, room for %d", ErrOverrun, n, got, room.Line)
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Record{}, err
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(rd, msg); err != nil {
		return Record{}, err
	}
	i32 := func(i int) int32 { return int32(u(i)) }
	st := stamp{true, i32(2), i32(3), i32(4), i32(6), i32(7), i32(8), i32(9)}
	// Time, for callers that want one; rendering uses the fields as read.
	t := time.Date(int(st.year), time.Month(st.month), int(st.day), int(st.hour), int(st.min), int(st.sec),
		int(st.ms)*int(time.Millisecond), time.Local)
	return Record{Kind: Kind(first & 0xff), PID: int(i32(1)), Time: t, Msg: string(msg), stamp: st}, nil
}

// Sink writes lines: Control records to one writer, the rest to another. A
// nil writer drops its lines (a daemon whose log directory is unusable). It
// is safe for concurrent use.
type Sink struct {
	mu      sync.Mutex
	control io.Writer
	server  io.Writer
}

// NewSink returns a sink writing control lines to control and others to
// server; -f passes os.Stdout for both.
func NewSink(control, server io.Writer) *Sink { return &Sink{control: control, server: server} }

// Write writes r's line to the writer its kind selects. Write errors are
// dropped: the real daemon keeps running when its log disk is full.
func (s *Sink) Write(r Record) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.server
	if r.Kind == Control {
		w = s.control
	}
	if w != nil {
		_, _ = io.WriteString(w, r.Line())
	}
}

// Logf writes a Control line stamped now with pid.
func (s *Sink) Logf(pid int, format string, args ...any) {
	s.Write(Record{Kind: Control, PID: pid, Time: time.Now(), Msg: fmt.Sprintf(format, args...)})
}

// Pump is NVIDIA's logger thread: it copies records from a FIFO into the
// sink (room as for ReadRecord) until one is bad or overruns, or rd
// fails, and returns why it stopped: ErrBadRecord (the daemon's end of
// log, or anyone's bad header: either way nothing is logged any more),
// ErrOverrun (the daemon must crash), or rd's error.
func (s *Sink) Pump(rd io.Reader, room Room) error {
	for {
		r, err := ReadRecord(rd, room)
		if err != nil {
			return err
		}
		s.Write(r)
	}
}

// SendFIFO writes one record to the daemon's log FIFO at path without
// blocking. It fails (ENXIO) when no daemon has the FIFO open for reading,
// which callers ignore: without a daemon there is nobody to log for.
func SendFIFO(path string, r Record) error {
	return sendFIFO(path, r.Encode(), false)
}

// WriteFIFO writes one record to the daemon's log FIFO at path as
// NVIDIA's control program does when it announces itself to a running
// daemon: the FIFO is opened without blocking (ENXIO when no daemon reads
// it), then written to blocking, so a FIFO nobody drains (its daemon's
// logger stopped at a bad record) holds the writer until there is room.
func WriteFIFO(path string, r Record) error {
	return sendFIFO(path, r.Encode(), true)
}

// WriteRaw writes b to the FIFO at path without blocking, as any process
// that may open it can: a test's forged bytes. It returns how many bytes
// went in (a full FIFO takes part or none: EAGAIN).
func WriteRaw(path string, b []byte) (int, error) {
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("mpslog: open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	n := 0
	for n < len(b) {
		m, err := syscall.Write(fd, b[n:])
		if err != nil {
			return n, fmt.Errorf("mpslog: write %s: %w", path, err)
		}
		n += m
	}
	return n, nil
}

func sendFIFO(path string, b []byte, block bool) error {
	// Raw system calls, not os.File: Go's poller would wait on a full FIFO,
	// and a log line must never stall an MPS process that does not wait
	// as NVIDIA's do.
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("mpslog: open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	if block {
		if err := syscall.SetNonblock(fd, false); err != nil {
			return fmt.Errorf("mpslog: %s: %w", path, err)
		}
	}
	if _, err := syscall.Write(fd, b); err != nil {
		return fmt.Errorf("mpslog: write %s: %w", path, err)
	}
	return nil
}
