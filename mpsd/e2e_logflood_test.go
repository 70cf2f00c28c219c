package mpsd

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Attacker tests of a member who floods the log FIFO (docs/security.md,
// rule 19). Uids 64360-64369 are this file's.
const floodAttackerUID = 64361 // a member of group a with no lease

// clientListCounter starts every MPS control command and counts the
// get_client_list ones: each is a process mpsd forks.
type clientListCounter struct{ n atomic.Int64 }

func (r *clientListCounter) Start(cmd *exec.Cmd) error {
	if cmd.Stdin != nil {
		b, err := io.ReadAll(cmd.Stdin)
		if err != nil {
			return fmt.Errorf("read the command's input: %w", err)
		}
		if bytes.Contains(b, []byte("get_client_list")) {
			r.n.Add(1)
		}
		cmd.Stdin = bytes.NewReader(b)
	}
	return cmd.Start()
}

// reconRunsOf is how many reconciliations of the instance key have run.
func reconRunsOf(d *Daemon, key string) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.metrics.reconRuns[key]
}

// waitUnverified waits until the instance on the GPU of that UUID has
// counted more unverified records than before (-1: none yet).
func waitUnverified(t *testing.T, d *Daemon, gpuUUID string, before float64) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for unverifiedRecords(t, d, gpuUUID) <= max(before, 0) { // a metric offers nothing to wait on
		if time.Now().After(deadline) {
			t.Fatalf("mpsd_unverified_mps_records_total stays %v", unverifiedRecords(t, d, gpuUUID))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A member floods the log FIFO of an instance with NEW CLIENT records (any
// member may write them, as fast as the daemon takes them). Each is a
// reason to reconcile the instance, and on a GPU two instances share a
// reconciliation forks get_client_list for each of the instance's servers.
// mpsd reconciles the instance at most once per probe interval all the
// same, probes included: over the flood it runs at most its duration over
// the probe interval, plus 3, reconciliations and as many get_client_list
// commands, and the lease on it runs on.
func TestNewClientFloodReconcilesOncePerProbeInterval(t *testing.T) {
	attacker := emutest.User(t, floodAttackerUID)
	const interval = 500 * time.Millisecond
	e := newEnvGPUs(t, 1, `  a:
    users: [root, `+attacker+`]
    memory: 10G
  b:
    users: [root]
    memory: 10G
`, fmt.Sprintf("watchdog:\n  probe_interval: %s\n  probe_timeout: 400ms\n  backoff_initial: 50ms\n  backoff_max: 1s\n", interval))
	lists := &clientListCounter{}
	e.opts.mpsRunner = lists
	e.start()
	forge := e.buildTestProgram("mpsforge")
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, e.launch("--group", "a", "--sm", "10", "--mem", "1G", "--", client, "--duration", "5m"))
	st := e.waitStatus("the lease on a live MPS server", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(instanceOf(st, "a", 0).ServerPIDs) == 1
	})
	in := instanceOf(st, "a", 0)
	key := instanceKey("a", []int{0})
	fifo := filepath.Join(e.dir, "run", "a", in.GPUUUID, "pipe", "log")

	runs0, lists0, unverified0 := reconRunsOf(e.d, key), lists.n.Load(), unverifiedRecords(t, e.d, in.GPUUUID)
	began := time.Now()
	const records = 50000
	cmd := exec.Command(forge, "-fifo", fifo, "-kind", "control", "-pid", fmt.Sprint(in.DaemonPID), "-repeat", fmt.Sprint(records),
		"-msg", fmt.Sprintf("NEW CLIENT %d from user %d: Server already exists", os.Getpid(), floodAttackerUID))
	if r := run(t, asUID(cmd, floodAttackerUID)); r.code != 0 {
		t.Fatalf("mpsforge as uid %d: exit %d, stderr %q", floodAttackerUID, r.code, r.stderr)
	}
	// Read after the flood: once mpsd counts it, it has had every record
	// before it (a record naming no server).
	e.forge(forge, floodAttackerUID, fifo, "control", in.DaemonPID, fmt.Sprintf("NEW SERVER %d: Ready", os.Getpid()))
	waitUnverified(t, e.d, in.GPUUUID, unverified0)
	took := time.Since(began)
	runs, listed := reconRunsOf(e.d, key)-runs0, lists.n.Load()-lists0
	most := uint64(took/interval) + 3
	t.Logf("%d NEW CLIENT records in %s: %d reconciliations of the instance, %d get_client_list commands", records, took.Round(time.Millisecond), runs, listed)
	if runs > most {
		t.Errorf("%d reconciliations of the instance in %s; want at most %d (one per probe interval of %s, plus 3)", runs, took.Round(time.Millisecond), most, interval)
	}
	if listed > int64(most) {
		t.Errorf("%d get_client_list commands in %s; want at most %d (one per reconciliation of the instance's one server)", listed, took.Round(time.Millisecond), most)
	}
	after := e.d.Status()
	if countLeases(after, api.LeaseRunning) != 1 || after.Leases[0].Attempt != 1 {
		t.Errorf("leases after the flood: %+v; want the one lease running, attempt 1", after.Leases)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)
}

// mpsInfoVersion is the mps_version label of mpsd_mps_info for the group's
// instance; ok is false when it has none.
func mpsInfoVersion(t *testing.T, d *Daemon, group string) (string, bool) {
	t.Helper()
	fams, err := d.metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "mpsd_mps_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["group"] == group {
				return labels["mps_version"], true
			}
		}
	}
	return "", false
}

