package server_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/internal/mpsemu/client"
	"github.com/mpsd/mpsd/internal/mpsemu/cstr"
	"github.com/mpsd/mpsd/internal/mpsemu/emuwire"
	"github.com/mpsd/mpsd/internal/mpsemu/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const deadline = 10 * time.Second

func testConfig(t *testing.T) server.Config {
	t.Helper()
	return server.Config{
		PipeDir:      t.TempDir(),
		PID:          os.Getpid(),
		UID:          uint32(os.Geteuid()),
		Devices:      []string{"GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000001"},
		DeviceMemory: 40 * cstr.GiB,
		MaxClients:   server.MaxClientsPerDevice,
		SM:           100,
		Standalone:   true,
	}
}

// startServer runs a server until the test ends and waits until it serves.
func startServer(t *testing.T, cfg server.Config) (*server.Server, context.CancelFunc) {
	t.Helper()
	s := server.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	changed := s.Changed()
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server Run: %v", err)
		}
	})
	waitState(t, s, changed, server.Active)
	return s, cancel
}

// waitState waits for the server's state, woken by its change events.
func waitState(t *testing.T, s *server.Server, changed <-chan struct{}, want server.State) {
	t.Helper()
	timeout := time.After(deadline)
	for s.State() != want {
		select {
		case <-changed:
			changed = s.Changed()
		case <-timeout:
			t.Fatalf("server state %v; want %v", s.State(), want)
		}
	}
}

// waitClients waits until n clients are connected.
func waitClients(t *testing.T, s *server.Server, n int) {
	t.Helper()
	timeout := time.After(deadline)
	for {
		changed := s.Changed()
		if len(s.Clients()) == n {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("%d clients; want %d", len(s.Clients()), n)
		}
	}
}

