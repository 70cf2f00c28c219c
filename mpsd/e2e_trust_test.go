package mpsd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Attacker tests of the trust boundary (docs/security.md): tenants write
// into what NVIDIA's daemon leaves world-writable, and mpsd must not turn
// it against anyone. Uids 64300-64349 are this file's.
const (
	trustVictimUID   = 64301 // a member of group a who holds a lease
	trustAttackerUID = 64302 // a member of group a with no lease
)

// buildTestProgram builds ./testdata/<name> into the test's directory.
func (e *testEnv) buildTestProgram(name string) string {
	e.t.Helper()
	out := filepath.Join(e.dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./testdata/"+name)
	if b, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("go build ./testdata/%s: %v\n%s", name, err, b)
	}
	return out
}

// forge writes records into an instance's log FIFO as uid.
func (e *testEnv) forge(prog string, uid uint32, fifo, kind string, pid int, msgs ...string) {
	e.t.Helper()
	args := []string{"-fifo", fifo, "-kind", kind, "-pid", fmt.Sprint(pid)}
	for _, m := range msgs {
		args = append(args, "-msg", m)
	}
	if r := run(e.t, asUID(exec.Command(prog, args...), uid)); r.code != 0 {
		e.t.Fatalf("mpsforge as uid %d: exit %d, stderr %q", uid, r.code, r.stderr)
	}
}

