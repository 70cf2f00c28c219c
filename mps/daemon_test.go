package mps

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStartCommands(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		cfg.VisibleDevices = []string{"GPU-11111111-2222-3333-4444-555555555555"}
		cfg.DefaultThreadPercentage = 25
		cfg.DefaultPinnedMem = map[int]int64{0: 8 << 30}
		in := start(t, cfg)
		d := in.d
		ctx := testCtx(t, 20*time.Second)

		// The daemon got the full environment and the devices.
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(d.PID()), "environ"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"CUDA_VISIBLE_DEVICES=" + cfg.VisibleDevices[0], "CUDA_MPS_PIPE_DIRECTORY=" + cfg.PipeDir, "CUDA_MPS_LOG_DIRECTORY=" + cfg.LogDir, "PATH=" + b.path} {
			if !slices.Contains(strings.Split(string(env), "\x00"), want) {
				t.Errorf("daemon environment lacks %q", want)
			}
		}
		wantCaps := Capabilities{PIDFile: b.gen != "535", ServerStatus: b.gen != "535"}
		if got := d.Capabilities(); got != wantCaps {
			t.Errorf("Capabilities = %+v, want %+v", got, wantCaps)
		}
		if err := d.Probe(ctx); err != nil {
			t.Fatalf("Probe: %v", err)
		}

		// Defaults applied at start.
		if p, err := d.DefaultActiveThreadPercentage(ctx); err != nil || p != 25 {
			t.Errorf("DefaultActiveThreadPercentage = %v, %v; want 25", p, err)
		}
		if v, ok, err := d.DefaultDevicePinnedMemLimit(ctx, 0); err != nil || !ok || v != 8<<30 {
			t.Errorf("DefaultDevicePinnedMemLimit(0) = %d, %v, %v; want 8 GiB", v, ok, err)
		}
		if _, ok, err := d.DefaultDevicePinnedMemLimit(ctx, 1); err != nil || ok {
			t.Errorf("DefaultDevicePinnedMemLimit(1) = _, %v, %v; want unset", ok, err)
		}
		if err := d.SetDefaultDevicePinnedMemLimit(ctx, 0, 512<<20); err != nil {
			t.Fatal(err)
		}
		if v, ok, err := d.DefaultDevicePinnedMemLimit(ctx, 0); err != nil || !ok || v != 512<<20 {
			t.Errorf("DefaultDevicePinnedMemLimit(0) = %d, %v, %v; want 512 MiB", v, ok, err)
		}
		if p, err := d.SetDefaultActiveThreadPercentage(ctx, 50); err != nil || p != 50 {
			t.Errorf("SetDefaultActiveThreadPercentage(50) = %v, %v", p, err)
		}
		if err := d.SetDefaultClientPriority(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if p, err := d.DefaultClientPriority(ctx); err != nil || p != 1 {
			t.Errorf("DefaultClientPriority = %v, %v; want 1", p, err)
		}
		if pids, err := d.ServerList(ctx); err != nil || len(pids) != 0 {
			t.Errorf("ServerList = %v, %v; want none", pids, err)
		}

		// Error cases, each errors.Is-able.
		for _, tc := range []struct {
			name string
			call func() error
			want error
		}{
			{"unknown command", func() error { _, err := d.Command(ctx, "no_such_command"); return err }, ErrUnknownCommand},
			{"percentage too high", func() error { _, err := d.SetDefaultActiveThreadPercentage(ctx, 150); return err }, ErrInvalidValue},
			{"percentage zero", func() error { _, err := d.SetDefaultActiveThreadPercentage(ctx, 0); return err }, ErrInvalidValue},
			{"status of no server", func() error { _, err := d.ServerStatus(ctx, 1); return err }, ErrServerNotFound},
			{"clients of no server", func() error { _, err := d.ClientList(ctx, 1); return err }, ErrServerNotFound},
			{"percentage of no server", func() error { _, err := d.ActiveThreadPercentage(ctx, 1); return err }, ErrServerNotFound},
			{"negative uid", func() error { return d.StartServer(ctx, -1) }, ErrInvalidValue},
			{"memory below 1 MiB", func() error { return d.SetDefaultDevicePinnedMemLimit(ctx, 0, 1000) }, ErrInvalidValue},
			{"priority 2", func() error { return d.SetDefaultClientPriority(ctx, 2) }, ErrInvalidValue},
			{"newline in command", func() error { _, err := d.Command(ctx, "get_server_list\nquit"); return err }, ErrInvalidValue},
		} {
			t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.call(), tc.want) })
		}
		// A rejected value is echoed back unchanged.
		if p, err := d.SetDefaultActiveThreadPercentage(ctx, 150); p != 50 {
			t.Errorf("rejected percentage: daemon reports %v (%v), want the old 50", p, err)
		}
		if b.gen == "535" {
			_, err := d.Command(ctx, "get_server_status 1")
			wantErr(t, err, ErrUnknownCommand)
		}

		// A server: started event from the log, listed, status known.
		pid := in.startServer(t)
		if pids, err := d.ServerList(ctx); err != nil || !slices.Contains(pids, pid) {
			t.Fatalf("ServerList = %v, %v; want %d", pids, err, pid)
		}
		st, err := d.ServerStatus(ctx, pid)
		if err != nil || (st != StateInitializing && st != StateActive) {
			t.Errorf("ServerStatus(%d) = %v, %v", pid, st, err)
		}
		// As the daemon reports it, never inferred: 535 cannot.
		if rst, err := d.ReportedServerStatus(ctx, pid); b.gen == "535" {
			wantErr(t, err, ErrUnknownCommand)
		} else if err != nil || (rst != StateInitializing && rst != StateActive) {
			t.Errorf("ReportedServerStatus(%d) = %v, %v", pid, rst, err)
		}
		if b.real {
			// The stand-in never completes the private handshake.
			if st != StateInitializing {
				t.Errorf("stand-in server state %v, want INITIALIZING", st)
			}
			_, err := d.ActiveThreadPercentage(ctx, pid)
			wantErr(t, err, ErrServerNotReady)
		}
		if clients, err := d.ClientList(ctx, pid); err != nil || len(clients) != 0 {
			t.Errorf("ClientList = %v, %v; want none", clients, err)
		}
		// Same uid again: a no-op.
		if err := d.StartServer(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if pids, err := d.ServerList(ctx); err != nil || len(pids) != 1 {
			t.Errorf("ServerList after second start_server = %v, %v; want one", pids, err)
		}
		if err := d.ShutdownServer(ctx, pid, true); err != nil {
			t.Fatal(err)
		}
		in.waitEvent(t, "server exited", kindPID(ServerExited, pid))

		rep, err := d.Stop(ctx)
		if err != nil || !rep.Graceful {
			t.Fatalf("Stop = %+v, %v; want graceful", rep, err)
		}
		in.waitEvent(t, "daemon exited", kindPID(DaemonExited, d.PID()))
		// Gone daemon: commands say so.
		_, err = d.Command(ctx, "get_server_list")
		wantErr(t, err, ErrNoDaemon)
		wantErr(t, d.Probe(ctx), ErrNoDaemon)
		if _, err := Adopt(ctx, cfg); !isErr(err, ErrNoDaemon) {
			t.Errorf("Adopt after stop: %v, want ErrNoDaemon", err)
		}
	})
}

