package mpsd

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mpsd/mpsd/policy"

	"github.com/mpsd/mpsd/internal/clock"
)

// fakeListener hands out what the test queues: errors or connections.
type fakeListener struct {
	next chan any
	once sync.Once
	done chan struct{}
}

func newFakeListener() *fakeListener {
	return &fakeListener{next: make(chan any, 8), done: make(chan struct{})}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	select {
	case v := <-f.next:
		if err, ok := v.(error); ok {
			return nil, err
		}
		return v.(net.Conn), nil
	case <-f.done:
		return nil, net.ErrClosed
	}
}

func (f *fakeListener) Close() error   { f.once.Do(func() { close(f.done) }); return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{} }

func limitTestDaemon(t *testing.T, lim policy.LimitsConfig) (*Daemon, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d := &Daemon{clock: clock.Real{}, log: log, res: &resources{log: log, nofile: 1 << 16, failing: map[string]error{}, admitting: map[uint32]int{}}, metrics: &metrics{}}
	d.metrics.newResourceMetrics()
	d.res.apply(lim)
	return d, &logs
}

// An accept that fails for lack of descriptors, memory or socket buffers
// is mpsd's own exhaustion: logged at Warn, counted, readiness failing
// until an accept works again; the error goes to http.Server as a
// temporary one, on which it backs off (on any other it stops serving,
// and mpsd with it).
func TestAcceptOutOfDescriptorsIsCountedAndWarned(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS} {
		t.Run(errno.Error(), func(t *testing.T) {
			d, logs := limitTestDaemon(t, policy.LimitsConfig{Connections: 8, ConnectionsPerUser: 8, QueuedPerUser: 1, MetricsConnections: 2})
			f := newFakeListener()
			l := d.limitListener(f, listenerMetrics)
			defer l.Close()
			f.next <- &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
			_, err := l.Accept()
			if !errors.Is(err, errno) {
				t.Fatalf("Accept: %v, want the %v passed on", err, errno)
			}
			var ne net.Error
			//lint:ignore SA1019 http.Server decides to back off by Temporary
			if !errors.As(err, &ne) || !ne.Temporary() {
				t.Fatalf("Accept's %v is not temporary: http.Server would stop serving", errno)
			}
			if v := testutil.ToFloat64(d.metrics.localErrors.WithLabelValues(whereMetricsAccept)); v != 1 {
				t.Errorf("mpsd_local_resource_errors_total{metrics_accept} = %v, want 1", v)
			}
			if tr := d.res.localTrouble(); !strings.Contains(tr, "metrics_accept") {
				t.Errorf("trouble %q, want metrics_accept named (readiness fails)", tr)
			}
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "out of local resources") {
				t.Errorf("log lacks a Warn about local resources:\n%s", logs.String())
			}
			a, b := net.Pipe()
			defer b.Close()
			f.next <- a
			c, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tr := d.res.localTrouble(); tr != "" {
				t.Errorf("trouble %q after an accept worked, want none", tr)
			}
		})
	}
}

// The metrics listener's cap: a connection over it is answered 503
// over_limit naming limits.metrics_connections and closed; closing the
// held connection makes room for the next.
func TestMetricsConnectionCap(t *testing.T) {
	d, _ := limitTestDaemon(t, policy.LimitsConfig{Connections: 8, ConnectionsPerUser: 8, QueuedPerUser: 1, MetricsConnections: 1})
	f := newFakeListener()
	l := d.limitListener(f, listenerMetrics)
	defer l.Close()
	pipe := func() net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = b.Close() })
		f.next <- a
		return b
	}
	pipe()
	held, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	over := pipe()
	got := make(chan net.Conn, 1)
	go func() {
		// Refuses over, then takes room once held is closed.
		c, err := l.Accept()
		if err == nil {
			got <- c
		}
	}()
	_ = over.SetReadDeadline(time.Now().Add(waitFor))
	answer, _ := io.ReadAll(over)
	if !bytes.HasPrefix(answer, []byte("HTTP/1.1 503 ")) || !bytes.Contains(answer, []byte(`"code":"over_limit"`)) || !bytes.Contains(answer, []byte("limits.metrics_connections (1)")) {
		t.Errorf("over-cap connection answered %q", answer)
	}
	if v := testutil.ToFloat64(d.metrics.connRefused.WithLabelValues(listenerMetrics, "total")); v < 1 {
		t.Errorf("refused total = %v, want at least 1", v)
	}
	_ = held.Close()
	pipe()
	select {
	case c := <-got:
		_ = c.Close()
	case <-time.After(waitFor):
		t.Fatal("no connection accepted after the held one closed")
	}
}