// waitLogAny waits until mpsd's log holds one of ss.
func (e *testEnv) waitLogAny(ss ...string) {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		b, _ := os.ReadFile(e.log.Name())
		for _, s := range ss {
			if bytes.Contains(b, []byte(s)) {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("mpsd logged none of %q within %s", ss, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// newTrustEnv runs mpsd with one group on GPU 0 whose members are the
// victim and the attacker, real users made for the test.
func newTrustEnv(t *testing.T) *testEnv {
	victimName, attackerName := emutest.User(t, trustVictimUID), emutest.User(t, trustAttackerUID)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    gpus: ["0"]
`, victimName, attackerName), "")
	e.start()
	return e
}

// A group member with no lease writes fault, exit, start-failure and
// new-server records into the log FIFO of the instance another member
// runs on. NVIDIA's daemon copies them into control.log and server.log
// as if MPS had written them. mpsd acts on none of them: the running
// lease is not revoked, the instance neither restarts nor counts a
// failure, and the root process a forged "new server" record named is
// not killed when an admin restarts the instance afterwards.
func TestForgedMPSRecordsRevokeNothing(t *testing.T) {
	e := newTrustEnv(t)
	forge := e.buildTestProgram("mpsforge")
	client := filepath.Join(e.emu, "mpsemu-client")
	gateArgs, open := e.gate("forged")
	// The client stays connected until the test opens the gate.
	script := `echo "attempt $MPSD_ATTEMPT"; "$0" --duration 1m & c=$!; ` + gateArgs[2] + `; kill -INT $c; wait $c; s=$?; [ $s = 130 ] && exit 0; exit $s`
	p := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script, client), trustVictimUID))
	st := e.waitStatus("the victim's client on a live MPS server", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Instances) == 1 && len(st.Instances[0].ServerPIDs) > 0
	})
	inst := st.Instances[0]
	server, daemon := inst.ServerPIDs[0], inst.DaemonPID
	fifo := filepath.Join(e.dir, "run", "a", inst.GPUUUID, "pipe", "log")

	// A root process the forged "new server" record names.
	bystander := exec.Command("sleep", "300")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bystander.Process.Kill(); _, _ = bystander.Process.Wait() })

	e.forge(forge, trustAttackerUID, fifo, "server", server, "Server is handling a fatal GPU error.")
	e.forge(forge, trustAttackerUID, fifo, "server", bystander.Process.Pid, "Server is handling a fatal GPU error.")
	e.forge(forge, trustAttackerUID, fifo, "control", daemon,
		fmt.Sprintf("Starting new server %d for user %d", bystander.Process.Pid, trustAttackerUID),
		fmt.Sprintf("Server %d exited with status 1", server),
		"Server encountered a fatal exception. Shutting down",
		fmt.Sprintf("Failed to start server using uid %d, error: forged", trustVictimUID))

	// Either mpsd declines the records (and says so) or it acts on them
	// (recovers the instance, as it did before the trust boundary).
	e.waitLogAny("MPS log record not acted on", "instance failed; recovering")

	// The same fault record written while mpsd is away: the next mpsd
	// reads it, cannot match an Xid with it any more, and takes only
	// leases that ended; the victim's runs on.
	e.stop()
	e.forge(forge, trustAttackerUID, fifo, "server", server, "Server is handling a fatal GPU error.")
	e.start()
	e.waitLogAny("written while mpsd was away", "instance failed; recovering")
	open()
	r := p.wait(t)
	if r.code != 0 || strings.Contains(r.stdout, "attempt 2") || strings.Contains(r.stderr, "revoked") {
		t.Fatalf("the victim's launch: exit %d, stdout %q, stderr %q; want one attempt, exit 0", r.code, r.stdout, r.stderr)
	}
	st = e.d.Status()
	if got := st.Instances[0]; got.Restarts != 0 || got.State != "ready" {
		t.Errorf("instance after forged records: state %s, %d restarts; want ready, 0", got.State, got.Restarts)
	}
	if faults := countedFaults(e.d); faults != 0 {
		t.Errorf("%d faults counted for forged records, want 0", faults)
	}

	// An admin restart stops the daemon and every server mpsd knows of:
	// the bystander must not be among them.
	cmd := exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "restart", "--group", "a")
	if r := run(t, cmd); r.code != 0 {
		t.Fatalf("mpsctl restart: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("a new control daemon", func(st api.Status) bool {
		return len(st.Instances) == 1 && st.Instances[0].State == "ready" && st.Instances[0].DaemonPID != daemon
	})
	if !alive(bystander.Process.Pid) {
		t.Fatalf("the root process %d a forged record named as a server was killed", bystander.Process.Pid)
	}
	if b, err := os.ReadFile(e.log.Name()); err == nil && strings.Contains(string(b), fmt.Sprintf("%d", bystander.Process.Pid)) &&
		strings.Contains(string(b), "killed_servers=["+fmt.Sprint(bystander.Process.Pid)) {
		t.Errorf("mpsd's log says it killed the bystander %d", bystander.Process.Pid)
	}
}

// countedFaults is the number of faults mpsd has counted against its
// instances (towards quarantine).
func countedFaults(d *Daemon) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var faults int
	for _, in := range d.instances {
		for _, n := range in.faults {
			faults += n
		}
	}
	return faults
}

// A member writes fault records naming the victim's (verified) server
// into the log FIFO as fast as the daemon takes them. Each would wait
// faultClaimWait for an Xid, with a timer of its own, while mpsd's lock
// walks the instance's claims: thousands at once, for every tenant's
// instance. mpsd keeps at most maxClaimsPerServer claims per server
// waiting; more records join the newest, so the flood makes that many
// claims (and log lines) each faultClaimWait at most,
// every record is still counted, and the victim runs on. A flood of
// fatal-exception lines (only ever logged) is logged once a second.
func TestForgedFaultFloodMakesFewClaimsPerServer(t *testing.T) {
	e := newTrustEnv(t)
	forge := e.buildTestProgram("mpsforge")
	client := filepath.Join(e.emu, "mpsemu-client")
	p := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "5m"), trustVictimUID))
	st := e.waitStatus("the victim's client on a live MPS server", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Instances) == 1 && len(st.Instances[0].ServerPIDs) > 0
	})
	inst := st.Instances[0]
	fifo := filepath.Join(e.dir, "run", "a", inst.GPUUUID, "pipe", "log")

	const records = 3000
	began := time.Now()
	cmd := exec.Command(forge, "-fifo", fifo, "-kind", "server", "-pid", fmt.Sprint(inst.ServerPIDs[0]),
		"-repeat", fmt.Sprint(records), "-msg", "Server is handling a fatal GPU error.")
	if r := run(t, asUID(cmd, trustAttackerUID)); r.code != 0 {
		t.Fatalf("mpsforge as uid %d: exit %d, stderr %q", trustAttackerUID, r.code, r.stderr)
	}
	cmd = exec.Command(forge, "-fifo", fifo, "-kind", "control", "-pid", fmt.Sprint(inst.DaemonPID),
		"-repeat", fmt.Sprint(records), "-msg", "Server encountered a fatal exception. Shutting down")
	if r := run(t, asUID(cmd, trustAttackerUID)); r.code != 0 {
		t.Fatalf("mpsforge as uid %d: exit %d, stderr %q", trustAttackerUID, r.code, r.stderr)
	}
	// Every record is counted once its claim expires unconfirmed, and
	// then the claim is gone (settled, then decided, just after the
	// count).
	claimsLeft := func() int {
		e.d.mu.Lock()
		defer e.d.mu.Unlock()
		left := 0
		for _, in := range e.d.instances {
			left += len(in.claims) + len(in.deciding)
		}
		return left
	}
	deadline := time.Now().Add(waitFor)
	for unverifiedRecords(t, e.d, inst.GPUUUID) < records || claimsLeft() != 0 { // a metric offers nothing to wait on
		if time.Now().After(deadline) {
			t.Fatalf("mpsd_unverified_mps_records_total = %v, want %d; %d claims left", unverifiedRecords(t, e.d, inst.GPUUUID), records, claimsLeft())
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(began)
	if got := unverifiedRecords(t, e.d, inst.GPUUUID); got != records {
		t.Errorf("mpsd_unverified_mps_records_total = %v, want %d", got, records)
	}
	b, err := os.ReadFile(e.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	claims := bytes.Count(b, []byte("MPS fault record waits for an Xid to confirm it"))
	if most := maxClaimsPerServer * (1 + int(took/faultClaimWait)); claims < 1 || claims > most {
		t.Errorf("%d records in %s made %d claims; want 1 to %d (%d per server each %s)", records, took.Round(time.Millisecond), claims, most, maxClaimsPerServer, faultClaimWait)
	}
	// The fatal-exception lines are counted in what the log says.
	fatal, counted := 0, 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(line, "MPS logged a fatal exception") {
			continue
		}
		fatal++
		var n int
		if i := strings.Index(line, " records="); i >= 0 {
			_, _ = fmt.Sscanf(line[i:], " records=%d", &n)
		}
		counted += n
	}
	if most := 1 + int(took/time.Second); fatal < 1 || fatal > most {
		t.Errorf("%d fatal-exception records in %s made %d log lines; want 1 to %d (one a second)", records, took.Round(time.Millisecond), fatal, most)
	}
	if counted < 1 || counted > records {
		t.Errorf("the fatal-exception log lines stand for %d records; want 1 to the %d written", counted, records)
	}
	st = e.d.Status()
	if countLeases(st, api.LeaseRunning) != 1 || st.Leases[0].Attempt != 1 || st.Instances[0].Restarts != 0 {
		t.Errorf("after the flood: leases %+v, instance restarts %d; want the victim's lease running, attempt 1, no restart", st.Leases, st.Instances[0].Restarts)
	}
	if faults := countedFaults(e.d); faults != 0 {
		t.Errorf("%d faults counted for forged records, want 0", faults)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)
}

// A member forges MPS's "Failed to start server" record for another
// member who holds a lease but has no MPS server yet (none is started
// until a lease's first CUDA call): the only moment such a record could
// have been true, and the moment nothing can confirm it. mpsd takes it
// for what it is, a record anyone may write: the victim's lease runs on
// at its first attempt, and nothing is counted against the instance.
func TestForgedStartFailureRevokesNothing(t *testing.T) {
	e := newTrustEnv(t)
	forge := e.buildTestProgram("mpsforge")
	gateArgs, open := e.gate("start-failure")
	p := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", `echo "attempt $MPSD_ATTEMPT"; `+gateArgs[2]), trustVictimUID))
	st := e.waitStatus("the victim's lease running, no MPS server", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Instances) == 1 && st.Instances[0].DaemonPID > 0
	})
	inst := st.Instances[0]
	if len(inst.ServerPIDs) != 0 {
		t.Fatalf("servers %v before any CUDA call", inst.ServerPIDs)
	}
	fifo := filepath.Join(e.dir, "run", "a", inst.GPUUUID, "pipe", "log")
	e.forge(forge, trustAttackerUID, fifo, "control", inst.DaemonPID,
		fmt.Sprintf("Failed to start server using uid %d, error: forged", trustVictimUID))
	e.waitLogAny("nothing confirms a server start failure")
	open()
	r := p.wait(t)
	if r.code != 0 || strings.Contains(r.stdout, "attempt 2") || strings.Contains(r.stderr, "revoked") {
		t.Fatalf("the victim's launch: exit %d, stdout %q, stderr %q; want one attempt, exit 0", r.code, r.stdout, r.stderr)
	}
	if got := e.d.Status().Instances[0]; got.Restarts != 0 || got.State != "ready" {
		t.Errorf("instance after a forged start failure: state %s, %d restarts; want ready, 0", got.State, got.Restarts)
	}
	if faults := countedFaults(e.d); faults != 0 {
		t.Errorf("%d faults counted for a forged start failure, want 0", faults)
	}
}

// A forged fault record naming a tenant's server holds that tenant's
// release for no longer than the record waits for its Xid: the release
// is answered once the record is found false, done (no revocation), and
// nothing is counted against the instance.
func TestForgedRecordOnlyDelaysARelease(t *testing.T) {
	e := newTrustEnv(t)
	forge := e.buildTestProgram("mpsforge")
	helper := e.isoBuildAPICall()
	client := filepath.Join(e.emu, "mpsemu-client")
	gateArgs, open := e.gate("held")
	defer open()
	script := `"$0" --duration 1m & c=$!; ` + gateArgs[2] + `; kill -INT $c; wait $c`
	startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script, client), trustVictimUID))
	st := e.waitStatus("the victim's client on a live MPS server", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Instances) == 1 && len(st.Instances[0].ServerPIDs) > 0
	})
	id := st.Leases[0].ID
	inst := st.Instances[0]
	fifo := filepath.Join(e.dir, "run", "a", inst.GPUUUID, "pipe", "log")

	e.forge(forge, trustAttackerUID, fifo, "server", inst.ServerPIDs[0], "Server is handling a fatal GPU error.")
	e.waitLogLine("MPS fault record waits for an Xid to confirm it")
	code, body, _ := e.isoAPICall(helper, trustVictimUID, api.ReleasePath(id), `{"attempt":1}`, false)
	if code != "" {
		t.Fatalf("the victim's release while a forged record waits: %q %s; want it done", code, body)
	}
	// Answered only once the record's fate was known.
	b, _ := os.ReadFile(e.log.Name())
	if !strings.Contains(string(b), "no Xid on the instance's GPUs within") {
		t.Errorf("the release was answered before the forged record was found false")
	}
	st = e.d.Status()
	if len(st.Leases) != 0 {
		t.Errorf("leases after the release: %+v", st.Leases)
	}
	if got := st.Instances[0]; got.Restarts != 0 || got.State != api.InstanceReady {
		t.Errorf("instance after a forged record: state %s, %d restarts; want ready, 0", got.State, got.Restarts)
	}
	if strings.Contains(string(b), "lease revoked") {
		t.Errorf("a forged record revoked a lease")
	}
}