func TestKillEvents(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		in := start(t, newConfig(t, b))
		pid := in.startServer(t)
		// With the daemon stopped, nothing is logged and nobody reaps the
		// server: its exit can only come from the pidfd, with the real
		// wait status read from the zombie.
		if err := unix.Kill(in.d.PID(), unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// SIGSTOP takes effect asynchronously: a daemon still running when
		// the server dies reaps it (the emulator's at once), and the exit
		// status is gone before the pidfd watcher can read it.
		waitStopped(t, in.d.PID())
		sigkill(t, pid)
		ev := in.waitEvent(t, "server exited", kindPID(ServerExited, pid))
		if ev.Source != SourcePidfd || ev.Signal != syscall.SIGKILL {
			t.Errorf("server exit %v; want from pidfd with SIGKILL", ev)
		}
		if err := unix.Kill(in.d.PID(), unix.SIGCONT); err != nil {
			t.Fatal(err)
		}
		in.waitServerGone(t, pid)
		// The daemon stays up after losing its server.
		if err := in.d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("Probe after server kill: %v", err)
		}
		// A second server, then the daemon killed: daemon exit is reported,
		// the orphaned server is killed by Stop.
		pid2 := in.startServer(t)
		sigkill(t, in.d.PID())
		ev = in.waitEvent(t, "daemon exited", kind(DaemonExited))
		if ev.PID != in.d.PID() || (ev.Signal != 0 && ev.Signal != syscall.SIGKILL) {
			t.Errorf("daemon exit event %v", ev)
		}
		rep, err := in.d.Stop(testCtx(t, 10*time.Second))
		if err != nil || !rep.AlreadyExited || !slices.Contains(rep.KilledServers, pid2) {
			t.Errorf("Stop after daemon kill = %+v, %v; want orphan %d killed", rep, err, pid2)
		}
		in.waitEvent(t, "orphan exited", kindPID(ServerExited, pid2))
	})
}

