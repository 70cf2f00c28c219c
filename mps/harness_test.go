package mps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	if os.Getenv(attackEnv) != "" {
		os.Exit(attackMain())
	}
	if os.Getenv(emfileEnv) != "" {
		os.Exit(emfileMain())
	}
	goleak.VerifyTestMain(m)
}

// backend is one control program the suite runs against: NVIDIA's real
// daemon of a generation with the emulator's server as its stand-in server,
// or the emulator in that generation's mode with its own server.
type backend struct {
	name    string
	gen     string
	control string
	real    bool
	path    string   // daemon PATH: server first
	env     []string // extra daemon environment
}

// shortTempDir is a temporary directory with a short path: the daemon's
// sockets live in it and sun_path holds 108 bytes, more than t.TempDir's
// test-named paths leave.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := testrun.MkdirTemp("", "mpst")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func realBackend(t testing.TB, gen string) backend {
	t.Helper()
	control := emutest.RealControl(t, gen)
	// The emulator's server stands in: standalone, it never registers, which
	// is what NVIDIA's daemon sees of any server on a machine without a GPU.
	bin := emutest.BinDir(t)
	return backend{
		name: "real-" + gen + " (" + emutest.RealVersion(gen) + ")", gen: gen, control: control, real: true,
		path: bin + ":" + os.Getenv("PATH"), env: []string{"MPSEMU_SERVER_STANDALONE=1"},
	}
}

func emuBackend(t testing.TB, gen string) backend {
	t.Helper()
	bin := emutest.BinDir(t)
	return backend{
		name: "emu-" + gen, gen: gen, control: filepath.Join(bin, emutest.ControlName),
		path: bin + ":" + os.Getenv("PATH"), env: []string{"MPSEMU_DRIVER=" + gen},
	}
}

// eachBackend runs fn against every backend, in parallel.
func eachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	for _, gen := range emutest.Generations {
		t.Run("real-"+gen, func(t *testing.T) {
			t.Parallel()
			fn(t, realBackend(t, gen))
		})
	}
	for _, gen := range append(slices.Clone(emutest.Generations), emutest.EmulatedGenerations...) {
		t.Run("emu-"+gen, func(t *testing.T) {
			t.Parallel()
			fn(t, emuBackend(t, gen))
		})
	}
}

type cfgOpt func(*Config)

// ignoringSIGINT makes the (emulated) server behave as one wedged in the
// GPU: it ignores SIGINT and never answers its daemon, so `quit -t` hangs.
func ignoringSIGINT(testing.TB) cfgOpt {
	return func(c *Config) {
		c.Env = setEnv(c.Env, "MPSEMU_SERVER_IGNORE_SIGINT", "1")
		c.Env = setEnv(c.Env, "MPSEMU_SERVER_STANDALONE", "1")
	}
}

