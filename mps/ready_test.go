package mps

import (
	"context"
	"errors"
	"golang.org/x/sys/unix"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
)

// firstLine is an io.Writer that hands over the first line written to it.
type firstLine struct {
	buf  []byte
	line chan string
}

func (w *firstLine) Write(p []byte) (int, error) {
	if w.buf == nil && w.line == nil {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	if i := strings.IndexByte(string(w.buf), '\n'); i >= 0 && w.line != nil {
		w.line <- string(w.buf[:i])
		w.line, w.buf = nil, nil
	}
	return len(p), nil
}

// clientProc is a running mpsemu-client; err is valid once done is closed.
type clientProc struct {
	pid  int
	done chan struct{}
	err  error
}

// runClient starts the emulator's CUDA client stand-in against d and waits
// for its first line (it is connected then). The process is killed at the
// end of the test.
func runClient(t *testing.T, d *Daemon, args ...string) *clientProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, filepath.Join(emutest.BinDir(t), emutest.ClientName), args...)
	cmd.Env = d.clientEnv
	out := &firstLine{line: make(chan string, 1)}
	line := out.line
	cmd.Stdout = out
	if err := testrun.Start(cmd); err != nil { // dies with the test process
		cancel()
		t.Fatal(err)
	}
	c := &clientProc{pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-c.done
	})
	select {
	case l := <-line:
		if !strings.HasPrefix(l, "mpsemu-client: pid=") {
			t.Fatalf("client's first line %q", l)
		}
	case <-c.done:
		t.Fatalf("client exited before connecting: %v", c.err)
	case <-time.After(10 * time.Second):
		t.Fatal("client printed nothing within 10s")
	}
	return c
}

// TestReadyServerCommands covers what only a ready server shows, so only the
// emulator (NVIDIA's daemon with a stand-in never gets a ready server): the
// per-server commands, client list and terminate_client, and the server
// ready and client connected events.
func TestReadyServerCommands(t *testing.T) {
	for _, gen := range emutest.Generations {
		t.Run("emu-"+gen, func(t *testing.T) {
			t.Parallel()
			cfg := newConfig(t, emuBackend(t, gen))
			cfg.DefaultThreadPercentage = 50
			cfg.DefaultPinnedMem = map[int]int64{0: 4 << 30}
			in := start(t, cfg)
			d := in.d
			ctx := testCtx(t, 20*time.Second)

			client := runClient(t, d, "--duration", "1m")
			cpid := client.pid
			server := in.waitEvent(t, "server started", kind(ServerStarted)).PID
			in.waitEvent(t, "server ready", kindPID(ServerReady, server))
			ev := in.waitEvent(t, "client connected", kindPID(ClientConnected, cpid))
			if ev.UID != 0 || ev.Source != SourceLog {
				t.Errorf("client event %v; want uid 0 from the log", ev)
			}

			if st, err := d.ServerStatus(ctx, server); err != nil || st != StateActive {
				t.Errorf("ServerStatus = %v, %v; want ACTIVE", st, err)
			}
			if pids, err := d.ClientList(ctx, server); err != nil || !slices.Equal(pids, []int{cpid}) {
				t.Errorf("ClientList = %v, %v; want [%d]", pids, err, cpid)
			}
			if p, err := d.ActiveThreadPercentage(ctx, server); err != nil || p != 50 {
				t.Errorf("ActiveThreadPercentage = %v, %v; want the default 50", p, err)
			}
			if p, err := d.SetActiveThreadPercentage(ctx, server, 30); err != nil || p != 30 {
				t.Errorf("SetActiveThreadPercentage(30) = %v, %v", p, err)
			}
			if p, err := d.SetActiveThreadPercentage(ctx, server, 150); !errors.Is(err, ErrInvalidValue) || p != 30 {
				t.Errorf("SetActiveThreadPercentage(150) = %v, %v; want ErrInvalidValue keeping 30", p, err)
			}
			if _, err := d.SetActiveThreadPercentage(ctx, 1, 30); !errors.Is(err, ErrServerNotFound) {
				t.Errorf("SetActiveThreadPercentage of no server: %v; want ErrServerNotFound", err)
			}
			if v, ok, err := d.DevicePinnedMemLimit(ctx, server, 0); err != nil || !ok || v != 4<<30 {
				t.Errorf("DevicePinnedMemLimit = %d, %v, %v; want the default 4 GiB", v, ok, err)
			}
			if err := d.SetDevicePinnedMemLimit(ctx, server, 0, 2<<30); err != nil {
				t.Fatal(err)
			}
			if v, ok, err := d.DevicePinnedMemLimit(ctx, server, 0); err != nil || !ok || v != 2<<30 {
				t.Errorf("DevicePinnedMemLimit after set = %d, %v, %v; want 2 GiB", v, ok, err)
			}
			if err := d.SetDevicePinnedMemLimit(ctx, server, 0, 1000); !errors.Is(err, ErrInvalidValue) {
				t.Errorf("SetDevicePinnedMemLimit below 1 MiB: %v; want ErrInvalidValue", err)
			}

			var cerr *CUDAError
			if err := d.TerminateClient(ctx, server, 1); !errors.As(err, &cerr) || cerr.Code != 1 {
				t.Errorf("TerminateClient of no such client: %v; want CUDA error 1", err)
			}
			if err := d.TerminateClient(ctx, server, cpid); err != nil {
				t.Fatalf("TerminateClient: %v", err)
			}
			select {
			case <-client.done:
				var ee *exec.ExitError
				if !errors.As(client.err, &ee) || ee.ExitCode() != 90 {
					t.Errorf("terminated client: %v; want exit 90 (CUDA error 810)", client.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("terminated client still running after 10s")
			}

			if err := d.ShutdownServer(ctx, server, false); err != nil {
				t.Fatal(err)
			}
			ev = in.waitEvent(t, "server exited", kindPID(ServerExited, server))
			if ev.ExitStatus != 0 && ev.ExitStatus != -1 {
				t.Errorf("idle server after shutdown_server: %v; want status 0", ev)
			}
			if pids, err := d.ServerList(ctx); err != nil || slices.Contains(pids, server) {
				t.Errorf("ServerList after shutdown = %v, %v", pids, err)
			}
		})
	}
}

// TestServerFaultEvent: a client's fatal GPU fault, which a Volta+ server
// contains, is reported as ServerFault from server.log, while the server
// itself lives on.
func TestServerFaultEvent(t *testing.T) {
	in := start(t, newConfig(t, emuBackend(t, emutest.Generations[len(emutest.Generations)-1])))
	bystander := runClient(t, in.d, "--duration", "1m")
	server := in.waitEvent(t, "server ready", kind(ServerReady)).PID
	runClient(t, in.d, "--fault-after", "10ms", "--duration", "1m")
	ev := in.waitEvent(t, "server fault", kind(ServerFault))
	if ev.PID != server || ev.Source != SourceLog {
		t.Errorf("fault event %v; want server %d from the log", ev, server)
	}
	select {
	case <-bystander.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the other client of the faulted server did not exit")
	}
	if err := unix.Kill(server, 0); err != nil {
		t.Errorf("server %d gone after a contained fault: %v", server, err)
	}
}
