package mpsd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// Listener names, the listener label of the connection metrics.
const (
	listenerAPI     = "api"
	listenerMetrics = "metrics"
)

// Where mpsd ran out of local resources, the where label of
// mpsd_local_resource_errors_total.
const (
	whereAPIAccept     = "api_accept"
	whereMetricsAccept = "metrics_accept"
	whereProbe         = "probe"
)

var localResourceWheres = []string{whereAPIAccept, whereMetricsAccept, whereProbe}

// rootExtraConnections are the API connections uid 0 may open beyond
// limits.connections, so an operator can always run mpsctl.
const rootExtraConnections = 16

// maxRefusing bounds the refused connections being answered at once;
// beyond it a refused connection is closed without an answer.
const maxRefusing = 16

// refuseWithin bounds the answer to one refused connection.
const refuseWithin = 200 * time.Millisecond

// fdReserve is how many descriptors mpsd keeps out of reach of its
// listeners for everything else it does (probes, daemons' pipes, state
// writes, cgroup files): a quarter of the limit, at least 256.
func fdReserve(nofile int) int { return max(256, nofile/4) }

// connCaps are the connection caps in force, after fitting them to the
// descriptor limit.
type connCaps struct {
	total, perUser, metrics, metricsPerUser int
}

// resources is mpsd's accounting of what outsiders make it hold and of
// its own exhaustion.
type resources struct {
	log    *slog.Logger
	nofile int
	caps   atomic.Pointer[connCaps]

	mu      sync.Mutex
	failing map[string]error // where mpsd is out of local resources now

	// admitting counts lease requests of a uid being admitted, so two at
	// once cannot both pass the queued_per_user check. Guarded by
	// Daemon.mu.
	admitting map[uint32]int
}

// newResources raises the open-file soft limit to the hard limit and
// notes the result.
func newResources(log *slog.Logger) *resources {
	r := &resources{log: log, failing: map[string]error{}, admitting: map[uint32]int{}}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the open-file limit; assuming 1024", "err", err)
		r.nofile = 1024
		return r
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil {
			log.Warn("cannot raise the open-file soft limit to the hard limit", "soft", lim.Cur, "hard", lim.Max, "err", err)
		} else {
			lim = raised
		}
	}
	r.nofile = int(min(lim.Cur, 1<<30))
	return r
}

// apply fits the config's limits to the descriptor limit and puts them in
// force, logging the numbers when they change.
func (r *resources) apply(l policy.LimitsConfig) {
	budget := r.nofile - fdReserve(r.nofile)
	c := connCaps{total: l.Connections, perUser: l.ConnectionsPerUser, metrics: l.MetricsConnections}
	clamped := false
	if c.metrics > budget/8 {
		c.metrics, clamped = max(1, budget/8), true
	}
	if most := budget - c.metrics - rootExtraConnections; c.total > most {
		c.total, clamped = max(1, most), true
	}
	if c.perUser > c.total {
		c.perUser = c.total
	}
	c.metricsPerUser = l.MetricsConnectionsPerUser
	if c.metricsPerUser <= 0 || c.metricsPerUser > c.metrics {
		c.metricsPerUser = c.metrics
	}
	if old := r.caps.Swap(&c); old != nil && *old == c {
		return
	}
	lv := slog.LevelInfo
	if clamped {
		lv = slog.LevelWarn
	}
	r.log.Log(context.Background(), lv, "connection limits", "open_files", r.nofile, "reserved_files", fdReserve(r.nofile),
		"connections", c.total, "connections_per_user", c.perUser, "metrics_connections", c.metrics,
		"metrics_connections_per_user", c.metricsPerUser,
		"queued_per_user", l.QueuedPerUser, "lowered_to_fit_open_files", clamped)
}

// isLocalResource reports whether err is mpsd's own exhaustion: out of
// file descriptors, processes, memory or socket buffers, whoever ran into
// it.
func isLocalResource(err error) bool {
	return errors.Is(err, mps.ErrLocalResources) || errors.Is(err, syscall.EMFILE) ||
		errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.EAGAIN) && !isTimeout(err)
}

// localAcceptError is an accept that failed for lack of mpsd's own
// resources, temporary whatever the errno says: http.Server backs off and
// accepts again on a temporary error, and stops serving (mpsd stops) on
// any other, which ENOMEM and ENOBUFS are to syscall.Errno.
type localAcceptError struct{ err error }

