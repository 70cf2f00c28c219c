package mpsd

import (
	"context"
	"time"

	"github.com/mpsd/mpsd/mps"
)

// control is what mpsd asks of one running MPS control daemon: its
// commands, its identity, its events and its end. *mps.Daemon is the
// real one (a control binary's process, its pipe directory and logs); a
// test may put a fake in its place. Every method is safe for concurrent
// use, and none holds mpsd's locks: callers never hold Daemon.mu across
// one that talks to the daemon.
type control interface {
	// Identity and configuration.
	PID() int
	Identity() mps.DaemonIdentity
	PipeDir() string
	String() string

	// Life: events in order until the handle closes, the daemon's exit,
	// its probe, stop and close.
	Events() <-chan mps.Event
	Done() <-chan struct{}
	Exited() bool
	Barrier() <-chan struct{}
	Probe(ctx context.Context) error
	Check() error
	Stop(ctx context.Context) (mps.StopReport, error)
	Close() error

	// MPS's control commands.
	Command(ctx context.Context, line string) (string, error)
	ShutdownServer(ctx context.Context, pid int, force bool) error
	ClientList(ctx context.Context, serverPID int) ([]int, error)
	ReportedServerStatus(ctx context.Context, pid int) (mps.ServerState, error)
	TerminateClient(ctx context.Context, serverPID, clientPID int) error
	ServerCaps(ctx context.Context, serverPID, devices int) (mps.ServerCaps, error)
	SetServerCaps(ctx context.Context, serverPID int, p float64, memBytes []int64) (mps.ServerCaps, error)
	SetDefaults(ctx context.Context, p float64, memBytes int64, devices int) error

	// The server log and the control log's liveness (loglost.go).
	ServerLogStart() int64
	WrittenUnwatched(offset int64) bool
	LogSilentSince() (since time.Time, probes int)
}

// starter brings a control daemon up: Start runs a new one, Adopt takes
// the verified one already serving the pipe directory, Reclaim stops
// whatever verified daemon holds it. The mps package's functions are the
// real one.
type starter interface {
	Start(ctx context.Context, cfg mps.Config) (control, error)
	Adopt(ctx context.Context, cfg mps.Config) (control, error)
	Reclaim(ctx context.Context, cfg mps.Config) (mps.StopReport, error)
}

var _ control = (*mps.Daemon)(nil)

// mpsStarter is the starter of real control daemons.
type mpsStarter struct{}

func (mpsStarter) Start(ctx context.Context, cfg mps.Config) (control, error) {
	return asControl(mps.Start(ctx, cfg))
}

func (mpsStarter) Adopt(ctx context.Context, cfg mps.Config) (control, error) {
	return asControl(mps.Adopt(ctx, cfg))
}

func (mpsStarter) Reclaim(ctx context.Context, cfg mps.Config) (mps.StopReport, error) {
	return mps.Reclaim(ctx, cfg)
}

// asControl keeps a nil *mps.Daemon a nil control.
func asControl(dm *mps.Daemon, err error) (control, error) {
	if dm == nil {
		return nil, err
	}
	return dm, err
}

// after is time.After on mpsd's clock.
func (d *Daemon) after(dur time.Duration) <-chan time.Time { return d.clock.NewTimer(dur).C() }
