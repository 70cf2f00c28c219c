package mpsd

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// Test uids of the history's tests: two members of group a.
const (
	histUIDAlice = 64185
	histUIDBob   = 64186
)

func histGroups() string {
	return fmt.Sprintf(`  a:
    users: ["%d", "%d"]
    memory: 10G
    gpus: ["0"]
`, histUIDAlice, histUIDBob)
}

// history is mpsctl history --json as uid, decoded.
func (e *testEnv) history(uid uint32, args ...string) api.History {
	e.t.Helper()
	r := e.mpsctl(uid, append([]string{"history", "--json"}, args...)...)
	if r.code != 0 {
		e.t.Fatalf("mpsctl history as uid %d: exit %d, stderr %q", uid, r.code, r.stderr)
	}
	var h api.History
	if err := json.Unmarshal([]byte(r.stdout), &h); err != nil {
		e.t.Fatalf("mpsctl history --json as uid %d: %v: %s", uid, err, r.stdout)
	}
	return h
}

// Every way two members' leases end is in the history, with its exit
// status where the command ran to its end: Alice's command that fails
// (3) and her gate that succeeds, Bob's that succeeds, and his requests
// whose --wait runs out, and that --no-wait gives up, while Alice's gate
// fills the GPU (withdrawn, never granted, the wait counted). An admin
// sees all five, with how each ended, on GPU 0; Bob sees his own three
// only, and the table.
func TestHistoryRecordsEveryEnd(t *testing.T) {
	emutest.User(t, histUIDAlice)
	emutest.User(t, histUIDBob)
	e := newEnvGPUs(t, 1, histGroups(), "")
	e.start()
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--job", "fails", "--", "/bin/sh", "-c", "exit 3"), histUIDAlice)); r.code != 3 {
		t.Fatalf("alice's failing command: exit %d, stderr %q; want 3", r.code, r.stderr)
	}
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), histUIDBob)); r.code != 0 {
		t.Fatalf("bob's command: exit %d, stderr %q", r.code, r.stderr)
	}
	gateArgs, open := e.gate("alice")
	gate := startProc(t, asUID(e.launch(append([]string{"--sm", "100", "--mem", "1G", "--"}, gateArgs...)...), histUIDAlice))
	e.waitStatus("alice's gate running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	if r := run(t, asUID(e.launch("--sm", "50", "--mem", "1G", "--wait", "300ms", "--", "/bin/true"), histUIDBob)); r.code == 0 {
		t.Fatalf("bob's request while the GPU is full: exit 0; want its wait to run out")
	}
	if r := run(t, asUID(e.launch("--sm", "50", "--mem", "1G", "--no-wait", "--", "/bin/true"), histUIDBob)); r.code == 0 {
		t.Fatalf("bob's --no-wait request while the GPU is full: exit 0; want it refused")
	}
	open()
	if r := gate.wait(t); r.code != 0 {
		t.Fatalf("alice's gate: exit %d, stderr %q", r.code, r.stderr)
	}

	all := e.history(0)
	if len(all.Records) != 5 || all.OwnOnly {
		t.Fatalf("admin's history: %+v; want 5 records, not own only", all)
	}
	type seen struct {
		uid         uint32
		ended       string
		exit        string
		ran         bool
		waitAtLeast int64
	}
	exit := func(r api.HistoryRecord) string {
		if r.ExitStatus == nil {
			return "-"
		}
		return fmt.Sprint(*r.ExitStatus)
	}
	want := []seen{
		{histUIDAlice, api.EndedReleased, "3", true, 0},
		{histUIDBob, api.EndedReleased, "0", true, 0},
		{histUIDBob, api.EndedWithdrawn, "-", false, 300},
		{histUIDBob, api.EndedWithdrawn, "-", false, 0},
		{histUIDAlice, api.EndedReleased, "0", true, 0},
	}
	for i, r := range all.Records {
		got := seen{r.UID, r.Ended, exit(r), r.Granted != nil, 0}
		w := want[i]
		if got.uid != w.uid || got.ended != w.ended || got.exit != w.exit || got.ran != w.ran || r.WaitMillis < w.waitAtLeast {
			t.Errorf("record %d: %+v; want uid %d ended %s exit %s ran %v waited at least %dms", i+1, r, w.uid, w.ended, w.exit, w.ran, w.waitAtLeast)
		}
		if w.ran && (len(r.GPUIndexes) != 1 || r.GPUIndexes[0] != 0 || r.Attempts != 1) {
			t.Errorf("record %d: gpus %v attempts %d; want GPU 0, attempt 1", i+1, r.GPUIndexes, r.Attempts)
		}
		if r.Group != "a" || r.End.Before(r.Start) || r.Procs != 1 || r.MemBytes != 1<<30 {
			t.Errorf("record %d: %+v; want group a, mem 1G, 1 proc, an end after its start", i+1, r)
		}
	}
	if all.Records[0].JobID != "fails" || all.Records[2].Reason != "wait ran out" || all.Records[3].Reason != "no room and --no-wait" {
		t.Errorf("records: job %q, withdrawn's reasons %q, %q; want the job and why", all.Records[0].JobID, all.Records[2].Reason, all.Records[3].Reason)
	}

	own := e.history(histUIDBob)
	if len(own.Records) != 3 || !own.OwnOnly {
		t.Errorf("bob's history: %+v; want his own three records only", own)
	}
	for _, r := range own.Records {
		if r.UID != histUIDBob {
			t.Errorf("bob's history holds %+v", r)
		}
	}
	if other := e.history(histUIDBob, "--user", fmt.Sprint(histUIDAlice)); len(other.Records) != 0 {
		t.Errorf("bob asking for alice's history: %+v; want none", other.Records)
	}
	if mine := e.history(0, "--user", fmt.Sprint(histUIDAlice), "--since", "1h"); len(mine.Records) != 2 {
		t.Errorf("admin's history of alice in the last hour: %d records; want 2", len(mine.Records))
	}
	tbl := e.mpsctl(histUIDBob, "history")
	if tbl.code != 0 || !strings.Contains(tbl.stdout, "withdrawn") || !strings.Contains(tbl.stdout, "your leases only") {
		t.Errorf("bob's mpsctl history: exit %d, %q; want his table", tbl.code, tbl.stdout)
	}
}