// rawClient connects as a CUDA client that stays connected until closed.
func rawClient(t *testing.T, cfg server.Config, pid int, envSM, envPinned string) (*emuwire.Conn, emuwire.Msg) {
	t.Helper()
	c, err := emuwire.Dial(emuwire.ServerSocket(cfg.PipeDir, cfg.PID))
	if err != nil {
		t.Fatalf("dial server: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Send(emuwire.Msg{Op: emuwire.OpClientHello, PID: pid, EnvSM: envSM, EnvPinned: envPinned}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Recv()
	if err != nil {
		t.Fatalf("client %d hello: %v", pid, err)
	}
	return c, m
}

func recvOp(t *testing.T, c *emuwire.Conn, want string) emuwire.Msg {
	t.Helper()
	m, err := c.Recv()
	if err != nil || m.Op != want {
		t.Fatalf("got %+v, %v; want %s", m, err, want)
	}
	return m
}

func TestFaultContainment(t *testing.T) {
	cfg := testConfig(t)
	s, _ := startServer(t, cfg)
	var clients []*emuwire.Conn
	for pid := 101; pid <= 103; pid++ {
		c, m := rawClient(t, cfg, pid, "", "")
		if m.Op != emuwire.OpWelcome {
			t.Fatalf("client %d: %+v", pid, m)
		}
		clients = append(clients, c)
	}
	changed := s.Changed()
	if err := clients[1].Send(emuwire.Msg{Op: emuwire.OpFault}); err != nil {
		t.Fatal(err)
	}
	// Every client of the server hears of the fault, not only the culprit.
	for i, c := range clients {
		if m := recvOp(t, c, emuwire.OpFault); m.Err != server.ErrIllegalAddress {
			t.Errorf("client %d: fault error %d", i, m.Err)
		}
	}
	waitState(t, s, changed, server.Fault)

	refused := func(step string) {
		t.Helper()
		if _, m := rawClient(t, cfg, 200, "", ""); m.Op != emuwire.OpError || m.Err != server.ErrServerNotReady {
			t.Fatalf("%s: new client got %+v; want error 807", step, m)
		}
	}
	refused("all three affected clients connected")
	for i, c := range clients {
		c.Close()
		if i < len(clients)-1 {
			waitClients(t, s, len(clients)-1-i)
			refused("affected clients remain")
		}
	}
	waitState(t, s, s.Changed(), server.Active)
	if _, m := rawClient(t, cfg, 300, "", ""); m.Op != emuwire.OpWelcome {
		t.Fatalf("after recovery: %+v; want welcome", m)
	}
}

// TestFaultStaysForDeviceReset: after the last affected client has gone
// the server stays FAULT (refusing clients) for FaultReset, the time a
// real server takes to reset its devices, then is ACTIVE again.
func TestFaultStaysForDeviceReset(t *testing.T) {
	cfg := testConfig(t)
	cfg.FaultReset = 300 * time.Millisecond
	s, _ := startServer(t, cfg)
	c, m := rawClient(t, cfg, 101, "", "")
	if m.Op != emuwire.OpWelcome {
		t.Fatalf("client: %+v", m)
	}
	changed := s.Changed()
	if err := c.Send(emuwire.Msg{Op: emuwire.OpFault}); err != nil {
		t.Fatal(err)
	}
	recvOp(t, c, emuwire.OpFault)
	waitState(t, s, changed, server.Fault)
	c.Close()
	left := time.Now()
	waitClients(t, s, 0)
	if st := s.State(); st != server.Fault {
		t.Fatalf("state %v right after the last affected client left; want FAULT during the reset", st)
	}
	if _, m := rawClient(t, cfg, 200, "", ""); m.Op != emuwire.OpError || m.Err != server.ErrServerNotReady {
		t.Fatalf("new client during the reset got %+v; want error 807", m)
	}
	waitState(t, s, s.Changed(), server.Active)
	if el := time.Since(left); el < cfg.FaultReset {
		t.Errorf("ACTIVE again %v after the last client left; the reset takes %v", el, cfg.FaultReset)
	}
	if _, m := rawClient(t, cfg, 300, "", ""); m.Op != emuwire.OpWelcome {
		t.Fatalf("after the reset: %+v; want welcome", m)
	}
}

// TestFaultReachesRunningClients runs three emulated CUDA clients; one
// raises the fault, and all three fail with the fault's error.
func TestFaultReachesRunningClients(t *testing.T) {
	cfg := testConfig(t)
	s, _ := startServer(t, cfg)
	errs := make(chan error, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(opts client.Options) {
		go func() { errs <- client.Run(ctx, opts, &strings.Builder{}) }()
	}
	// Two bystanders first, so all three are connected when the third faults.
	run(client.Options{PipeDir: cfg.PipeDir, PID: 401, Duration: time.Hour})
	run(client.Options{PipeDir: cfg.PipeDir, PID: 402, Duration: time.Hour})
	waitClients(t, s, 2)
	run(client.Options{PipeDir: cfg.PipeDir, PID: 400, Duration: time.Hour, FaultAfter: time.Millisecond})
	for range 3 {
		select {
		case err := <-errs:
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != client.ErrIllegalAddress {
				t.Errorf("client returned %v; want CUDA error 700", err)
			}
		case <-time.After(deadline):
			t.Fatal("a client did not fail after the fault")
		}
	}
}

func TestMaxClients(t *testing.T) {
	tests := []struct {
		name string
		max  int
	}{
		{"MPS limit of 48", server.MaxClientsPerDevice},
		{"lowered to 3", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.MaxClients = tt.max
			s, _ := startServer(t, cfg)
			var first *emuwire.Conn
			for i := range tt.max {
				c, m := rawClient(t, cfg, 1000+i, "", "")
				if m.Op != emuwire.OpWelcome {
					t.Fatalf("client %d of %d refused: %+v", i+1, tt.max, m)
				}
				if i == 0 {
					first = c
				}
			}
			if _, m := rawClient(t, cfg, 5000, "", ""); m.Op != emuwire.OpError || m.Err != server.ErrMaxClientsReached {
				t.Fatalf("client %d got %+v; want error 808", tt.max+1, m)
			}
			first.Close()
			waitClients(t, s, tt.max-1)
			if _, m := rawClient(t, cfg, 5001, "", ""); m.Op != emuwire.OpWelcome {
				t.Fatalf("after one left: %+v; want welcome", m)
			}
		})
	}
}

func TestClientEnvOnlyLowersLimits(t *testing.T) {
	cfg := testConfig(t)
	cfg.SM = 50
	cfg.Pinned = []uint64{8 * cstr.GiB, 0}
	startServer(t, cfg)
	const G = cstr.GiB
	tests := []struct {
		name, envSM, envPinned string
		sm                     float64
		mem                    []uint64
	}{
		{"server defaults", "", "", 50, []uint64{8 * G, 40 * G}},
		{"lower SM", "25", "", 25, []uint64{8 * G, 40 * G}},
		{"cannot raise SM", "75", "", 50, []uint64{8 * G, 40 * G}},
		{"invalid SM ignored", "abc", "", 50, []uint64{8 * G, 40 * G}},
		{"zero SM ignored", "0", "", 50, []uint64{8 * G, 40 * G}},
		{"lower pinned", "", "0=4G", 50, []uint64{4 * G, 40 * G}},
		{"cannot raise pinned", "", "0=16G", 50, []uint64{8 * G, 40 * G}},
		{"second device in MiB", "", "1=512M", 50, []uint64{8 * G, 512 << 20}},
		{"by UUID", "", "GPU-bbbbbbbb-0000-4000-8000-000000000001=2G", 50, []uint64{8 * G, 2 * G}},
		{"loose syntax: T is MiB", "", "1=3T", 50, []uint64{8 * G, 3 << 20}},
		// MPS drops every pinned limit of a client for one entry naming a
		// device it cannot see: only the server's limits hold.
		{"an unknown device drops every limit", "", "7=1G,0=1G", 50, []uint64{8 * G, 40 * G}},
		{"an unknown UUID drops every limit", "", "0=1G,GPU-zz=1G", 50, []uint64{8 * G, 40 * G}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, m := rawClient(t, cfg, 600+i, tt.envSM, tt.envPinned)
			defer c.Close()
			if m.Op != emuwire.OpWelcome {
				t.Fatalf("refused: %+v", m)
			}
			if m.SM != tt.sm || len(m.Mem) != 2 || m.Mem[0] != tt.mem[0] || m.Mem[1] != tt.mem[1] {
				t.Errorf("limits sm=%v mem=%v; want sm=%v mem=%v", m.SM, m.Mem, tt.sm, tt.mem)
			}
		})
	}
}

func TestAllocationAgainstLimit(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg)
	tests := []struct {
		name   string
		pinned string
		alloc  string
		code   int
	}{
		{"within limit", "0=4G", "4G", 0},
		{"above limit", "0=4G", "4097M", client.ErrMemoryAllocation},
		{"above device memory", "", "41G", client.ErrMemoryAllocation},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := server.ParseSize(tt.alloc)
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			err = client.Run(context.Background(), client.Options{PipeDir: cfg.PipeDir, PID: 700 + i, EnvPinned: tt.pinned, Alloc: b}, &out)
			var ce *client.Error
			switch {
			case tt.code == 0 && err != nil:
				t.Fatalf("Run: %v", err)
			case tt.code != 0 && (!errors.As(err, &ce) || ce.Code != tt.code):
				t.Fatalf("Run = %v; want CUDA error %d", err, tt.code)
			}
			if !strings.HasPrefix(out.String(), "mpsemu-client: pid=") {
				t.Errorf("no limits line: %q", out.String())
			}
		})
	}
}

