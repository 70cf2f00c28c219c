package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/mpsemu/cstr"
	"github.com/mpsd/mpsd/internal/mpsemu/emuwire"
)

// CUDA error numbers.
const (
	ErrMemoryAllocation  = 2
	ErrNoDevice          = 100
	ErrInvalidDevice     = 101
	ErrIllegalAddress    = 700
	ErrConnectionFailed  = 805
	ErrRPCFailure        = 806
	ErrServerNotReady    = 807
	ErrMaxClientsReached = 808
	ErrClientTerminated  = 810
)

var names = map[int]string{
	ErrMemoryAllocation:  "cudaErrorMemoryAllocation",
	ErrNoDevice:          "cudaErrorNoDevice",
	ErrInvalidDevice:     "cudaErrorInvalidDevice",
	ErrIllegalAddress:    "cudaErrorIllegalAddress",
	ErrConnectionFailed:  "cudaErrorMpsConnectionFailed",
	ErrRPCFailure:        "cudaErrorMpsRpcFailure",
	ErrServerNotReady:    "cudaErrorMpsServerNotReady",
	ErrMaxClientsReached: "cudaErrorMpsMaxClientsReached",
	ErrClientTerminated:  "cudaErrorMpsClientTerminated",
}

var exitCodes = map[int]int{
	ErrMemoryAllocation: 12, ErrNoDevice: 30, ErrInvalidDevice: 31, ErrIllegalAddress: 70,
	ErrConnectionFailed: 85, ErrRPCFailure: 86, ErrServerNotReady: 87,
	ErrMaxClientsReached: 88, ErrClientTerminated: 90,
}

// Name returns the CUDA runtime's name of error code.
func Name(code int) string {
	if n, ok := names[code]; ok {
		return n
	}
	return "cudaErrorUnknown"
}

// ExitCode is the process exit status for CUDA error code (doc.go's table).
func ExitCode(code int) int {
	if c, ok := exitCodes[code]; ok {
		return c
	}
	return 1
}

// Error is a CUDA error the client ran into.
type Error struct {
	Code   int
	Detail string
}

func (e *Error) Error() string {
	return fmt.Sprintf("CUDA error %d %s: %s", e.Code, Name(e.Code), e.Detail)
}