func TestHungDaemonTimesOut(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		in := start(t, newConfig(t, b))
		pid := in.startServer(t)
		if err := unix.Kill(in.d.PID(), unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, in.d.PID()) // else a call may still be answered
		const deadline = 300 * time.Millisecond
		for _, tc := range []struct {
			name string
			call func(ctx context.Context) error
		}{
			{"probe", func(ctx context.Context) error { return in.d.Probe(ctx) }},
			{"server list", func(ctx context.Context) error { _, err := in.d.ServerList(ctx); return err }},
			{"set percentage", func(ctx context.Context) error {
				_, err := in.d.SetDefaultActiveThreadPercentage(ctx, 30)
				return err
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				begin := time.Now()
				err := tc.call(ctx)
				wantErr(t, err, ErrTimeout)
				// Bounded by the deadline plus process teardown, not by the daemon.
				if el := time.Since(begin); el > deadline+2*time.Second {
					t.Errorf("call returned after %v, deadline %v", el, deadline)
				}
			})
		}
		// Stop escalates: quit hangs, server and daemon are SIGKILLed.
		rep, err := in.d.Stop(testCtx(t, 20*time.Second))
		if err != nil || !rep.KilledDaemon || !slices.Contains(rep.KilledServers, pid) {
			t.Fatalf("Stop of hung daemon = %+v, %v; want server %d and daemon killed", rep, err, pid)
		}
		in.waitEvent(t, "daemon exited", kind(DaemonExited))
	})
}

func TestStopEscalatesPastSIGINTIgnoringServer(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		in := start(t, newConfig(t, b, ignoringSIGINT(t)))
		pid := in.startServer(t)
		rep, err := in.d.Stop(testCtx(t, 20*time.Second))
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if rep.Graceful || !slices.Contains(rep.KilledServers, pid) {
			t.Fatalf("Stop = %+v; want server %d killed by escalation", rep, pid)
		}
		in.waitEvent(t, "server exited", kindPID(ServerExited, pid))
		in.waitEvent(t, "daemon exited", kind(DaemonExited))
	})
}

func TestAdoptAfterOwnerExits(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		// The owner: another process that starts the daemon and a server,
		// then exits without stopping them.
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = setEnv(cfg.Env, helperEnv, strings.Join([]string{cfg.ControlPath, cfg.PipeDir, cfg.LogDir}, "|"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var daemonPID, serverPID int
		if n, _ := fmtSscan(string(out), &daemonPID, &serverPID); err != nil || n != 2 {
			t.Fatalf("owner process: %v, output %q, stderr %q", err, out, stderr.String())
		}
		d, err := Adopt(testCtx(t, 10*time.Second), cfg)
		if err != nil {
			killPID(serverPID)
			killPID(daemonPID)
			t.Fatalf("Adopt: %v", err)
		}
		in := watchInstance(t, d)
		if d.PID() != daemonPID {
			t.Fatalf("adopted pid %d, owner started %d", d.PID(), daemonPID)
		}
		// The running server is learned (and watched) through the probe.
		if err := d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		in.waitEvent(t, "adopted server", kindPID(ServerStarted, serverPID))
		sigkill(t, serverPID)
		in.waitEvent(t, "server exited", kindPID(ServerExited, serverPID))
		// A second handle on a running daemon must not start another one.
		if _, err := Start(testCtx(t, 5*time.Second), cfg); !isErr(err, ErrAlreadyRunning) {
			t.Errorf("Start over a live daemon: %v, want ErrAlreadyRunning", err)
		}
		if err := d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Errorf("Probe after refused Start: %v (stale-file cleanup touched a live daemon?)", err)
		}
	})
}

func TestTwoDaemonsIndependent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := start(t, newConfig(t, b))
		c := start(t, newConfig(t, b))
		sa, sc := a.startServer(t), c.startServer(t)
		sigkill(t, a.d.PID())
		a.waitEvent(t, "daemon a exited", kind(DaemonExited))
		ctx := testCtx(t, 5*time.Second)
		if err := c.d.Probe(ctx); err != nil {
			t.Fatalf("daemon c after a died: %v", err)
		}
		if pids, err := c.d.ServerList(ctx); err != nil || !slices.Equal(pids, []int{sc}) {
			t.Errorf("c's servers = %v, %v; want [%d]", pids, err, sc)
		}
		for len(c.events) > 0 {
			if ev := <-c.events; ev.Kind == DaemonExited || ev.Kind == ServerExited {
				t.Errorf("daemon c got an exit event from a's death: %v", ev)
			}
		}
		if rep, err := a.d.Stop(ctx); err != nil || !slices.Contains(rep.KilledServers, sa) {
			t.Errorf("Stop a = %+v, %v", rep, err)
		}
	})
}