// A member writes a "CUDA MPS Control binary version" record in the
// daemon's name into the log FIFO. Before 580 the daemon writes none, so
// it would be the only one; from 580 on it comes after the daemon's own.
// Either way status and mpsd_mps_info show the version NVML gives (none
// before 580), never the record's.
func TestForgedMPSVersionLineShowsNothing(t *testing.T) {
	for _, tt := range []struct{ model, driver, want string }{
		{"h100-80g", "550.163.01", ""},
		{"h200-141g", "580.159.04", "13000"},
	} {
		t.Run(tt.model, func(t *testing.T) {
			attacker := emutest.User(t, floodAttackerUID)
			e := newEnvGPUs(t, 1, `  a:
    users: [root, `+attacker+`]
    memory: 10G
`, "")
			e.simulateModel(tt.model)
			e.start()
			forge := e.buildTestProgram("mpsforge")
			st := e.waitStatus("the instance's daemon up", func(st api.Status) bool {
				in := instanceOf(st, "a", 0)
				return in.State == api.InstanceReady && in.DaemonPID != 0 && in.DriverVersion == tt.driver
			})
			in := instanceOf(st, "a", 0)
			if in.MPSVersion != tt.want {
				t.Fatalf("MPS version before the forged record %q; want %q", in.MPSVersion, tt.want)
			}
			fifo := filepath.Join(e.dir, "run", "a", in.GPUUUID, "pipe", "log")
			before := unverifiedRecords(t, e.d, in.GPUUUID)
			e.forge(forge, floodAttackerUID, fifo, "control", in.DaemonPID,
				"CUDA MPS Control binary version: 99999",
				// Read after the line above: once mpsd counts it, the
				// version line has been read.
				fmt.Sprintf("NEW SERVER %d: Ready", os.Getpid()))
			waitUnverified(t, e.d, in.GPUUUID, before)
			if got := instanceOf(e.d.Status(), "a", 0).MPSVersion; got != tt.want {
				t.Errorf("status's MPS version after a forged version line %q; want %q", got, tt.want)
			}
			if got, ok := mpsInfoVersion(t, e.d, "a"); !ok || got != tt.want {
				t.Errorf("mpsd_mps_info{mps_version} after a forged version line %q (%v); want %q", got, ok, tt.want)
			}
		})
	}
}