func cudaErr(code int, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Options is what one client run does.
type Options struct {
	PipeDir string
	// PID is the pid the client tells the daemon and the server it is
	// (its own, unless --claim-pid names another): MPS lists what it was
	// told, as NVIDIA's does.
	PID       int
	EnvSM     string // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE as set, "" if unset
	EnvPinned string // CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as set
	// EnvVisible is CUDA_VISIBLE_DEVICES as set, HasVisible whether it is:
	// the client sees the server's devices it selects (indexes are the
	// server's, 0..n-1), and its pinned limits are relative to them.
	EnvVisible  string
	HasVisible  bool
	Alloc       uint64 // bytes to allocate, 0 for none
	AllocDevice int
	Duration    time.Duration // how long to stay connected after setup
	FaultAfter  time.Duration // raise a fatal fault after this long; 0: never
	// FaultNow raises a fatal fault when it receives (once), so a test
	// can fault a client at the moment it chooses; nil: never.
	FaultNow <-chan struct{}
	// HoldOnFault: a fault the server reports (the sticky error) does not
	// end the client; it stays connected for the rest of Duration, as a
	// process that catches the error and hangs on does (MPS keeps its
	// server in FAULT until it has gone).
	HoldOnFault bool
	// Connected, when set, runs once the server has taken the client
	// (before its limits line); an error ends the client with it.
	Connected func() error
}

// Run connects, reports the limits on out and behaves as opts say. It
// returns nil, an *Error, or ctx's error when ctx ended first.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	conn, welcome, err := connect(ctx, opts)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if len(welcome.UUIDs) == 0 {
		return cudaErr(ErrNoDevice, "CUDA_VISIBLE_DEVICES selects no device")
	}
	if opts.Connected != nil {
		if err := opts.Connected(); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, limitsLine(opts.PID, welcome))

	msgs := make(chan emuwire.Msg)
	readErr := make(chan error, 1)
	readerDone := make(chan struct{})
	quit := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			m, err := conn.Recv()
			if err != nil {
				readErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-quit:
				return
			}
		}
	}()
	// The reader ends when conn closes or Run returns.
	defer func() { close(quit); conn.Close(); <-readerDone }()

	// event turns what the server says (or its going away) into an error.
	event := func(m emuwire.Msg) error {
		switch m.Op {
		case emuwire.OpFault:
			return cudaErr(ErrIllegalAddress, "a fatal GPU exception was reported by the MPS server")
		case emuwire.OpTerminated:
			return cudaErr(ErrClientTerminated, "terminated by the MPS control daemon")
		}
		return nil
	}
	lost := func(err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return cudaErr(ErrRPCFailure, "lost the MPS server: %v", err)
	}

	if opts.Alloc > 0 {
		if opts.AllocDevice < 0 || opts.AllocDevice >= len(welcome.UUIDs) {
			return cudaErr(ErrInvalidDevice, "device %d of %d", opts.AllocDevice, len(welcome.UUIDs))
		}
		if err := conn.Send(emuwire.Msg{Op: emuwire.OpAlloc, Dev: opts.AllocDevice, Bytes: opts.Alloc}); err != nil {
			return lost(err)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case err := <-readErr:
				return lost(err)
			case m := <-msgs:
				switch m.Op {
				case emuwire.OpOK:
					fmt.Fprintf(out, "mpsemu-client: allocated %d bytes on device %d\n", opts.Alloc, opts.AllocDevice)
					break wait
				case emuwire.OpError:
					return cudaErr(m.Err, "allocating %d bytes on device %d (limit %d): %s",
						opts.Alloc, opts.AllocDevice, welcome.Mem[opts.AllocDevice], m.Text)
				default:
					if err := event(m); err != nil {
						return err
					}
				}
			}
		}
	}

	if opts.Duration == 0 && opts.FaultAfter == 0 && opts.FaultNow == nil {
		return nil
	}
	faultNow := opts.FaultNow
	var durC, faultC <-chan time.Time
	if opts.Duration > 0 {
		t := time.NewTimer(opts.Duration)
		defer t.Stop()
		durC = t.C
	}
	if opts.FaultAfter > 0 {
		t := time.NewTimer(opts.FaultAfter)
		defer t.Stop()
		faultC = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-durC:
			return nil
		case <-faultC:
			if err := conn.Send(emuwire.Msg{Op: emuwire.OpFault}); err != nil {
				return lost(err)
			}
		case <-faultNow:
			faultNow = nil
			if err := conn.Send(emuwire.Msg{Op: emuwire.OpFault}); err != nil {
				return lost(err)
			}
		case err := <-readErr:
			return lost(err)
		case m := <-msgs:
			if err := event(m); err != nil {
				if opts.HoldOnFault && m.Op == emuwire.OpFault {
					fmt.Fprintf(out, "mpsemu-client: %v; holding on\n", err)
					continue
				}
				return err
			}
		}
	}
}

func limitsLine(pid int, w emuwire.Msg) string {
	var b strings.Builder
	fmt.Fprintf(&b, "mpsemu-client: pid=%d server=%d sm=%s devices=%d", pid, w.ServerPID, cstr.FormatPercent(w.SM), len(w.UUIDs))
	for i, m := range w.Mem {
		fmt.Fprintf(&b, " mem%d=%dM", i, m>>20)
	}
	return b.String()
}

// recv reads one message, giving up when ctx ends.
func recv(ctx context.Context, c *emuwire.Conn) (emuwire.Msg, error) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	m, err := c.Recv()
	if err != nil && ctx.Err() != nil {
		return m, ctx.Err()
	}
	return m, err
}

