// Package sdnotify is mpsd's systemd integration (examples/systemd/):
// Type=notify (READY=1, STATUS=, STOPPING=1, WATCHDOG=1) and socket
// activation of the API socket, both through go-systemd. Without
// NOTIFY_SOCKET and LISTEN_FDS all of it is a no-op. It knows the daemon
// only as a Target; cmd/mpsd wires the two.
package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
)

const (
	// defaultStatusInterval is how often STATUS= is refreshed (when the
	// summary changed).
	defaultStatusInterval = 5 * time.Second
	// maxHealthTimeout bounds the health check before each watchdog ping.
	maxHealthTimeout = 5 * time.Second
)

// ActivationListener returns the API socket systemd passed in (socket
// activation with mpsd.socket), or nil when mpsd was not socket-activated.
// mpsd takes exactly one socket, a listening unix stream socket; anything
// else is an error that names what was passed. It unsets LISTEN_PID,
// LISTEN_FDS and LISTEN_FDNAMES, and the fd is close-on-exec, so the MPS
// daemons inherit neither.
func ActivationListener(log *slog.Logger) (net.Listener, error) {
	lns, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	closeAll := func() {
		for _, ln := range lns {
			if ln != nil {
				_ = ln.Close()
			}
		}
	}
	switch {
	case len(lns) == 0:
		return nil, nil
	case len(lns) > 1:
		closeAll()
		return nil, fmt.Errorf("socket activation: systemd passed %d sockets (LISTEN_FDS=%d); mpsd takes exactly one, its API socket: give mpsd.socket a single ListenStream=", len(lns), len(lns))
	case lns[0] == nil:
		// go-systemd leaves a nil for an fd net.FileListener refused: a
		// file, a pipe, a socket of a family Go does not know. (It takes
		// datagram and non-listening sockets: see below.)
		return nil, errors.New("socket activation: the fd systemd passed is not a listening stream socket; mpsd.socket needs ListenStream=/run/mpsd/mpsd.sock")
	}
	ln := lns[0]
	if ln.Addr().Network() != "unix" {
		closeAll()
		return nil, fmt.Errorf("socket activation: systemd passed a %s socket (%s); mpsd's API needs a unix stream socket: ListenStream=/run/mpsd/mpsd.sock in mpsd.socket", ln.Addr().Network(), ln.Addr())
	}
	if !listening(ln) {
		closeAll()
		return nil, fmt.Errorf("socket activation: the unix socket systemd passed (%s) does not listen; mpsd.socket needs ListenStream= and Accept=no", ln.Addr())
	}
	log.Info("API socket from systemd (socket activation)", "socket", ln.Addr().String())
	return ln, nil
}

// listening reports whether ln's socket accepts connections
// (SO_ACCEPTCONN); net.FileListener takes any stream socket.
func listening(ln net.Listener) bool {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var v int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		v, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	}); err != nil || serr != nil {
		return false
	}
	return v == 1
}

// Target is what the notifier reports on: the daemon (*mpsd.Daemon), or
// a fake.
type Target interface {
	// Summary is the one-line STATUS=.
	Summary() string
	// Healthy gates each watchdog ping.
	Healthy(ctx context.Context) error
}

// Notifier speaks systemd's notify protocol for a Type=notify service.
// A nil *Notifier (no NOTIFY_SOCKET) does nothing.
type Notifier struct {
	log *slog.Logger
	// statusEvery is how often STATUS= is refreshed.
	statusEvery time.Duration
	// watchdog is WatchdogSec= (from WATCHDOG_USEC); 0 means no pings.
	watchdog time.Duration
	// mu orders messages from the loop and the stop, and guards failed.
	mu sync.Mutex
	// failed: a message could not be sent (reported once).
	failed bool
	// skipping: the last watchdog ping was skipped.
	skipping bool
}

// New returns a notifier when mpsd runs under systemd with
// NOTIFY_SOCKET (Type=notify), else nil. statusEvery <= 0 means the
// default.
func New(log *slog.Logger, statusEvery time.Duration) *Notifier {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	if statusEvery <= 0 {
		statusEvery = defaultStatusInterval
	}
	n := &Notifier{log: log, statusEvery: statusEvery}
	// WATCHDOG_PID names another process (the variables were inherited):
	// 0, no pings.
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog settings unusable; not pinging", "err", err)
	}
	n.watchdog = wd
	if wd > 0 {
		log.Info("systemd watchdog enabled", "timeout", wd, "ping_every", wd/2)
	}
	return n
}

