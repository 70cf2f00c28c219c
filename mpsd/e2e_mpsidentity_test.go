package mpsd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

// readState and writeState edit the state between mpsd runs, as a
// previous mpsd (or an older one) would have left it.
func readState(t *testing.T, e *testEnv) savedState {
	t.Helper()
	b := e.stateBytes()
	var st savedState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("state %s: %v", b, err)
	}
	return st
}

func writeState(t *testing.T, e *testEnv, st savedState) {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	e.setState(b)
}

// stateBytes is the state as the next mpsd would load it, read without
// touching anything (mpsd may be running): the journal's last whole
// record, else the state file; nil if neither is there.
func (e *testEnv) stateBytes() []byte {
	return stateBytesAt(filepath.Join(e.dir, "state", "state.json"))
}

// stateBytesAt is stateBytes of the state file at path.
func stateBytesAt(path string) []byte {
	if jb, err := os.ReadFile(path + journalSuffix); err == nil {
		recs := bytes.SplitAfter(jb, []byte("\n"))
		for i := len(recs) - 1; i >= 0; i-- {
			if r := recs[i]; len(r) > 0 && r[len(r)-1] == '\n' {
				if _, err := decodeState(r); err == nil {
					return r
				}
			}
		}
	}
	b, _ := os.ReadFile(path)
	return b
}

