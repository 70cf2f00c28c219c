package mpsd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/simhost"
	"github.com/mpsd/mpsd/internal/testrun"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// What the watchdog's probes write into the control daemon's control.log,
// and how soon they still find a daemon that cannot answer. The probes run
// one by one, as the probe clock's ticks run them (supervisor.go), on a
// control daemon of the emulator, which logs every command as NVIDIA's
// 535, 550 and 555 do (four records, 221 bytes with a five-digit pid).

// probeEnv is fakeCore's Daemon with its instance up on a real control
// daemon of the emulator, and that daemon's control.log.
type probeEnv struct {
	d   *Daemon
	in  *instance
	dm  control
	log string
}

func newProbeEnv(t *testing.T, wd policy.WatchdogConfig) *probeEnv {
	t.Helper()
	d, in, _, _ := fakeCore(t, wd)
	dir, err := testrun.MkdirTemp("", "mpsp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithCancel(context.Background())
	d.ctx = ctx
	d.metrics = &metrics{requeues: map[string]uint64{}}
	d.starter, d.proc, d.res = mpsStarter{}, "/proc", newResources(d.log)
	d.mpsBase = simhost.MPS(mps.Config{Env: os.Environ(), QuitTimeout: time.Second}, emutest.BinDir(t), dir, "")
	in.pipeDir, in.logDir = filepath.Join(dir, "pipe"), filepath.Join(dir, "log")
	in.maxSM, in.maxMem = 100, 1<<30
	// Reconciliation reads the host's GPUs, which this Daemon has none
	// of: the probes' own commands are under test, and a reconciliation
	// sends none while NVML shows no client.
	in.reconRunning = true
	d.bringUp(in, false)
	d.mu.Lock()
	dm, life := in.daemon, in.life
	d.mu.Unlock()
	if dm == nil || life != instUp {
		cancel()
		t.Fatalf("instance not up on the emulator's control daemon: life %s", life)
	}
	t.Cleanup(func() {
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if _, err := dm.Stop(sctx); err != nil {
			t.Logf("stop the control daemon: %v", err)
		}
		_ = dm.Close()
	})
	return &probeEnv{d: d, in: in, dm: dm, log: filepath.Join(in.logDir, "control.log")}
}

// logged waits until the control log holds every record of the probe
// commands sent so far (the command came back, and the session's close
// after it), and returns its size then.
func (e *probeEnv) logged(t *testing.T) int64 {
	t.Helper()
	var size int64
	waitCond(t, "the probes' records in control.log", func() bool {
		b, err := os.ReadFile(e.log)
		if err != nil {
			t.Fatal(err)
		}
		size = int64(len(b))
		_, n := e.dm.LogSilentSince()
		return n == 0 && strings.HasSuffix(string(b), "UI closed\n")
	}, nil)
	return size
}

// commandRecords counts the probe commands control.log has recorded.
func (e *probeEnv) commandRecords(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(e.log)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "Cmd:get_server_list")
}

// probeCommandEvery is the watchdog.probe_command_every of the probe
// noise tests: a command each twelfth probe.
const probeCommandEvery = 12

// Probes with watchdog.probe_command_every 12 write at most a tenth of
// what a command each probe (the default) writes: 120 probes (four
// minutes at the default 2 s) are measured against 120 times the bytes
// one command's records take; at the default every probe sends one.
func TestProbesWriteATenthOfControlLog(t *testing.T) {
	t.Run("default", func(t *testing.T) { probeNoise(t, 1) })
	t.Run("every 12", func(t *testing.T) { probeNoise(t, probeCommandEvery) })
}

func probeNoise(t *testing.T, every int) {
	wd := policy.WatchdogConfig{ProbeInterval: 2 * time.Second, ProbeTimeout: time.Second, ProbeFailures: 3, ProbeCommandEvery: every,
		BackoffInitial: time.Second, BackoffMax: 4 * time.Second, QuarantineAfter: 3, QuarantineWindow: 10 * time.Minute}
	e := newProbeEnv(t, wd)

	// What one command costs: the probe of every tick before. A first
	// one puts every record of the start before it.
	probeOnce := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.dm.Probe(ctx); err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	probeOnce()
	before := e.logged(t)
	probeOnce()
	perCommand := e.logged(t) - before
	if perCommand < 100 {
		t.Fatalf("one probe command logged %d bytes; want its records (some 220 bytes)", perCommand)
	}

	const probes = 120
	start, commands := e.logged(t), e.commandRecords(t)
	for range probes {
		// A probe interval is time enough for the last command's records
		// to come back, which the next probe looks for.
		e.logged(t)
		e.d.probe(e.in, wd.ProbeTimeout, wd.ProbeFailures)
	}
	wrote, sent := e.logged(t)-start, e.commandRecords(t)-commands
	if bound := probes * perCommand / 10; every > 1 && wrote > bound {
		t.Errorf("%d probes wrote %d bytes (%d commands) into control.log; want at most %d, a tenth of a command each probe (%d bytes each)",
			probes, wrote, sent, bound, perCommand)
	}
	// Each command still comes back in the log: a lost log is still seen.
	if want := probes / every; sent != want {
		t.Errorf("%d probes sent %d commands, want %d (one every %d)", probes, sent, want, every)
	}
	t.Logf("%d probes wrote %d bytes, %d commands; a command each probe would have written %d", probes, wrote, sent, probes*perCommand)
}

// A stopped control daemon is found hung after exactly the configured
// failures in a row, counted from the first probe after it stopped, as
// when every probe sent a command: the probe that finds its process
// stopped sends the command at once, and every probe after a failure
// does too.
func TestProbeFindsAStoppedDaemonAsSoon(t *testing.T) {
	wd := policy.WatchdogConfig{ProbeInterval: 2 * time.Second, ProbeTimeout: 300 * time.Millisecond, ProbeFailures: 3, ProbeCommandEvery: probeCommandEvery,
		BackoffInitial: time.Second, BackoffMax: 4 * time.Second, QuarantineAfter: 3, QuarantineWindow: 10 * time.Minute}
	e := newProbeEnv(t, wd)
	hung := make(chan fault, 1)
	e.d.opts.faultHook = func(_ *instance, f fault) {
		if f.kind == faultHung {
			hung <- f
		}
	}
	// Some quiet probes first: the daemon answers and is not asked.
	for range probeCommandEvery / 2 {
		e.d.probe(e.in, wd.ProbeTimeout, wd.ProbeFailures)
	}
	pid := e.dm.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	waitCond(t, "the daemon stopped", func() bool {
		return errors.Is(e.dm.Check(), mps.ErrTimeout)
	}, nil)
	for i := 1; i <= wd.ProbeFailures; i++ {
		select {
		case f := <-hung:
			t.Fatalf("hung after %d probes, want %d: %s", i-1, wd.ProbeFailures, f.reason)
		default:
		}
		e.d.probe(e.in, wd.ProbeTimeout, wd.ProbeFailures)
		e.d.mu.Lock()
		fails := e.in.probeFails
		e.d.mu.Unlock()
		if i < wd.ProbeFailures && fails != i {
			t.Fatalf("after %d probes of the stopped daemon, %d failures in a row; want %d", i, fails, i)
		}
	}
	select {
	case f := <-hung:
		if !strings.Contains(f.reason, "stopped answering (3 probes failed)") {
			t.Errorf("hung fault's reason %q", f.reason)
		}
	default:
		t.Fatalf("no hung fault after %d probes of a stopped daemon", wd.ProbeFailures)
	}
}