// Notify sends one message (newline-separated assignments).
func (n *Notifier) Notify(state string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	ok, err := daemon.SdNotify(false, state)
	if err == nil && ok {
		if n.failed {
			n.log.Info("systemd notifications delivered again")
			n.failed = false
		}
		return
	}
	if !n.failed {
		n.log.Warn("systemd notification not delivered", "socket", os.Getenv("NOTIFY_SOCKET"), "err", err)
		n.failed = true
	}
}

// StatusLine is a STATUS= assignment; the value must stay on one line.
func StatusLine(s string) string {
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}

// healthTimeout is how long Healthy may take before a ping is skipped: a
// quarter of the watchdog interval (so a ping still lands well within it),
// at most maxHealthTimeout.
func (n *Notifier) healthTimeout() time.Duration {
	return min(n.watchdog/4, maxHealthTimeout)
}

// Run runs run (Daemon.Run) under systemd: STATUS= now and every
// statusEvery, READY=1 when ready is closed, WATCHDOG=1 from then on while
// t is healthy, and, when ctx ends, STOPPING=1 before it cancels run's
// context, so systemd hears of the stop before mpsd begins it (and so
// before Run returns). The stop does not wait for the notifier loop, which
// may be stuck on a wedged daemon. Every goroutine it starts has ended
// when it returns. A nil n just runs run.
func (n *Notifier) Run(ctx context.Context, t Target, ready <-chan struct{}, run func(context.Context) error) error {
	if n == nil {
		return run(ctx)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	stopped := make(chan struct{})
	cancelStop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		n.Notify(daemon.SdNotifyStopping + "\n" + StatusLine("stopping; MPS daemons and workloads keep running"))
		stop()
	})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		n.loop(runCtx, t, ready)
	}()
	err := run(runCtx)
	if cancelStop() {
		// Run returned on its own: mpsd is going away all the same.
		n.Notify(daemon.SdNotifyStopping)
	} else {
		<-stopped
	}
	stop()
	<-loopDone
	if err != nil {
		n.Notify(StatusLine("mpsd failed: " + err.Error()))
	}
	return err
}

// loop is Run's notifier of status, readiness and health; it returns when
// runCtx ends.
func (n *Notifier) loop(runCtx context.Context, t Target, ready <-chan struct{}) {
	n.Notify(StatusLine("starting"))
	status := time.NewTicker(n.statusEvery)
	defer status.Stop()
	var pinger *time.Ticker // every half watchdog interval, once ready
	var pings <-chan time.Time
	defer func() {
		if pinger != nil {
			pinger.Stop()
		}
	}()
	last := ""
	for {
		select {
		case <-runCtx.Done():
			return
		case <-ready:
			ready = nil
			last = t.Summary()
			n.Notify(daemon.SdNotifyReady + "\n" + StatusLine(last))
			if n.watchdog > 0 {
				// systemd arms the watchdog once start-up is over (READY=1);
				// before that Healthy would fail anyway (not serving yet).
				pinger = time.NewTicker(n.watchdog / 2)
				pings = pinger.C
			}
		case <-status.C:
			if s := t.Summary(); s != last {
				last = s
				n.Notify(StatusLine(s))
			}
		case <-pings:
			n.ping(runCtx, t.Healthy)
		}
	}
}

// ping sends WATCHDOG=1 if healthy answers nil within healthTimeout, and
// reports whether it did. A skipped ping is logged: enough of them in a
// row and systemd kills and restarts mpsd (which, with KillMode=process,
// re-adopts its instances and leases).
func (n *Notifier) ping(ctx context.Context, healthy func(context.Context) error) bool {
	hctx, cancel := context.WithTimeout(ctx, n.healthTimeout())
	defer cancel()
	if err := healthy(hctx); err != nil {
		if ctx.Err() == nil {
			n.log.Warn("systemd watchdog ping skipped: mpsd is not healthy", "err", err, "watchdog", n.watchdog)
			n.skipping = true
		}
		return false
	}
	if n.skipping {
		n.log.Info("systemd watchdog pings resumed: mpsd is healthy again")
		n.skipping = false
	}
	n.Notify(daemon.SdNotifyWatchdog)
	return true
}