// setState makes b the state (mpsd stopped): the state file, no journal.
func (e *testEnv) setState(b []byte) {
	e.t.Helper()
	path := filepath.Join(e.dir, "state", "state.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Remove(path + journalSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
}

// startTimeOf is field 22 of /proc/<pid>/stat.
func startTimeOf(t *testing.T, pid int) uint64 {
	t.Helper()
	v, err := procStartTime("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRestartAdoptsTheRecordedDaemon: mpsd records each instance's MPS
// control daemon (pid and start time) in its state; the next mpsd adopts
// that daemon only. A state naming another process (the daemon it ran is
// gone; here, a start time that differs) makes it stop the daemon found
// there and start a new one; a state from an older mpsd, without
// identities, adopts the verified holder of control_lock.
func TestRestartAdoptsTheRecordedDaemon(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	allReady := func(st api.Status) bool {
		for _, in := range st.Instances {
			if in.DaemonPID <= 0 || in.State != api.InstanceReady {
				return false
			}
		}
		return len(st.Instances) > 0
	}
	e.start()
	first := daemonPIDs(e.waitStatus("the daemons up", allReady))
	e.stop()
	st := readState(t, e)
	if len(st.Daemons) != len(first) {
		t.Fatalf("state records daemons %v, want one per instance %v", st.Daemons, first)
	}
	for _, sd := range st.Daemons {
		if !slices.Contains(slices.Collect(maps.Values(first)), sd.PID) {
			t.Fatalf("state records daemon %d, status showed %v", sd.PID, first)
		}
		if want := startTimeOf(t, sd.PID); sd.StartTime != want {
			t.Errorf("recorded start time %d of daemon %d, /proc says %d", sd.StartTime, sd.PID, want)
		}
	}

	// An older mpsd's state: the daemons are adopted by their locks.
	st.Daemons = nil
	writeState(t, e, st)
	e.start()
	again := daemonPIDs(e.waitStatus("the daemons adopted", allReady))
	if !maps.Equal(again, first) {
		t.Fatalf("daemons after a restart from an old state %v, before %v: not adopted", again, first)
	}
	e.stop()
	if b, _ := os.ReadFile(e.log.Name()); !strings.Contains(string(b), "state file has no MPS daemon identities") {
		t.Errorf("mpsd did not log that the state had no daemon identities")
	}

	// One recorded daemon is not the one there: that one is stopped and
	// replaced; the other instance's is adopted.
	st = readState(t, e)
	keys := slices.Sorted(maps.Keys(st.Daemons))
	if len(keys) < 2 {
		t.Fatalf("want two instances, state has %v", st.Daemons)
	}
	tampered, kept := st.Daemons[keys[0]], st.Daemons[keys[1]]
	bad := tampered
	bad.StartTime++
	st.Daemons[keys[0]] = bad
	writeState(t, e, st)
	e.start()
	after := daemonPIDs(e.waitStatus("a new daemon for the tampered instance", func(st api.Status) bool {
		if !allReady(st) {
			return false
		}
		for _, in := range st.Instances {
			if in.DaemonPID == tampered.PID {
				return false
			}
		}
		return true
	}))
	if !slices.Contains(slices.Collect(maps.Values(after)), kept.PID) {
		t.Errorf("daemons after restart %v: the recorded daemon %d was not adopted", after, kept.PID)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(tampered.PID) + "/stat"); err == nil {
		rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if rest[0] != "Z" && startTimeOf(t, tampered.PID) == tampered.StartTime {
			t.Errorf("daemon %d, not the recorded one, still runs beside its replacement (%v)", tampered.PID, after)
		}
	}
}

// uidRecordForger is a tenant of the group in TestForgedMPSRecordsAreCounted.
const uidRecordForger = 64103

// TestForgedMPSRecordsAreCounted: a tenant of the group writes forged
// records into its MPS daemon's log FIFO (anyone who reaches the pipe
// directory can): a server start naming a root process, and fatal GPU
// faults naming that process and the daemon. Nothing is signalled, no
// lease is revoked, no fault is counted; each record is counted in
// mpsd_unverified_mps_records_total.
func TestForgedMPSRecordsAreCounted(t *testing.T) {
	groups := `  a:
    users: ["root", "` + emutest.User(t, uidRecordForger) + `"]
    memory: 20G
`
	e := newEnv(t, groups, "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	lease := startProc(t, e.launch("--sm", "20", "--mem", "1G", "--", client, "--duration", "1m"))
	st := e.waitStatus("the lease running", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(instanceOf(st, "a", st.Leases[0].GPUIndexes[0]).ServerPIDs) == 1
	})
	gpu := st.Leases[0].GPUIndexes[0]
	in := instanceOf(st, "a", gpu)
	victim := exec.Command("sleep", "600")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })

	pipe := filepath.Join(e.dir, "run", "a", in.GPUUUID, "pipe")
	now := time.Now()
	var recs []byte
	for _, r := range []mpslog.Record{
		{Kind: mpslog.Control, PID: victim.Process.Pid, Time: now, Msg: fmt.Sprintf("Starting new server %d for user 0", victim.Process.Pid)},
		{Kind: mpslog.Server, PID: victim.Process.Pid, Time: now, Msg: "Server is handling a fatal GPU error."},
		{Kind: mpslog.Server, PID: in.DaemonPID, Time: now, Msg: "Server is handling a fatal GPU error."},
	} {
		recs = append(recs, r.Encode()...)
	}
	recFile := filepath.Join(e.dir, "records")
	if err := os.WriteFile(recFile, recs, 0o644); err != nil {
		t.Fatal(err)
	}
	dd := asUID(exec.Command("dd", "if="+recFile, "of="+filepath.Join(pipe, "log"), "oflag=nonblock", "conv=notrunc", "bs=4096", "status=none"), uidRecordForger)
	if out, err := dd.CombinedOutput(); err != nil {
		t.Fatalf("tenant %d writing into %s/log: %v: %s", uidRecordForger, pipe, err, out)
	}

	counted := func() float64 { return unverifiedRecords(t, e.d, in.GPUUUID) }
	deadline := time.Now().Add(waitFor)
	for counted() < 3 { // a metric offers nothing to wait on
		if time.Now().After(deadline) {
			t.Fatalf("mpsd_unverified_mps_records_total = %v, want 3", counted())
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := e.d.Status()
	if n := countLeases(after, api.LeaseRunning); n != 1 || after.Leases[0].Attempt != 1 {
		t.Errorf("leases after forged faults: %+v; want the one lease running, attempt 1", after.Leases)
	}
	if got := instanceOf(after, "a", gpu); got.Restarts != 0 || got.DaemonPID != in.DaemonPID {
		t.Errorf("instance after forged records: %+v; want untouched", got)
	}
	if err := victim.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("victim: %v", err)
	}
	if b, _ := os.ReadFile(e.log.Name()); !strings.Contains(string(b), "MPS log record not acted on") {
		t.Errorf("mpsd logged no warning for the forged records")
	}
	_ = lease.cmd.Process.Signal(syscall.SIGTERM)
	lease.wait(t)
}

// A control daemon the watchdog restarts is recorded at once, with no
// lease to write the state for: else a crash of mpsd before the next
// write leaves the state naming the dead daemon, and the next mpsd takes
// the live one for a stranger, stops it and revokes its leases.
func TestRestartedDaemonRecordedAtOnce(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	e.start()
	st := e.waitStatus("instances ready", isoAllReady)
	old := st.Instances[0]
	// savedDaemonFor waits (within waitFor) for the state file to name
	// want for some instance, and returns that instance's key.
	savedDaemonFor := func(want savedDaemon) string {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for {
			if b := e.stateBytes(); b != nil {
				var st savedState
				if json.Unmarshal(b, &st) == nil {
					for k, sd := range st.Daemons {
						if sd == want {
							return k
						}
					}
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the state file never names daemon %+v", want)
			}
			time.Sleep(20 * time.Millisecond) // a file: nothing to wait on
		}
	}
	key := savedDaemonFor(savedDaemon{PID: old.DaemonPID, StartTime: startTimeOf(t, old.DaemonPID)})
	if err := syscall.Kill(old.DaemonPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = e.waitStatus("a new daemon", func(st api.Status) bool {
		in := st.Instances[0]
		return in.State == api.InstanceReady && in.DaemonPID != 0 && in.DaemonPID != old.DaemonPID
	})
	pid := st.Instances[0].DaemonPID
	if got := savedDaemonFor(savedDaemon{PID: pid, StartTime: startTimeOf(t, pid)}); got != key {
		t.Errorf("the restarted daemon is saved for %s, want %s", got, key)
	}
}

// unverifiedRecords is mpsd_unverified_mps_records_total of the instance
// on the GPU of that UUID, -1 before it has one.
func unverifiedRecords(t *testing.T, d *Daemon, gpuUUID string) float64 {
	t.Helper()
	return metricOf(t, d, "mpsd_unverified_mps_records_total", "gpu", gpuUUID)
}

// metricOf is the value (a counter's or a gauge's) of the first series of
// metric name whose label has value, -1 when there is none.
func metricOf(t *testing.T, d *Daemon, name, label, value string) float64 {
	t.Helper()
	fams, err := d.metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}