func (e localAcceptError) Error() string   { return e.err.Error() }
func (e localAcceptError) Unwrap() error   { return e.err }
func (e localAcceptError) Timeout() bool   { return false }
func (e localAcceptError) Temporary() bool { return true }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// localFailure records that mpsd is out of local resources at where; it
// reports whether that is news (not already failing there).
func (r *resources) localFailure(where string, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, was := r.failing[where]
	r.failing[where] = err
	return !was
}

// localRecovered clears where; it reports whether it was failing.
func (r *resources) localRecovered(where string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, was := r.failing[where]
	delete(r.failing, where)
	return was
}

// localTrouble describes where mpsd is out of local resources now; ""
// when nowhere.
func (r *resources) localTrouble() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for w, err := range r.failing {
		parts = append(parts, fmt.Sprintf("%s: %v", w, err))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// localResourceError is mpsd's own exhaustion seen at where: an Error
// the first time, counted every time, and /readyz fails until it passes.
func (d *Daemon) localResourceError(where string, err error) {
	d.metrics.localErrors.WithLabelValues(where).Inc()
	if d.res.localFailure(where, err) {
		d.log.Error("mpsd is out of local resources (its own file descriptors or processes, not MPS's fault)", "where", where, "err", err)
	}
}

func (d *Daemon) localResourceOK(where string) {
	if d.res.localRecovered(where) {
		d.log.Info("mpsd has local resources again", "where", where)
	}
}

// limitListener caps the connections of one listener: in all and per uid
// (on the metrics listener per uid where it is known, else per remote
// address: see metricsPeerOf). A connection over a cap is answered with a 503
// naming the cap, then closed, before anything of it is read.
type limitListener struct {
	net.Listener
	d    *Daemon
	name string // listenerAPI or listenerMetrics
	key  string // the config key of the total cap
	wa   string // where label of accept failures

	mu     sync.Mutex
	open   int
	byUID  map[uint32]int
	byPeer map[metricsPeer]int // the metrics listener's

	refusing chan struct{}         // one token per refused connection being answered
	answer   map[net.Conn]struct{} // those connections; guarded by mu
	closed   bool                  // guarded by mu
	wg       sync.WaitGroup
	// Used by the Accept goroutine only.
	lastWarn, lastRefuse time.Time
}

func (d *Daemon) limitListener(ln net.Listener, name string) *limitListener {
	l := &limitListener{Listener: ln, d: d, name: name, byUID: map[uint32]int{}, byPeer: map[metricsPeer]int{},
		refusing: make(chan struct{}, maxRefusing), answer: map[net.Conn]struct{}{}}
	l.key, l.wa = "limits.connections", whereAPIAccept
	if name == listenerMetrics {
		l.key, l.wa = "limits.metrics_connections", whereMetricsAccept
	}
	return l
}

// Accept returns the next connection within the caps. Its own errors are
// returned for http.Server, which backs off on temporary ones; running out
// of descriptors, memory or socket buffers is made temporary, logged at
// Warn (once a second) and counted.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if isLocalResource(err) {
				l.d.localResourceError(l.wa, err)
				if now := time.Now(); now.Sub(l.lastWarn) >= time.Second {
					l.lastWarn = now
					l.d.log.Warn("accept failed: mpsd is out of local resources (descriptors, memory); retrying", "listener", l.name, "err", err)
				}
				return nil, localAcceptError{err}
			}
			return nil, err
		}
		l.d.localResourceOK(l.wa)
		var p peer
		hasPeer := false
		if _, ok := c.(*net.UnixConn); ok {
			if p, err = unixPeer(c); err != nil {
				l.d.log.Warn("connection without peer credentials closed", "listener", l.name, "err", err)
				_ = c.Close()
				continue
			}
			hasPeer = true
		}
		var mp metricsPeer
		if l.name == listenerMetrics {
			mp = metricsPeerOf(c, p, hasPeer)
		}
		if reason, msg := l.take(p, hasPeer, mp); reason != "" {
			l.d.metrics.connRefused.WithLabelValues(l.name, reason).Inc()
			lv := slog.LevelDebug
			if now := time.Now(); now.Sub(l.lastRefuse) >= 10*time.Second {
				// Someone is at a cap: worth a line, not one per connection.
				l.lastRefuse, lv = now, slog.LevelWarn
			}
			attrs := []any{"listener", l.name, "reason", reason, "message", msg}
			if hasPeer {
				attrs = append(attrs, "uid", p.uid, "pid", p.pid)
			} else {
				attrs = append(attrs, "remote", c.RemoteAddr().String())
				if mp.byUID {
					attrs = append(attrs, "uid", mp.uid)
				}
			}
			l.d.log.Log(context.Background(), lv, "connection refused at a cap (mpsd_connections_refused_total counts them all)", attrs...)
			l.refuse(c, msg)
			continue
		}
		l.d.metrics.connOpen.WithLabelValues(l.name).Inc()
		return &limitedConn{Conn: c, l: l, p: p, hasPeer: hasPeer, mp: mp}, nil
	}
}