// A member's flood of tiny jobs cannot push the other's history out, nor
// stop her own from being recorded: on a history bounded at 4,000 bytes
// (a share of 1,000 each, two or three records), Alice's six jobs leave
// her newest within her share, her oldest removed and counted
// (mpsd_history_records_dropped_total{reason="user_share"}) with one log
// line; Bob's job after them is recorded, and so is her seventh.
func TestHistoryUserShareE2E(t *testing.T) {
	emutest.User(t, histUIDAlice)
	emutest.User(t, histUIDBob)
	e := newEnvGPUs(t, 1, histGroups(), "")
	e.opts.historyMaxBytes = 4000
	e.start()
	for i := range 6 {
		if r := run(t, asUID(e.launch("--sm", "1", "--mem", "1M", "--", "/bin/true"), histUIDAlice)); r.code != 0 {
			t.Fatalf("alice's job %d: exit %d, stderr %q", i+1, r.code, r.stderr)
		}
	}
	if r := run(t, asUID(e.launch("--sm", "1", "--mem", "1M", "--", "/bin/true"), histUIDBob)); r.code != 0 {
		t.Fatalf("bob's job: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := run(t, asUID(e.launch("--sm", "1", "--mem", "1M", "--", "/bin/true"), histUIDAlice)); r.code != 0 {
		t.Fatalf("alice's job 7: exit %d, stderr %q", r.code, r.stderr)
	}
	h := e.history(0)
	per := map[uint32]int{}
	for _, r := range h.Records {
		per[r.UID]++
	}
	kept := per[histUIDAlice]
	if kept < 1 || kept > 3 || per[histUIDBob] != 1 {
		t.Errorf("records per uid: %v; want what fits alice's share (1,000 bytes) and bob's 1", per)
	}
	if n := len(h.Records); n == 0 || h.Records[n-1].UID != histUIDAlice {
		t.Errorf("records %v; want alice's seventh job, after bob's, the newest", recordIDs(h.Records))
	}
	b, err := os.ReadFile(filepath.Join(e.dir, "state", historyLive))
	if err != nil {
		t.Fatal(err)
	}
	aliceBytes := 0
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if strings.Contains(line, fmt.Sprintf(`"uid":%d,`, histUIDAlice)) {
			aliceBytes += len(line)
		}
	}
	if aliceBytes > 1000 {
		t.Errorf("alice's records take %d bytes of the file in %d records; want at most her share of 1,000", aliceBytes, kept)
	}
	fams, err := e.d.metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	dropped := -1.0
	for _, f := range fams {
		if f.GetName() != "mpsd_history_records_dropped_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == historyDropShare {
				dropped = m.GetCounter().GetValue()
			}
		}
	}
	if dropped != float64(7-kept) {
		t.Errorf("mpsd_history_records_dropped_total{reason=%q} %v; want %d", historyDropShare, dropped, 7-kept)
	}
	b, err = os.ReadFile(filepath.Join(e.dir, "mpsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "take its share"); n != 1 {
		t.Errorf("%d log lines of alice's records over her share; want 1", n)
	}
}