func TestClientFailsAtOnceWhenServerDies(t *testing.T) {
	cfg := testConfig(t)
	s, stop := startServer(t, cfg)
	errc := make(chan error, 1)
	// The client prints its limits once its handshake is done; the server
	// counts it a little earlier, when a death would still be a failed
	// connection (805) rather than a lost server (806).
	connected := &firstWrite{done: make(chan struct{})}
	go func() {
		errc <- client.Run(context.Background(), client.Options{PipeDir: cfg.PipeDir, PID: 800, Duration: time.Hour}, connected)
	}()
	waitClients(t, s, 1)
	select {
	case <-connected.done:
	case <-time.After(deadline):
		t.Fatal("client did not finish connecting")
	}
	stop()
	select {
	case err := <-errc:
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != client.ErrRPCFailure {
			t.Fatalf("Run = %v; want CUDA error 806", err)
		}
	case <-time.After(deadline):
		t.Fatal("client hangs after its server died")
	}
}

func TestClientWithoutServer(t *testing.T) {
	err := client.Run(context.Background(), client.Options{PipeDir: t.TempDir(), PID: 900}, &strings.Builder{})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != client.ErrConnectionFailed {
		t.Fatalf("Run = %v; want CUDA error 805", err)
	}
}

func TestClientStopsOnCancel(t *testing.T) {
	cfg := testConfig(t)
	s, _ := startServer(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- client.Run(ctx, client.Options{PipeDir: cfg.PipeDir, PID: 901, Duration: time.Hour}, &strings.Builder{})
	}()
	waitClients(t, s, 1)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v; want context.Canceled", err)
		}
	case <-time.After(deadline):
		t.Fatal("client ignores cancellation")
	}
	waitClients(t, s, 0)
}

// firstWrite closes done at its first Write.
type firstWrite struct {
	once sync.Once
	done chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.done) })
	return len(p), nil
}
