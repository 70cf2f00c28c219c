package mpsctl

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/clock"
)

// status --watch draws, waits its interval on mpsctl's clock, draws again,
// and ends when interrupted: on a terminal each drawing clears the
// screen and names the interval; elsewhere drawings are apart by a blank
// line. The interval may follow --watch as its own argument.
func TestStatusWatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		term  bool
		args  []string
		every time.Duration
		// plain is the same status without --watch: one drawing.
		plain []string
	}{
		{"terminal, default interval", true, []string{"--watch"}, 2 * time.Second, nil},
		{"terminal, interval after", true, []string{"--watch", "5s"}, 5 * time.Second, nil},
		{"pipe, interval with =", false, []string{"--watch=1m", "--state", "ready", "--no-headers"}, time.Minute, []string{"--state", "ready", "--no-headers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"GET " + api.PathStatus: ok(t, statusFixture())})
			clk := clock.NewFake(time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out, errb bytes.Buffer
			cfg := Config{Stdout: &out, Stderr: &errb, Clock: clk, IsTerminal: func(io.Writer) bool { return tc.term }}
			done, ended := make(chan int, 1), make(chan struct{})
			go func() {
				defer close(ended)
				done <- Run(ctx, cfg, append([]string{"--socket", fake.socket, "status"}, tc.args...))
			}()
			const draws = 3
			for n := 1; n <= draws; n++ {
				if !clk.WaitPending(1, ended) {
					t.Fatalf("status --watch ended after %d drawings: stderr %q", n-1, errb.String())
				}
				if n < draws {
					// Short of the interval, nothing is drawn.
					clk.Advance(tc.every - time.Millisecond)
					if got := len(fake.requests()); got != n {
						t.Fatalf("%d requests before the interval passed; want %d", got, n)
					}
					clk.Advance(time.Millisecond)
				}
			}
			cancel()
			if code := <-done; code != ExitOK || errb.Len() != 0 {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", code, errb.String())
			}
			if got := len(fake.requests()); got != draws {
				t.Errorf("%d requests; want one per drawing, %d", got, draws)
			}
			one := mpsctl(t, Config{}, nil, append([]string{"--socket", fake.socket, "status"}, tc.plain...)...).stdout
			var want strings.Builder
			for n := range draws {
				switch {
				case tc.term:
					want.WriteString(clearScreen + "Every " + tc.every.String() + ": mpsctl status    " +
						clk.Now().Add(-time.Duration(draws-1-n)*tc.every).Format(time.DateTime) + "\n\n")
				case n > 0:
					want.WriteString("\n")
				}
				want.WriteString(one)
			}
			if out.String() != want.String() {
				t.Errorf("drawings:\n%q\nwant\n%q", out.String(), want.String())
			}
		})
	}
}

// A watch whose first drawing fails ends with that failure; one that
// fails later shows the failure in its place and goes on.
func TestStatusWatchFailures(t *testing.T) {
	r := mpsctl(t, Config{Clock: clock.NewFake(time.Now())}, []string{api.EnvSocket + "=/nonexistent/s.sock"}, "status", "--watch")
	if r.code != ExitFailure || !strings.Contains(r.stderr, "cannot reach mpsd") {
		t.Errorf("exit %d, stderr %q; want 1 naming the socket", r.code, r.stderr)
	}

	clk := clock.NewFake(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	inv := &invocation{stdout: &out, cfg: Config{Clock: clk, IsTerminal: func(io.Writer) bool { return false }}}
	calls := 0
	draw := func(w io.Writer) error {
		calls++
		if calls == 2 {
			return context.DeadlineExceeded
		}
		_, err := io.WriteString(w, "drawing\n")
		return err
	}
	done := make(chan error, 1)
	go func() { done <- inv.watch(ctx, time.Second, draw) }()
	for range 2 {
		if !clk.WaitPending(1, nil) {
			t.Fatal("no wait armed")
		}
		clk.Advance(time.Second)
	}
	if !clk.WaitPending(1, nil) {
		t.Fatal("no wait armed")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v", err)
	}
	if want := "drawing\n\nmpsctl: context deadline exceeded\n\ndrawing\n"; out.String() != want {
		t.Errorf("drawings %q; want %q", out.String(), want)
	}
}
