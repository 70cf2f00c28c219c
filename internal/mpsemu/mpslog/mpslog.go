package mpslog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"
)

// Kind says which MPS process wrote a line; it selects the file and the
// word in the line's bracket.
type Kind uint32

// Kinds seen in NVIDIA's logs and record headers (NVIDIA's 550 daemon
// renders 0 Control, 1 Server, 2 Client, 3 Other, 4 Legacy Server). Control
// lines go to control.log, everything else to server.log. A server writes
// its start-up lines as Other and the rest as Server (docs/gpu-probe).
const (
	Control Kind = 0
	Server  Kind = 1
	Other   Kind = 3
)

func (k Kind) String() string {
	switch k {
	case Control:
		return "Control"
	case Server:
		return "Server"
	}
	return "Other"
}

// ErrBadRecord is returned by ReadRecord for bytes that are not an MPS log
// record.
var ErrBadRecord = errors.New("mpslog: not an MPS log record")

// Record is one log message with its time of writing and writer's pid.
type Record struct {
	Kind Kind
	PID  int
	Time time.Time
	Msg  string
}

// Line renders r as MPS writes it, newline included:
// "[2026-11-29 19:34:42.913 Control  8578] message\n".
func (r Record) Line() string {
	t := r.Time
	return fmt.Sprintf("[%d-%02d-%02d %02d:%02d:%02d.%03d %s %5d] %s\n",
		t.Year(), int(t.Month()), t.Day(), t.Hour(), t.Minute(), t.Second(),
		t.Nanosecond()/int(time.Millisecond), r.Kind, r.PID, r.Msg)
}

const (
	magic      = 0xabcde000
	magicMask  = 0xffffff00
	headerSize = 48
	// MaxMsg bounds a record's text so a whole record stays below PIPE_BUF
	// and reaches the FIFO in one atomic write.
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
	t := r.Time
	h := []uint32{
		magic | uint32(r.Kind&0xff), uint32(r.PID), uint32(t.Year()), uint32(t.Month()),
		uint32(t.Day()), 0, uint32(t.Hour()), uint32(t.Minute()), uint32(t.Second()),
		uint32(t.Nanosecond() / int(time.Millisecond)), uint32(len(msg)), 0,
	}
	b := make([]byte, headerSize, headerSize+len(msg))
	for i, v := range h {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return append(b, msg...)
}

// ReadRecord reads one record from a FIFO stream.
func ReadRecord(rd io.Reader) (Record, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(rd, h[:]); err != nil {
		return Record{}, err
	}
	u := func(i int) int { return int(binary.LittleEndian.Uint32(h[4*i:])) }
	first := binary.LittleEndian.Uint32(h[:])
	if first&magicMask != magic {
		return Record{}, ErrBadRecord
	}
	n := u(10)
	if n > MaxMsg {
		return Record{}, fmt.Errorf("%w: text length %d", ErrBadRecord, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(rd, msg); err != nil {
		return Record{}, err
	}
	t := time.Date(u(2), time.Month(u(3)), u(4), u(6), u(7), u(8), u(9)*int(time.Millisecond), time.Local)
	return Record{Kind: Kind(first & 0xff), PID: u(1), Time: t, Msg: string(msg)}, nil
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

// Pump copies records from a FIFO into the sink until rd fails; it returns
// the error that stopped it (io.EOF or a closed file when the daemon exits).
func (s *Sink) Pump(rd io.Reader) error {
	for {
		r, err := ReadRecord(rd)
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
	// Raw system calls, not os.File: Go's poller would wait on a full FIFO,
	// and a log line must never stall an MPS process.
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("mpslog: open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	if _, err := syscall.Write(fd, r.Encode()); err != nil {
		return fmt.Errorf("mpslog: write %s: %w", path, err)
	}
	return nil
}