func newConfig(t testing.TB, b backend, opts ...cfgOpt) Config {
	t.Helper()
	dir := shortTempDir(t)
	env := setEnv(os.Environ(), "PATH", b.path)
	for _, kv := range b.env {
		k, v, _ := strings.Cut(kv, "=")
		env = setEnv(env, k, v)
	}
	cfg := Config{
		ControlPath: b.control,
		PipeDir:     filepath.Join(dir, "pipe"),
		LogDir:      filepath.Join(dir, "log"),
		Env:         env,
		QuitTimeout: time.Second,
		Logger:      slog.New(slog.NewTextHandler(debugOut(t), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// instance is a started daemon plus its collected events; cleanup stops the
// daemon, SIGKILLs every pid it ever reported, and closes the handle.
type instance struct {
	t      testing.TB
	d      *Daemon
	events chan Event
	done   chan struct{}
	mu     sync.Mutex
	pids   map[int]bool
	// backlog holds events read while waiting for another one, so each wait
	// sees every event regardless of order.
	backlog []Event
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func start(t testing.TB, cfg Config) *instance {
	t.Helper()
	d, err := Start(testCtx(t, 20*time.Second), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return watchInstance(t, d)
}

func watchInstance(t testing.TB, d *Daemon) *instance {
	in := &instance{t: t, d: d, events: make(chan Event, 1024), done: make(chan struct{}), pids: map[int]bool{d.PID(): true}}
	go func() {
		defer close(in.done)
		for ev := range d.Events() {
			in.mu.Lock()
			if ev.Kind == ServerStarted {
				in.pids[ev.PID] = true
			}
			in.mu.Unlock()
			in.events <- ev
		}
	}()
	t.Cleanup(in.cleanup)
	return in
}

func (in *instance) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := in.d.Stop(ctx); err != nil {
		in.t.Logf("cleanup: stop: %v", err)
	}
	// Belt and braces: every pid ever reported, by pidfd, so a recycled pid
	// is never hit.
	in.mu.Lock()
	for pid := range in.pids {
		killPID(pid)
	}
	in.mu.Unlock()
	in.d.Close()
	<-in.done
}

// waitEvent returns the first event matching pred, failing after a generous
// deadline (a safety net, not a timing assertion).
func (in *instance) waitEvent(t testing.TB, what string, pred func(Event) bool) Event {
	t.Helper()
	ev, ok := in.waitEventFor(t, 10*time.Second, pred)
	if !ok {
		logTail, _ := os.ReadFile(filepath.Join(in.d.cfg.LogDir, controlLog))
		if len(logTail) > 3000 {
			logTail = logTail[len(logTail)-3000:]
		}
		t.Fatalf("no %s event within 10s; control.log ends:\n%s", what, logTail)
	}
	return ev
}

func (in *instance) waitEventFor(t testing.TB, max time.Duration, pred func(Event) bool) (Event, bool) {
	t.Helper()
	for i, ev := range in.backlog {
		if pred(ev) {
			in.backlog = append(in.backlog[:i], in.backlog[i+1:]...)
			return ev, true
		}
	}
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	for {
		select {
		case ev := <-in.events:
			t.Logf("event: %v", ev)
			if pred(ev) {
				return ev, true
			}
			in.backlog = append(in.backlog, ev)
		case <-deadline.C:
			return Event{}, false
		}
	}
}

func kind(k EventKind) func(Event) bool { return func(e Event) bool { return e.Kind == k } }

func kindPID(k EventKind, pid int) func(Event) bool {
	return func(e Event) bool { return e.Kind == k && e.PID == pid }
}

// startServer asks for a server for uid 0 and returns its pid from the
// ServerStarted event. NVIDIA's daemon, busy reaping a server, sometimes
// accepts a control connection and drops the command while the client exits
// 0 (control.log: "Accepting connection..." and no "NEW UI"); start_server
// prints nothing either way, so it is retried when no server appears.
func (in *instance) startServer(t testing.TB) int {
	t.Helper()
	for range 3 {
		if err := in.d.StartServer(testCtx(t, 5*time.Second), 0); err != nil {
			t.Fatalf("StartServer: %v", err)
		}
		if ev, ok := in.waitEventFor(t, 3*time.Second, kind(ServerStarted)); ok {
			return ev.PID
		}
	}
	return in.waitEvent(t, "server started", kind(ServerStarted)).PID
}

func sigkill(t testing.TB, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatalf("kill %d: %v", pid, err)
	}
}

func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want errors.Is %v", err, target)
	}
}

// The helper process starts a daemon and exits without stopping it, so a
// test can adopt a daemon whose owner is gone.
const helperEnv = "MPS_TEST_HELPER_START"

func helperMain() int {
	parts := strings.Split(os.Getenv(helperEnv), "|")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "helper: want control|pipe|log")
		return 2
	}
	cfg := Config{ControlPath: parts[0], PipeDir: parts[1], LogDir: parts[2], Env: setEnv(os.Environ(), helperEnv, "")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := d.StartServer(ctx, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for ev := range d.Events() {
		if ev.Kind == ServerStarted {
			fmt.Println(d.PID(), ev.PID)
			break
		}
	}
	d.Close()
	return 0
}

func isErr(err, target error) bool { return errors.Is(err, target) }

func fmtSscan(s string, a ...any) (int, error) { return fmt.Sscan(s, a...) }

// waitServerGone waits until the daemon itself has noticed that pid exited
// (our ServerExited comes from the pidfd, usually before the daemon reaps),
// so that the next start_server is not taken for the dead server's uid.
func (in *instance) waitServerGone(t testing.TB, pid int) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	for {
		pids, err := in.d.ServerList(ctx)
		if errors.Is(err, ErrDaemonQuitting) {
			continue // seen transiently from a busy real daemon
		}
		if err != nil {
			t.Fatalf("waiting for the daemon to drop server %d: %v", pid, err)
		}
		if !slices.Contains(pids, pid) {
			return
		}
	}
}

func debugOut(t testing.TB) io.Writer {
	if p := os.Getenv("MPSD_TEST_LOGFILE"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			t.Cleanup(func() { f.Close() })
			return f
		}
	}
	return testWriter{t}
}