func TestRestartOverStaleFiles(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		first := start(t, cfg)
		sigkill(t, first.d.PID())
		first.waitEvent(t, "daemon exited", kind(DaemonExited))
		if _, err := os.Stat(filepath.Join(cfg.PipeDir, lockFileName)); err != nil {
			t.Fatalf("SIGKILL should leave the lock file: %v", err)
		}
		// A stale pid file naming a live process that is not a daemon (this
		// test) must not be taken for one.
		if err := os.WriteFile(filepath.Join(cfg.PipeDir, pidFileName), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			t.Fatal(err)
		}
		second := start(t, cfg)
		if second.d.PID() == first.d.PID() || second.d.PID() == os.Getpid() {
			t.Fatalf("restarted daemon pid %d", second.d.PID())
		}
		if err := second.d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		second.startServer(t)
	})
}

func TestLogFollowerSurvivesRotation(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		in := start(t, cfg)
		logPath := filepath.Join(cfg.LogDir, controlLog)
		for _, rotate := range []struct {
			name string
			do   func() error
		}{
			{"copytruncate", func() error { return os.Truncate(logPath, 0) }},
			{"rename", func() error {
				if err := os.Rename(logPath, logPath+".1"); err != nil {
					return err
				}
				return os.WriteFile(logPath, nil, 0o644)
			}},
		} {
			if err := rotate.do(); err != nil {
				t.Fatalf("%s: %v", rotate.name, err)
			}
			// ServerStarted comes only from the log (no ServerList call here).
			pid := in.startServer(t)
			sigkill(t, pid)
			in.waitEvent(t, "server exited after "+rotate.name, kindPID(ServerExited, pid))
			in.waitServerGone(t, pid)
		}
	})
}

// recordingRunner is a Runner that records argument lists.
type recordingRunner struct {
	mu   sync.Mutex
	args [][]string
}

func (r *recordingRunner) Start(cmd *exec.Cmd) error {
	r.mu.Lock()
	r.args = append(r.args, slices.Clone(cmd.Args[1:]))
	r.mu.Unlock()
	return cmd.Start()
}

func TestRunnerSeesEveryInvocation(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		rr := &recordingRunner{}
		cfg := newConfig(t, b)
		cfg.Runner = rr
		cfg.Multiuser = true
		d, err := Start(testCtx(t, 10*time.Second), cfg)
		if err == nil {
			watchInstance(t, d)
			if _, err := d.ServerList(testCtx(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		} else {
			// NVIDIA's daemon refuses -multiuser-server without a Volta+ GPU.
			t.Logf("Start -multiuser-server: %v", err)
		}
		rr.mu.Lock()
		defer rr.mu.Unlock()
		if len(rr.args) == 0 || !slices.Equal(rr.args[0], []string{"-d", "-multiuser-server"}) {
			t.Fatalf("first invocation %v, want -d -multiuser-server", rr.args)
		}
		for _, a := range rr.args[1:] {
			if len(a) != 0 {
				t.Errorf("command passed as argv %v; commands go on stdin (555 rejects argv)", a)
			}
		}
	})
}

// waitStopped waits until pid is in stopped state. The kernel offers no
// event for that to anyone but the parent, so it polls /proc with a deadline.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("daemon %d: %v", pid, err)
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d not stopped after SIGSTOP within 5s", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// Check asks the daemon nothing: the control log grows by no record for
// it, on NVIDIA's daemons as on the emulator. It finds a stopped daemon
// (ErrTimeout, as a command to it would) and a dead one (ErrNoDaemon).
func TestCheckLogsNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		in := start(t, cfg)
		// logged is control.log's size once the last probe's records are
		// all in it: its command came back and the session's close after.
		logged := func() int64 {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				b, err := os.ReadFile(filepath.Join(cfg.LogDir, controlLog))
				if err != nil {
					t.Fatal(err)
				}
				if _, n := in.d.LogSilentSince(); n == 0 && strings.HasSuffix(string(b), "UI closed\n") {
					return int64(len(b))
				}
				if time.Now().After(deadline) {
					t.Fatal("the probes' records did not come back in control.log within 10s")
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		// One probe's records, then the same probe after many checks: the
		// checks wrote nothing between them. A first probe puts every
		// record of the start before them.
		if err := in.d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("Probe: %v", err)
		}
		before := logged()
		if err := in.d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("Probe: %v", err)
		}
		probe := logged() - before
		for range 50 {
			if err := in.d.Check(); err != nil {
				t.Fatalf("Check of a running daemon: %v", err)
			}
		}
		if err := in.d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("Probe: %v", err)
		}
		if got := logged() - before - probe; got != probe {
			t.Errorf("50 checks and a probe logged %d bytes, a probe alone %d: the checks logged something", got, probe)
		}

		if err := unix.Kill(in.d.PID(), unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, in.d.PID())
		wantErr(t, in.d.Check(), ErrTimeout)
		if err := unix.Kill(in.d.PID(), unix.SIGCONT); err != nil {
			t.Fatal(err)
		}
		sigkill(t, in.d.PID())
		in.waitEvent(t, "daemon exited", kind(DaemonExited))
		wantErr(t, in.d.Check(), ErrNoDaemon)
	})
}