// connect finds a server the way a CUDA client does: ask the control daemon,
// which may keep the client pending (another uid's server, or one being
// started); without an emulated daemon, go to the server directly. Like the
// CUDA driver on a real GPU (docs/gpu-probe), it first opens a connection
// that sends no credentials, then asks once per context (two): the daemon
// logs "User did not send valid credentials" and two "NEW CLIENT" lines.
func connect(ctx context.Context, opts Options) (*emuwire.Conn, emuwire.Msg, error) {
	// The emulator's own sockets are abstract, which no file permission
	// guards; a real client reaches MPS through the pipe directory's
	// files. So the pipe directory's permissions are checked as the kernel
	// would check them for a real client: a caller who may not enter it
	// cannot connect.
	if opts.PipeDir != "" {
		if err := unix.Access(opts.PipeDir, unix.X_OK); errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return nil, emuwire.Msg{}, cudaErr(ErrConnectionFailed, "MPS control daemon: %s: %v", opts.PipeDir, err)
		}
	}
	addr := emuwire.AnyServerSocket(opts.PipeDir)
	if d, err := emuwire.Dial(emuwire.DaemonSocket(opts.PipeDir)); err == nil {
		d.Close()
		var pid int
		for range 2 {
			if pid, err = askDaemon(ctx, opts); err != nil {
				return nil, emuwire.Msg{}, err
			}
		}
		addr = emuwire.ServerSocket(opts.PipeDir, pid)
	}
	s, err := emuwire.Dial(addr)
	if err != nil {
		return nil, emuwire.Msg{}, cudaErr(ErrConnectionFailed, "no MPS server for %s: %v", opts.PipeDir, err)
	}
	err = s.Send(emuwire.Msg{Op: emuwire.OpClientHello, PID: opts.PID, EnvSM: opts.EnvSM, EnvPinned: opts.EnvPinned,
		EnvVisible: opts.EnvVisible, HasVisible: opts.HasVisible})
	var w emuwire.Msg
	if err == nil {
		w, err = recv(ctx, s)
	}
	switch {
	case ctx.Err() != nil:
		s.Close()
		return nil, emuwire.Msg{}, ctx.Err()
	case errors.Is(err, emuwire.ErrClosed), err != nil:
		s.Close()
		return nil, emuwire.Msg{}, cudaErr(ErrConnectionFailed, "MPS server: %v", err)
	case w.Op == emuwire.OpError:
		s.Close()
		return nil, emuwire.Msg{}, cudaErr(w.Err, "MPS server: %s", w.Text)
	case w.Op != emuwire.OpWelcome:
		s.Close()
		return nil, emuwire.Msg{}, cudaErr(ErrConnectionFailed, "MPS server answered %q", w.Op)
	}
	return s, w, nil
}

// askDaemon asks the emulated control daemon for a server and returns its
// pid once the daemon hands one over.
func askDaemon(ctx context.Context, opts Options) (int, error) {
	d, err := emuwire.Dial(emuwire.DaemonSocket(opts.PipeDir))
	if err != nil {
		return 0, cudaErr(ErrConnectionFailed, "MPS control daemon: %v", err)
	}
	defer d.Close()
	err = d.Send(emuwire.Msg{Op: emuwire.OpClientHello, PID: opts.PID})
	var m emuwire.Msg
	if err == nil {
		m, err = recv(ctx, d)
	}
	switch {
	case ctx.Err() != nil:
		return 0, ctx.Err()
	case err != nil:
		return 0, cudaErr(ErrConnectionFailed, "MPS control daemon: %v", err)
	case m.Op == emuwire.OpError:
		return 0, cudaErr(m.Err, "MPS control daemon: %s", m.Text)
	case m.Op != emuwire.OpReady:
		return 0, cudaErr(ErrConnectionFailed, "MPS control daemon answered %q", m.Op)
	}
	return m.ServerPID, nil
}