// take counts a new connection in, or says which cap it is over.
// On the metrics listener the per-peer cap is
// limits.metrics_connections_per_user, counted by mp; uid 0 is exempt.
func (l *limitListener) take(p peer, hasPeer bool, mp metricsPeer) (reason, msg string) {
	caps := l.d.res.caps.Load()
	total, perUser := caps.total, caps.perUser
	metrics := l.name == listenerMetrics
	if metrics {
		total, perUser = caps.metrics, 0
	}
	root := hasPeer && p.uid == 0
	capPeer := metrics && !(mp.byUID && mp.uid == 0) && caps.metricsPerUser > 0
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= total && !(root && l.open < total+rootExtraConnections):
		return "total", fmt.Sprintf("mpsd has %d connections open on its %s listener, the most %s (%d) allows; try again once some have ended",
			l.open, l.name, l.key, total)
	case hasPeer && !root && perUser > 0 && l.byUID[p.uid] >= perUser:
		return "per_user", fmt.Sprintf("uid %d has %d connections open to mpsd, the most limits.connections_per_user (%d) allows; end some (idle mpsctl or mps-launch) and try again",
			p.uid, l.byUID[p.uid], perUser)
	case capPeer && l.byPeer[mp] >= caps.metricsPerUser:
		return "per_user", fmt.Sprintf("%s has %d connections open on mpsd's metrics listener, the most limits.metrics_connections_per_user (%d) allows; try again once some have ended",
			mp, l.byPeer[mp], caps.metricsPerUser)
	}
	l.open++
	if hasPeer {
		l.byUID[p.uid]++
	}
	if metrics {
		l.byPeer[mp]++
	}
	return "", ""
}

func (l *limitListener) release(p peer, hasPeer bool, mp metricsPeer) {
	l.mu.Lock()
	l.open--
	if hasPeer {
		if l.byUID[p.uid]--; l.byUID[p.uid] <= 0 {
			delete(l.byUID, p.uid)
		}
	}
	if l.name == listenerMetrics {
		if l.byPeer[mp]--; l.byPeer[mp] <= 0 {
			delete(l.byPeer, mp)
		}
	}
	l.mu.Unlock()
	l.d.metrics.connOpen.WithLabelValues(l.name).Dec()
}

// refuse answers c with a 503 and closes it. The answer is written before
// the request is read (a fresh socket's buffer takes it at once), then
// the request is read and dropped until the client closes or refuseWithin
// passes, so the client sees the answer and not a reset. With maxRefusing
// answers under way already, c is closed at once.
func (l *limitListener) refuse(c net.Conn, msg string) {
	select {
	case l.refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.refusing
		_ = c.Close()
		return
	}
	l.answer[c] = struct{}{}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		defer func() { <-l.refusing }()
		defer func() {
			l.mu.Lock()
			delete(l.answer, c)
			l.mu.Unlock()
			_ = c.Close()
		}()
		_ = c.SetDeadline(time.Now().Add(refuseWithin))
		body, _ := json.Marshal(api.Error{Code: api.CodeOverLimit, Message: msg})
		body = append(body, '\n')
		resp := fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s: %s\r\n%s: %s\r\nConnection: close\r\n\r\n%s",
			api.ContentTypeJSON, len(body), api.HeaderVersion, builtVersion().Version, api.HeaderAPILevel, apiLevelText, body)
		if _, err := c.Write([]byte(resp)); err != nil {
			return
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		var buf [4096]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				return
			}
		}
	}()
}

// Close closes the listener and the refused connections still being
// answered, and waits for their goroutines.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.answer {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// limitedConn is an accepted connection within the caps; it carries the
// peer credentials taken at accept and gives its place back when closed.
type limitedConn struct {
	net.Conn
	l       *limitListener
	p       peer
	hasPeer bool
	mp      metricsPeer // on the metrics listener: whom it counts against
	once    sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.p, c.hasPeer, c.mp) })
	return err
}

// peerOf returns the credentials taken when c was accepted.
func peerOf(c net.Conn) (peer, bool) {
	if lc, ok := c.(*limitedConn); ok && lc.hasPeer {
		return lc.p, true
	}
	return peer{}, false
}