// A launcher killed while its command runs: mpsd releases the lease (its
// processes killed) and records it launcher_gone, without an exit status
// (none was told); Bob's job before it is released with his.
func TestHistoryLauncherGone(t *testing.T) {
	emutest.User(t, histUIDAlice)
	emutest.User(t, histUIDBob)
	e := newEnvGPUs(t, 1, histGroups(), "")
	e.start()
	// Bob's first: MPS serves one uid at a time on a daemon without
	// multiuser, and Alice's lease would hold the GPU's server.
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--job", "beside", "--", "/bin/true"), histUIDBob)); r.code != 0 {
		t.Fatalf("bob's job: exit %d, stderr %q", r.code, r.stderr)
	}
	gateArgs, _ := e.gate("alice")
	alice := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "1G", "--job", "killed", "--"}, gateArgs...)...), histUIDAlice))
	e.waitStatus("alice's lease running", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	if err := alice.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	alice.wait(t)
	e.waitStatus("alice's lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
	h := e.history(0)
	got := map[string]api.HistoryRecord{}
	for _, r := range h.Records {
		got[r.JobID] = r
	}
	if r := got["killed"]; len(h.Records) != 2 || r.Ended != api.EndedLauncherGone || r.ExitStatus != nil || r.Reason != "launcher disconnected" {
		t.Errorf("alice's killed launcher: %+v; want launcher_gone, no exit status", r)
	}
	if r := got["beside"]; r.Ended != api.EndedReleased || r.ExitStatus == nil || *r.ExitStatus != 0 {
		t.Errorf("bob's job: %+v; want released, exit 0", r)
	}
}

// A lease cancelled with a grace whose launcher is killed during it is
// recorded cancelled, as the cancel ended it, not launcher_gone; Bob's
// job before it is released.
func TestHistoryCancelledLauncherGone(t *testing.T) {
	emutest.User(t, histUIDAlice)
	emutest.User(t, histUIDBob)
	e := newEnvGPUs(t, 1, histGroups(), "")
	e.start()
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--job", "beside", "--", "/bin/true"), histUIDBob)); r.code != 0 {
		t.Fatalf("bob's job: exit %d, stderr %q", r.code, r.stderr)
	}
	alice := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--job", "cancelled", "--", "/bin/sh", "-c",
		`trap '' TERM; while :; do sleep 0.05; done`), histUIDAlice))
	st := e.waitStatus("alice's lease running with its command", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	id := st.Leases[0].ID
	cancel := startProc(t, exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "cancel", "--signal", "TERM", "--grace", "3s", id))
	e.waitStatus("alice's lease revoked by the cancel", func(api.Status) bool {
		e.d.mu.Lock()
		defer e.d.mu.Unlock()
		l := e.d.leases[id]
		return l != nil && l.endWith != nil && l.state == leaseRevoking
	})
	if err := alice.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	alice.wait(t)
	e.waitStatus("alice's launcher seen gone during the grace", func(api.Status) bool {
		e.d.mu.Lock()
		defer e.d.mu.Unlock()
		l := e.d.leases[id]
		return l != nil && l.abandoned
	})
	if r := cancel.wait(t); r.code != 0 {
		t.Errorf("mpsctl cancel: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("alice's lease ended", func(st api.Status) bool { return len(st.Leases) == 0 })
	got := map[string]api.HistoryRecord{}
	for _, r := range e.history(0).Records {
		got[r.JobID] = r
	}
	if r := got["cancelled"]; r.Ended != api.EndedCancelled || !strings.Contains(r.Reason, "cancelled by") {
		t.Errorf("alice's cancelled lease whose launcher left: %+v; want cancelled, naming who", r)
	}
	if r := got["beside"]; r.Ended != api.EndedReleased {
		t.Errorf("bob's job: %+v; want released", r)
	}
}

// Leases whose place left the config while mpsd was down end at its
// start, and are recorded: Alice's running lease, its instance gone,
// revoked; Bob's queued request, its group gone, group_removed.
func TestHistoryRestartEndsGoneLeases(t *testing.T) {
	emutest.User(t, histUIDAlice)
	emutest.User(t, histUIDBob)
	groups := histGroups() + fmt.Sprintf(`  b:
    users: ["%d", "%d"]
    memory: 10G
    gpus: ["0"]
`, histUIDAlice, histUIDBob)
	e := newEnvGPUs(t, 1, groups, "")
	e.start()
	work, _ := e.gate("never")
	alice := startProc(t, asUID(e.launch(append([]string{"--group", "a", "--mem", "8G", "--job", "running", "--"}, work...)...), histUIDAlice))
	e.waitStatus("alice's lease running with its command", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	bob := startProc(t, asUID(e.launch("--group", "a", "--mem", "8G", "--job", "queued", "--", "/bin/true"), histUIDBob))
	e.waitStatus("bob's request queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 1 })
	e.stop()
	e.writeConfig(fmt.Sprintf(`  b:
    users: ["%d", "%d"]
    memory: 10G
    gpus: ["0"]
`, histUIDAlice, histUIDBob), "")
	e.start()
	e.waitStatus("both leases ended", func(st api.Status) bool { return len(st.Leases) == 0 })
	alice.wait(t)
	bob.wait(t)
	got := map[string]api.HistoryRecord{}
	for _, r := range e.history(0).Records {
		got[r.JobID] = r
	}
	if r := got["running"]; r.Ended != api.EndedRevoked || !strings.Contains(r.Reason, "instance") || r.Granted == nil {
		t.Errorf("alice's running lease whose instance left the config: %+v; want revoked, saying why", r)
	}
	if r := got["queued"]; r.Ended != api.EndedGroupRemoved || !strings.Contains(r.Reason, "group") || r.Granted != nil {
		t.Errorf("bob's queued request whose group left the config: %+v; want group_removed, never granted", r)
	}
}

// A history file that cannot be opened (a symlink, which mpsd never
// follows) does not stop mpsd: it starts, logs it, serves Alice's job
// unrecorded (mpsd_history_writable 0, the record counted write_failed),
// and once the file can be opened Bob's job is recorded (writable 1).
func TestHistoryUnopenableAtStart(t *testing.T) {
	emutest.User(t, histUIDAlice)
	emutest.User(t, histUIDBob)
	e := newEnvGPUs(t, 1, histGroups(), "")
	state := filepath.Join(e.dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(state, historyLive)
	if err := os.Symlink(filepath.Join(e.dir, "elsewhere"), live); err != nil {
		t.Fatal(err)
	}
	e.start()
	gauge := func(name, reason string) float64 {
		t.Helper()
		fams, err := e.d.metrics.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				if reason == "" || m.GetLabel()[0].GetValue() == reason {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}
	if r := run(t, asUID(e.launch("--sm", "1", "--mem", "1M", "--job", "unrecorded", "--", "/bin/true"), histUIDAlice)); r.code != 0 {
		t.Fatalf("alice's job: exit %d, stderr %q", r.code, r.stderr)
	}
	if w, d := gauge("mpsd_history_writable", ""), gauge("mpsd_history_records_dropped_total", historyDropWrite); w != 0 || d != 1 {
		t.Errorf("mpsd_history_writable %v, dropped write_failed %v; want 0 and 1", w, d)
	}
	if b, err := os.ReadFile(filepath.Join(e.dir, "mpsd.log")); err != nil || !strings.Contains(string(b), "history file cannot be opened") {
		t.Errorf("mpsd.log (%v) does not say the history cannot be opened", err)
	}
	if err := os.Remove(live); err != nil {
		t.Fatal(err)
	}
	if r := run(t, asUID(e.launch("--sm", "1", "--mem", "1M", "--job", "recorded", "--", "/bin/true"), histUIDBob)); r.code != 0 {
		t.Fatalf("bob's job: exit %d, stderr %q", r.code, r.stderr)
	}
	h := e.history(0)
	if len(h.Records) != 1 || h.Records[0].JobID != "recorded" || gauge("mpsd_history_writable", "") != 1 {
		t.Errorf("history once the file can be opened: %+v, writable %v; want bob's job only, 1", h.Records, gauge("mpsd_history_writable", ""))
	}
}
