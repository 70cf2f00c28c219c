package sdnotify

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/internal/sdnotify/sdnotifytest"
)

// waitFor bounds every wait of these tests; reaching it fails the test.
const waitFor = 30 * time.Second

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// syncBuffer is a log destination tests read while goroutines write.
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

func (s *syncBuffer) waitFor(t *testing.T, sub string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for strings.Count(s.String(), sub) < n {
		if time.Now().After(deadline) {
			t.Fatalf("log has not %d× %q within %s:\n%s", n, sub, waitFor, s.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeTarget stands in for the daemon in the notifier's unit tests.
type fakeTarget struct {
	mu      sync.Mutex
	summary string
	health  error
	hang    bool // Healthy blocks until its deadline
}

func (f *fakeTarget) Summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.summary
}

func (f *fakeTarget) Healthy(ctx context.Context) error {
	f.mu.Lock()
	err, hang := f.health, f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

func (f *fakeTarget) set(fn func(*fakeTarget)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// The notifier's life with a fake daemon: STATUS=starting, STATUS=<summary>
// refreshed while the summary changes, READY=1 with the summary when ready
// fires (not before), STOPPING=1 sent before Run's context is cancelled,
// so it arrives before Run returns.
func TestNotifyLifecycle(t *testing.T) {
	sdnotifytest.ClearEnv(t)
	nl := sdnotifytest.New(t)
	t.Setenv("NOTIFY_SOCKET", nl.Path)
	var logs syncBuffer
	n := New(slog.New(slog.NewTextHandler(&logs, nil)), 10*time.Millisecond)
	if n == nil {
		t.Fatal("no notifier with NOTIFY_SOCKET set")
	}
	if n.watchdog != 0 {
		t.Fatalf("watchdog %s without WATCHDOG_USEC", n.watchdog)
	}
	f := &fakeTarget{summary: "instances: 2 starting; leases: 0 running, 0 queued"}
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stoppingSeen := make(chan bool, 1)
	done := make(chan error, 1)
	go func() {
		done <- n.Run(ctx, f, ready, func(rctx context.Context) error {
			<-rctx.Done()
			// Run begins to stop here: systemd must know already.
			deadline := time.Now().Add(2 * time.Second)
			for nl.Count(0, sdnotifytest.Has("STOPPING=1")) == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			stoppingSeen <- nl.Count(0, sdnotifytest.Has("STOPPING=1")) == 1
			return nil
		})
	}()

	i := nl.Wait(t, "STATUS=starting", 0, waitFor, sdnotifytest.Has("STATUS=starting"))
	i = nl.Wait(t, "STATUS with the summary", i, waitFor, sdnotifytest.Has("STATUS=instances: 2 starting; leases: 0 running, 0 queued"))
	f.set(func(f *fakeTarget) { f.summary = "instances: 1 ready, 1 starting; leases: 0 running, 0 queued" })
	i = nl.Wait(t, "STATUS with the new summary", i, waitFor, sdnotifytest.Has("STATUS=instances: 1 ready, 1 starting; leases: 0 running, 0 queued"))
	time.Sleep(50 * time.Millisecond) // 5 status ticks, one summary: one message
	if c := nl.Count(0, sdnotifytest.Has("STATUS=instances: 1 ready, 1 starting; leases: 0 running, 0 queued")); c != 1 {
		t.Errorf("unchanged summary sent %d times, want once", c)
	}
	if c := nl.Count(0, sdnotifytest.Has("READY=1")); c != 0 {
		t.Fatalf("READY=1 before ready fired: %q", nl.All())
	}

	f.set(func(f *fakeTarget) { f.summary = "instances: 2 ready; leases: 0 running, 0 queued" })
	close(ready)
	r := nl.Wait(t, "READY=1", i, waitFor, sdnotifytest.Has("READY=1"))
	if got, want := nl.All()[r], "READY=1\nSTATUS=instances: 2 ready; leases: 0 running, 0 queued"; got != want {
		t.Errorf("ready message %q, want %q", got, want)
	}
	f.set(func(f *fakeTarget) { f.summary = "instances: 2 ready; leases: 1 running, 0 queued" })
	nl.Wait(t, "STATUS after ready", r+1, waitFor, sdnotifytest.Has("STATUS=instances: 2 ready; leases: 1 running, 0 queued"))

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if !<-stoppingSeen {
		t.Errorf("STOPPING=1 not received before Run's context ended and Run returned: %q", nl.All())
	}
	msgs := nl.All()
	s := nl.Wait(t, "STOPPING=1", 0, time.Second, sdnotifytest.Has("STOPPING=1"))
	if s < r || !sdnotifytest.HasPrefix("STATUS=stopping")(msgs[s]) {
		t.Errorf("stopping message %d %q, want after READY (%d) with STATUS=stopping", s, msgs[s], r)
	}
	if c := nl.Count(0, sdnotifytest.Has("READY=1")); c != 1 {
		t.Errorf("READY=1 sent %d times", c)
	}
	if strings.Contains(logs.String(), "not delivered") {
		t.Errorf("notifier log: %s", logs.String())
	}
}

// When Run fails on its own, systemd hears STOPPING=1 and a STATUS= with
// the error.
func TestNotifyRunError(t *testing.T) {
	sdnotifytest.ClearEnv(t)
	nl := sdnotifytest.New(t)
	t.Setenv("NOTIFY_SOCKET", nl.Path)
	n := New(slog.New(slog.DiscardHandler), time.Hour)
	err := n.Run(context.Background(), &fakeTarget{}, nil, func(context.Context) error {
		nl.Wait(t, "STATUS=starting", 0, waitFor, sdnotifytest.Has("STATUS=starting"))
		return errors.New("serve API: accept:\nboom")
	})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("run: %v", err)
	}
	i := nl.Wait(t, "STOPPING=1", 0, time.Second, sdnotifytest.Has("STOPPING=1"))
	nl.Wait(t, "STATUS=mpsd failed", i, time.Second, sdnotifytest.Has("STATUS=mpsd failed: serve API: accept: boom"))
}

// Without NOTIFY_SOCKET nothing is sent and nothing started: run is Run.
func TestNotifyNoSocket(t *testing.T) {
	sdnotifytest.ClearEnv(t)
	t.Setenv("WATCHDOG_USEC", "100000")
	n := New(slog.New(slog.DiscardHandler), 0)
	if n != nil {
		t.Fatalf("notifier without NOTIFY_SOCKET: %+v", n)
	}
	n.Notify("READY=1") // a no-op on nil
	ctx, cancel := context.WithCancel(context.Background())
	called := false
	err := n.Run(ctx, &fakeTarget{}, nil, func(rctx context.Context) error {
		called = rctx == ctx
		cancel()
		return nil
	})
	if err != nil || !called {
		t.Fatalf("nil notifier's run: err %v, run called with ctx: %v", err, called)
	}
}

// WATCHDOG_USEC on: WATCHDOG=1 at half the interval once ready, none while
// Healthy fails or hangs past its deadline (each skip logged), again when
// it recovers.
func TestWatchdogPings(t *testing.T) {
	sdnotifytest.ClearEnv(t)
	nl := sdnotifytest.New(t)
	t.Setenv("NOTIFY_SOCKET", nl.Path)
	t.Setenv("WATCHDOG_USEC", "100000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var logs syncBuffer
	n := New(slog.New(slog.NewTextHandler(&logs, nil)), time.Hour)
	if n.watchdog != 100*time.Millisecond || n.healthTimeout() != 25*time.Millisecond {
		t.Fatalf("watchdog %s, health timeout %s; want 100ms, 25ms", n.watchdog, n.healthTimeout())
	}
	f := &fakeTarget{summary: "s"}
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- n.Run(ctx, f, ready, func(rctx context.Context) error { <-rctx.Done(); return nil })
	}()
	time.Sleep(150 * time.Millisecond)
	if c := nl.Count(0, sdnotifytest.Has("WATCHDOG=1")); c != 0 {
		t.Fatalf("%d WATCHDOG=1 before READY=1", c)
	}
	close(ready)
	r := nl.Wait(t, "READY=1", 0, waitFor, sdnotifytest.Has("READY=1"))
	start := time.Now()
	i := r
	for range 3 {
		i = nl.Wait(t, "WATCHDOG=1", i+1, waitFor, sdnotifytest.Has("WATCHDOG=1"))
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("3 pings in %s: faster than every 50ms", took)
	}

	f.set(func(f *fakeTarget) { f.health = errors.New("state lock wedged") })
	logs.waitFor(t, "ping skipped", 2)
	time.Sleep(20 * time.Millisecond) // a ping sent just before is in
	from := len(nl.All())
	f.set(func(f *fakeTarget) { f.health, f.hang = nil, true })
	logs.waitFor(t, "deadline exceeded", 2)
	time.Sleep(200 * time.Millisecond)
	if c := nl.Count(from, sdnotifytest.Has("WATCHDOG=1")); c != 0 {
		t.Errorf("%d WATCHDOG=1 while unhealthy", c)
	}
	if !strings.Contains(logs.String(), "state lock wedged") {
		t.Errorf("skip log lacks Healthy's error:\n%s", logs.String())
	}

	f.set(func(f *fakeTarget) { f.hang = false })
	nl.Wait(t, "WATCHDOG=1 after recovery", from, waitFor, sdnotifytest.Has("WATCHDOG=1"))
	logs.waitFor(t, "pings resumed", 1)

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	nl.Wait(t, "STOPPING=1", 0, time.Second, sdnotifytest.Has("STOPPING=1"))
}

// No WATCHDOG_USEC, or a WATCHDOG_PID naming another process: no pings.
func TestWatchdogDisabled(t *testing.T) {
	for _, tc := range []struct{ usec, pid string }{
		{"", ""},
		{"100000", "1"},
	} {
		t.Run("usec="+tc.usec+",pid="+tc.pid, func(t *testing.T) {
			sdnotifytest.ClearEnv(t)
			nl := sdnotifytest.New(t)
			t.Setenv("NOTIFY_SOCKET", nl.Path)
			if tc.usec != "" {
				t.Setenv("WATCHDOG_USEC", tc.usec)
			}
			if tc.pid != "" {
				t.Setenv("WATCHDOG_PID", tc.pid)
			}
			n := New(slog.New(slog.DiscardHandler), time.Hour)
			if n.watchdog != 0 {
				t.Fatalf("watchdog %s", n.watchdog)
			}
			ready := make(chan struct{})
			close(ready)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- n.Run(ctx, &fakeTarget{}, ready, func(rctx context.Context) error { <-rctx.Done(); return nil })
			}()
			nl.Wait(t, "READY=1", 0, waitFor, sdnotifytest.Has("READY=1"))
			time.Sleep(200 * time.Millisecond) // two intervals
			cancel()
			<-done
			nl.Wait(t, "STOPPING=1", 0, time.Second, sdnotifytest.Has("STOPPING=1"))
			if c := nl.Count(0, sdnotifytest.Has("WATCHDOG=1")); c != 0 || nl.Count(0, sdnotifytest.Has("READY=1")) != 1 {
				t.Errorf("messages %q: want READY=1 and no WATCHDOG=1", nl.All())
			}
		})
	}
}
