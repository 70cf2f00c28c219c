package mpsd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mpsd/mpsd/mps"
)

// fakeControl is a control daemon without a process: a test sends its
// events (send), ends it (exit) and reads the commands it was given.
type fakeControl struct {
	pid    int
	pipe   string
	events chan mps.Event
	done   chan struct{}

	mu       sync.Mutex
	exited   bool
	closed   bool
	commands []string
	stops    int
}

var _ control = (*fakeControl)(nil)

func newFakeControl(pid int, pipe string) *fakeControl {
	return &fakeControl{pid: pid, pipe: pipe, events: make(chan mps.Event, 64), done: make(chan struct{})}
}

func (f *fakeControl) PID() int { return f.pid }
func (f *fakeControl) Identity() mps.DaemonIdentity {
	return mps.DaemonIdentity{PID: f.pid, StartTime: uint64(f.pid)}
}
func (f *fakeControl) PipeDir() string                  { return f.pipe }
func (f *fakeControl) String() string                   { return fmt.Sprintf("fake control daemon %d", f.pid) }
func (f *fakeControl) Events() <-chan mps.Event         { return f.events }
func (f *fakeControl) Done() <-chan struct{}            { return f.done }
func (f *fakeControl) ServerLogStart() int64            { return 0 }
func (f *fakeControl) WrittenUnwatched(int64) bool      { return false }
func (f *fakeControl) LogSilentSince() (time.Time, int) { return time.Time{}, 0 }

func (f *fakeControl) Exited() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exited
}

// Barrier: every event sent before it has been read by then (the events
// channel is the only queue).
func (f *fakeControl) Barrier() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

func (f *fakeControl) Probe(ctx context.Context) error {
	if f.Exited() {
		return mps.ErrNoDaemon
	}
	return ctx.Err()
}

func (f *fakeControl) Check() error {
	if f.Exited() {
		return mps.ErrNoDaemon
	}
	return nil
}

func (f *fakeControl) record(cmd string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.exited {
		return mps.ErrNoDaemon
	}
	f.commands = append(f.commands, cmd)
	return nil
}

func (f *fakeControl) Command(_ context.Context, line string) (string, error) {
	return "", f.record(line)
}

func (f *fakeControl) ShutdownServer(_ context.Context, pid int, force bool) error {
	return f.record(fmt.Sprintf("shutdown_server %d force=%v", pid, force))
}

func (f *fakeControl) ClientList(context.Context, int) ([]int, error) {
	return nil, f.record("get_client_list")
}

func (f *fakeControl) ReportedServerStatus(_ context.Context, pid int) (mps.ServerState, error) {
	if err := f.record(fmt.Sprintf("get_server_status %d", pid)); err != nil {
		return mps.StateUnknown, err
	}
	return mps.StateActive, nil
}

func (f *fakeControl) TerminateClient(_ context.Context, server, client int) error {
	return f.record(fmt.Sprintf("terminate_client %d %d", server, client))
}

func (f *fakeControl) ServerCaps(context.Context, int, int) (mps.ServerCaps, error) {
	return mps.ServerCaps{}, f.record("server caps")
}

func (f *fakeControl) SetServerCaps(_ context.Context, pid int, p float64, _ []int64) (mps.ServerCaps, error) {
	return mps.ServerCaps{}, f.record(fmt.Sprintf("set caps %d %v", pid, p))
}

func (f *fakeControl) SetDefaults(_ context.Context, p float64, mem int64, _ int) error {
	return f.record(fmt.Sprintf("set defaults %v %d", p, mem))
}

// exit ends the fake daemon as its process's death would: a DaemonExited
// event, then Done.
func (f *fakeControl) exit(status int) {
	f.mu.Lock()
	if f.exited {
		f.mu.Unlock()
		return
	}
	f.exited = true
	f.mu.Unlock()
	f.events <- mps.Event{Kind: mps.DaemonExited, PID: f.pid, UID: 0, ExitStatus: status, Source: mps.SourcePidfd}
	close(f.done)
}

func (f *fakeControl) Stop(context.Context) (mps.StopReport, error) {
	f.mu.Lock()
	f.stops++
	already := f.exited
	f.exited = true
	f.mu.Unlock()
	if !already {
		close(f.done)
	}
	return mps.StopReport{Graceful: !already, AlreadyExited: already}, nil
}

func (f *fakeControl) stopCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stops
}

func (f *fakeControl) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.events)
	}
	return nil
}

// fakeStarter hands out fake control daemons: each Start or Adopt takes
// the next outcome from outcomes (an error, or nil for a new daemon) and
// is reported on calls.
type fakeStarter struct {
	mu       sync.Mutex
	outcomes []error
	next     int
	started  []*fakeControl
	calls    chan string
}

var errFakeStart = errors.New("fake control daemon: start failed")

func (s *fakeStarter) bring(how string, cfg mps.Config) (control, error) {
	s.mu.Lock()
	var err error
	if len(s.outcomes) > 0 {
		err, s.outcomes = s.outcomes[0], s.outcomes[1:]
	}
	var fc *fakeControl
	if err == nil {
		s.next++
		fc = newFakeControl(1000+s.next, cfg.PipeDir)
		s.started = append(s.started, fc)
	}
	s.mu.Unlock()
	s.calls <- how
	if err != nil {
		return nil, err
	}
	return fc, nil
}

func (s *fakeStarter) Start(_ context.Context, cfg mps.Config) (control, error) {
	return s.bring("start", cfg)
}

func (s *fakeStarter) Adopt(context.Context, mps.Config) (control, error) {
	s.calls <- "adopt"
	return nil, mps.ErrNoDaemon
}

func (s *fakeStarter) Reclaim(context.Context, mps.Config) (mps.StopReport, error) {
	s.calls <- "reclaim"
	return mps.StopReport{}, mps.ErrNoDaemon
}

func (s *fakeStarter) daemon(i int) *fakeControl {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started[i]
}
