package mpsd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/mpsd/mpsd/api"
)

// Attacker and bystander uids of these tests.
const (
	limUIDFlood     = 64150 // opens connections by the dozen
	limUIDBystander = 64151 // a member who just wants a lease
	limUIDHolder    = 64152 // holds a lease through the other's trouble
	limUIDQueuer    = 64154 // queues past its cap
	limUIDOther     = 64155 // still queues
)

// limBuild builds the test program testdata/<name> into the env's
// directory, where test uids can run it.
func (e *testEnv) limBuild(name string) string {
	e.t.Helper()
	out := filepath.Join(e.dir, name)
	if b, err := exec.Command("go", "build", "-o", out, "./testdata/"+name).CombinedOutput(); err != nil {
		e.t.Fatalf("go build ./testdata/%s: %v\n%s", name, err, b)
	}
	return out
}

// limFlood is a running connflood.
type limFlood struct {
	held, refused  int
	status, answer string
	stdin          io.WriteCloser
	p              *proc
}

// limStartFlood runs connflood as uid with args and reads its report; the
// connections it holds stay open until stop.
func limStartFlood(t *testing.T, helper string, uid uint32, args ...string) *limFlood {
	t.Helper()
	cmd := asUID(exec.Command(helper, args...), uid)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	p := startProc(t, cmd)
	_ = pw.Close()
	t.Cleanup(func() { _ = stdin.Close(); _ = pr.Close() })
	lines := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		var got []string
		for len(got) < 3 && sc.Scan() {
			got = append(got, sc.Text())
		}
		lines <- got
	}()
	var got []string
	select {
	case got = <-lines:
	case <-time.After(waitFor):
		t.Fatalf("connflood %v: no report within %s", args, waitFor)
	}
	if len(got) < 3 {
		r := p.wait(t)
		t.Fatalf("connflood %v: report %q; exit %d, stderr %q", args, got, r.code, r.stderr)
	}
	f := &limFlood{status: got[1], answer: got[2], stdin: stdin, p: p}
	if _, err := fmt.Sscanf(got[0], "held %d refused %d", &f.held, &f.refused); err != nil {
		t.Fatalf("connflood report %q: %v", got[0], err)
	}
	return f
}

// stop closes the flood's connections and waits for it.
func (f *limFlood) stop(t *testing.T) {
	t.Helper()
	_ = f.stdin.Close()
	if r := f.p.wait(t); r.code != 0 {
		t.Errorf("connflood: exit %d, stderr %q", r.code, r.stderr)
	}
}

// limMetric is the value of the series of name with labels as mpsd gathers it
// for /metrics (a scrape would need a connection the test may be capping).
func (e *testEnv) limMetric(name string, labels map[string]string) float64 {
	e.t.Helper()
	fams, err := e.d.metricsGatherer().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	m := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	v, ok := value(m, name, labels)
	if !ok {
		e.t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// limSum is the sum of every series of name.
func (e *testEnv) limSum(name string) float64 {
	e.t.Helper()
	fams, err := e.d.metricsGatherer().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// limNoFaults fails the test if any instance restarted or saw a fault, or
// any lease was requeued.
func (e *testEnv) limNoFaults() {
	e.t.Helper()
	for _, in := range e.d.Status().Instances {
		if in.Restarts != 0 || in.State != api.InstanceReady {
			e.t.Errorf("instance %s/%d: state %s, %d restarts; want ready, none", in.Group, in.GPUIndex, in.State, in.Restarts)
		}
	}
	for _, name := range []string{"mpsd_faults_total", "mpsd_server_restarts_total", "mpsd_requeues_total"} {
		if v := e.limSum(name); v != 0 {
			e.t.Errorf("%s = %v, want 0", name, v)
		}
	}
}

// A local user who opens idle connections by the dozen, to the API socket
// and to the metrics port, is capped: those beyond its per-uid cap (and
// the metrics listener's) are answered 503 over_limit naming the config
// key and closed. Meanwhile root gets status, another uid gets a lease
// that runs to exit 0, and nothing restarts or is revoked.
func TestConnectionFloodIsCapped(t *testing.T) {
	e := newEnv(t, `  a:
    users: ["`+strconv.Itoa(limUIDBystander)+`", "`+strconv.Itoa(limUIDFlood)+`"]
    memory: 10G
`, "limits:\n  connections: 64\n  connections_per_user: 8\n  metrics_connections: 4\n")
	// Idle connections live as long as a request may take to arrive: long
	// enough here that the flood's stay open throughout.
	e.opts.RequestTimeout = waitFor
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.opts.MetricsListener = mln
	e.start()
	e.waitStatus("every instance ready", isoAllReady)
	helper := e.limBuild("connflood")

	api1 := limStartFlood(t, helper, limUIDFlood, "-socket", e.socket, "-n", "20")
	if api1.held != 8 || api1.refused != 12 {
		t.Errorf("API flood of 20 by uid %d: %d held, %d refused; want 8 and 12", limUIDFlood, api1.held, api1.refused)
	}
	if !strings.HasPrefix(api1.status, "HTTP/1.1 503") {
		t.Errorf("refused API connection answered %q, want 503", api1.status)
	}
	ae := api.DecodeError(503, strings.NewReader(api1.answer))
	if ae.Code != api.CodeOverLimit || !strings.Contains(ae.Message, "limits.connections_per_user (8)") || !strings.Contains(ae.Message, strconv.Itoa(limUIDFlood)) {
		t.Errorf("refused API connection: code %q message %q; want over_limit naming uid %d and limits.connections_per_user (8)", ae.Code, ae.Message, limUIDFlood)
	}
	met := limStartFlood(t, helper, limUIDFlood, "-tcp", mln.Addr().String(), "-n", "10")
	if met.held != 4 || met.refused != 6 {
		t.Errorf("metrics flood of 10: %d held, %d refused; want 4 and 6", met.held, met.refused)
	}
	if me := api.DecodeError(503, strings.NewReader(met.answer)); me.Code != api.CodeOverLimit || !strings.Contains(me.Message, "limits.metrics_connections (4)") {
		t.Errorf("refused metrics connection: %q %q; want over_limit naming limits.metrics_connections (4)", met.status, met.answer)
	}

	// While the flood holds its connections: root's status, another
	// uid's status and lease.
	r := run(t, exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "status"))
	if r.code != 0 {
		t.Errorf("mpsctl status as root during the flood: exit %d, stderr %q", r.code, r.stderr)
	}
	r = run(t, asUID(exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "status"), limUIDBystander))
	if r.code != 0 {
		t.Errorf("mpsctl status as uid %d during the flood: exit %d, stderr %q", limUIDBystander, r.code, r.stderr)
	}
	r = run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), limUIDBystander))
	if r.code != 0 {
		t.Errorf("lease of uid %d during the flood: exit %d, stderr %q", limUIDBystander, r.code, r.stderr)
	}
	// The flooder itself is told why, in one line, with the temporary
	// exit status.
	r = run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), limUIDFlood))
	if r.code != 75 || !strings.Contains(r.stderr, "limits.connections_per_user") {
		t.Errorf("lease of the flooding uid: exit %d, stderr %q; want 75 naming limits.connections_per_user", r.code, r.stderr)
	}

	if v := e.limMetric("mpsd_connections_refused_total", map[string]string{"listener": "api", "reason": "per_user"}); v < 12 {
		t.Errorf("mpsd_connections_refused_total{api,per_user} = %v, want at least 12", v)
	}
	if v := e.limMetric("mpsd_connections_refused_total", map[string]string{"listener": "metrics", "reason": "total"}); v != 6 {
		t.Errorf("mpsd_connections_refused_total{metrics,total} = %v, want 6", v)
	}
	api1.stop(t)
	met.stop(t)
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
	e.limNoFaults()
	deadline := time.Now().Add(waitFor)
	for e.limMetric("mpsd_connections_open", map[string]string{"listener": "metrics"}) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the metrics listener still counts the flood's connections after they closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := httpGet(t, "http://"+mln.Addr().String()+"/readyz"); code != 200 {
		t.Errorf("/readyz after the flood: %d %s", code, body)
	}
}

// emfileRunner fails every control command with EMFILE while fail is set,
// as starting a process does when mpsd is out of file descriptors.
type emfileRunner struct{ fail atomic.Bool }

func (r *emfileRunner) Start(cmd *exec.Cmd) error {
	if r.fail.Load() {
		return &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: syscall.EMFILE}
	}
	return cmd.Start()
}

// When mpsd's own probes cannot run for lack of file descriptors, that is
// mpsd's failure: it is logged and counted (mpsd_local_resource_errors_total)
// and /readyz fails while it lasts, but no daemon is declared hung, nothing
// restarts and no lease is revoked.
func TestProbeOutOfLocalResourcesIsNotHung(t *testing.T) {
	// Probes often, each with room to answer on a loaded host (with a
	// 40 ms timeout, make test once saw a slow answer declared a hang).
	e := newEnv(t, `  a:
    users: ["`+strconv.Itoa(limUIDHolder)+`"]
    memory: 10G
`, "watchdog:\n  probe_interval: 200ms\n  probe_timeout: 190ms\n  probe_failures: 3\n  backoff_initial: 50ms\n  backoff_max: 1s\n")
	runner := &emfileRunner{}
	e.opts.mpsRunner = runner
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.opts.MetricsListener = mln
	readyz := "http://" + mln.Addr().String() + "/readyz"
	e.start()
	e.waitStatus("every instance ready", isoAllReady)
	gateArgs, open := e.gate("holder")
	p := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateArgs...)...), limUIDHolder))
	st := e.waitStatus("a running lease", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	leaseID := st.Leases[0].ID

	runner.fail.Store(true)
	deadline := time.Now().Add(waitFor)
	// Many times the probes that would declare the daemon hung.
	for e.limMetric("mpsd_local_resource_errors_total", map[string]string{"where": "probe"}) < 20 {
		if time.Now().After(deadline) {
			t.Fatal("no local resource errors counted for the probes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, body := httpGet(t, readyz)
	if code != 503 || !strings.Contains(body, "out of local resources") {
		t.Errorf("/readyz while out of descriptors: %d %q; want 503 saying mpsd is out of local resources", code, body)
	}
	e.isoWaitLog("mpsd is out of local resources")
	runner.fail.Store(false)
	for {
		if code, _ := httpGet(t, readyz); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz did not recover once descriptors were back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st = e.d.Status()
	if len(st.Leases) != 1 || st.Leases[0].ID != leaseID || st.Leases[0].Attempt != 1 || st.Leases[0].State != api.LeaseRunning {
		t.Errorf("leases after the exhaustion: %+v; want %s still running its first attempt", st.Leases, leaseID)
	}
	e.limNoFaults()
	open()
	if r := p.wait(t); r.code != 0 || strings.Contains(r.stderr, "revoked") {
		t.Errorf("the holder's workload: exit %d, stderr %q; want 0, never revoked", r.code, r.stderr)
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A uid with limits.queued_per_user requests queued is refused the next
// one (429 over_limit, mps-launch exit 75 naming the key), while another
// uid still queues.
func TestQueuedPerUserCap(t *testing.T) {
	e := newEnv(t, `  a:
    users: ["`+strconv.Itoa(limUIDHolder)+`", "`+strconv.Itoa(limUIDQueuer)+`", "`+strconv.Itoa(limUIDOther)+`"]
    memory: 10G
    gpus: ["0"]
    max_clients: 1
`, "limits:\n  queued_per_user: 3\n")
	e.start()
	gateArgs, open := e.gate("full")
	holder := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateArgs...)...), limUIDHolder))
	e.waitStatus("the group full", func(st api.Status) bool { return countLeases(st, api.LeaseRunning) == 1 })
	var queued []*proc
	for i := range 3 {
		queued = append(queued, startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), limUIDQueuer)))
		e.waitStatus(fmt.Sprintf("%d queued", i+1), func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == i+1 })
	}
	r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), limUIDQueuer))
	if r.code != 75 || !strings.Contains(r.stderr, "limits.queued_per_user (3)") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("4th queued request of uid %d: exit %d, stderr %q; want 75 and one line naming limits.queued_per_user (3)", limUIDQueuer, r.code, r.stderr)
	}
	if v := e.limMetric("mpsd_lease_requests_over_limit_total", nil); v != 1 {
		t.Errorf("mpsd_lease_requests_over_limit_total = %v, want 1", v)
	}
	other := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), limUIDOther))
	e.waitStatus("the other uid queued", func(st api.Status) bool { return countLeases(st, api.LeaseQueued) == 4 })
	open()
	for _, p := range append(queued, holder, other) {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("%v: exit %d, stderr %q", p.cmd.Args, r.code, r.stderr)
		}
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// GET /v1/status shows a non-admin only its own leases, with counts per
// group and no pids of anyone else's; an admin sees everything.
func TestStatusShowsOthersLeasesOnlyToAdmins(t *testing.T) {
	const owner, sameGroup, otherGroup, nobody, admin = 64156, 64157, 64158, 64159, 64160
	e := newEnv(t, fmt.Sprintf(`  a:
    users: ["%d", "%d"]
    memory: 10G
  b:
    users: ["%d"]
    memory: 10G
`, owner, sameGroup, otherGroup), fmt.Sprintf("admins:\n  users: [root, \"%d\"]\n", admin))
	e.start()
	helper := e.isoBuildAPICall()
	gateArgs, open := e.gate("status")
	p := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "1G", "--job", "secret-job-17", "--"}, gateArgs...)...), owner))
	st := e.waitStatus("a running workload", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	lease := st.Leases[0]
	get := func(uid uint32) (api.Status, string) {
		t.Helper()
		r := run(t, asUID(apiCallCmd(helper, "-socket", e.socket, "-method", "GET", "-path", api.PathStatus), uid))
		code, body, _ := strings.Cut(r.stdout, "\n")
		if r.code != 0 || code != "ok" {
			t.Fatalf("status as uid %d: exit %d, %q %q", uid, r.code, r.stdout, r.stderr)
		}
		var got api.Status
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("status as uid %d: %v", uid, err)
		}
		return got, body
	}
	for _, uid := range []uint32{sameGroup, otherGroup, nobody} {
		got, raw := get(uid)
		if !got.OwnOnly || len(got.Leases) != 0 {
			t.Errorf("status as uid %d: own_only %v, leases %+v; want own_only and none", uid, got.OwnOnly, got.Leases)
		}
		if got.Running["a"] != 1 || got.Running["b"] != 0 || got.Queue["a"] != 0 {
			t.Errorf("status as uid %d: running %v queue %v; want a:1 b:0 running, none queued", uid, got.Running, got.Queue)
		}
		for _, in := range got.Instances {
			if in.DaemonPID != 0 || len(in.ServerPIDs) != 0 {
				t.Errorf("status as uid %d: instance %s/%d shows pids %d %v", uid, in.Group, in.GPUIndex, in.DaemonPID, in.ServerPIDs)
			}
		}
		for _, secret := range []string{strconv.Itoa(owner), "secret-job-17", lease.ID, fmt.Sprintf("[%d", lease.PIDs[0])} {
			if strings.Contains(raw, secret) {
				t.Errorf("status as uid %d discloses %q: %s", uid, secret, raw)
			}
		}
	}
	got, _ := get(owner)
	if !got.OwnOnly || len(got.Leases) != 1 || got.Leases[0].ID != lease.ID || got.Leases[0].JobID != "secret-job-17" || len(got.Leases[0].PIDs) == 0 {
		t.Errorf("status as the owner: %+v; want its lease in full", got)
	}
	got, _ = get(admin)
	if got.OwnOnly || len(got.Leases) != 1 || got.Leases[0].UID != owner || got.Leases[0].JobID != "secret-job-17" {
		t.Errorf("status as admin uid %d: %+v; want every lease in full", admin, got)
	}
	if len(got.Instances) == 0 || got.Instances[0].DaemonPID == 0 {
		t.Errorf("status as admin: instances %+v; want daemon pids", got.Instances)
	}
	// mpsctl status works for a non-admin and says what it leaves out.
	r := run(t, asUID(exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "status"), nobody))
	if r.code != 0 || !strings.Contains(r.stdout, "yours only") || strings.Contains(r.stdout, "secret-job-17") {
		t.Errorf("mpsctl status as uid %d: exit %d\n%s%s", nobody, r.code, r.stdout, r.stderr)
	}
	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// Membership by unix group is judged by the groups the caller had when it
// connected (SO_PEERGROUPS), not by what /proc says at request time: a
// caller that drops the group after connecting is still admitted on that
// connection, which it would not be if mpsd looked at /proc.
func TestMemberByUnixGroupFromSocket(t *testing.T) {
	const gid = 64171
	e := newEnv(t, fmt.Sprintf(`  a:
    unix_groups: ["%d"]
    memory: 10G
`, gid), "")
	e.start()
	e.waitStatus("every instance ready", isoAllReady)
	helper := e.limBuild("connflood")
	cmd := exec.Command(helper, "-socket", e.socket, "-drop-groups", "-lease", `{"group":"a","sm":10,"mem_bytes":1073741824,"no_wait":true}`)
	// Root, whose only claim on group a is the unix group it drops.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{gid}}}
	r := run(t, cmd)
	_, groupsLine, _ := strings.Cut(r.stderr, "after connecting: Groups:")
	if groupsLine, _, _ = strings.Cut(groupsLine, "\n"); !strings.Contains(r.stderr, "after connecting: Groups:") || strings.TrimSpace(groupsLine) != "" {
		t.Fatalf("helper did not drop its groups: %q", r.stderr)
	}
	status, event, _ := strings.Cut(r.stdout, "\n")
	if r.code != 0 || !strings.HasPrefix(status, "HTTP/1.1 200") || !strings.Contains(event, `"granted"`) {
		t.Errorf("lease on a connection made in unix group %d: exit %d, %q; want 200 and granted (stderr %q)", gid, r.code, r.stdout, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// When local users together fill limits.connections, the next user is
// refused naming that key, and root still gets in (it has room of its
// own above the cap), so an operator can always look.
func TestConnectionTotalCapLeavesRootRoom(t *testing.T) {
	const second = 64153
	e := newEnv(t, `  a:
    users: ["`+strconv.Itoa(limUIDBystander)+`"]
    memory: 10G
`, "limits:\n  connections: 10\n  connections_per_user: 8\n")
	e.opts.RequestTimeout = waitFor
	e.start()
	e.waitStatus("every instance ready", isoAllReady)
	helper := e.limBuild("connflood")
	f1 := limStartFlood(t, helper, limUIDFlood, "-socket", e.socket, "-n", "8")
	f2 := limStartFlood(t, helper, second, "-socket", e.socket, "-n", "8")
	if f1.held != 8 || f2.held != 2 || f2.refused != 6 {
		t.Errorf("floods of 8 and 8 under a total of 10: held %d and %d, refused %d of the second; want 8, 2, 6", f1.held, f2.held, f2.refused)
	}
	if ae := api.DecodeError(503, strings.NewReader(f2.answer)); ae.Code != api.CodeOverLimit || !strings.Contains(ae.Message, "limits.connections (10)") {
		t.Errorf("refused by the total cap: %q %q; want over_limit naming limits.connections (10)", f2.status, f2.answer)
	}
	r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), limUIDBystander))
	if r.code != 75 || !strings.Contains(r.stderr, "limits.connections (10)") {
		t.Errorf("lease of a third uid with the total cap full: exit %d, stderr %q; want 75 naming limits.connections", r.code, r.stderr)
	}
	r = run(t, exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "status"))
	if r.code != 0 {
		t.Errorf("mpsctl status as root with the total cap full: exit %d, stderr %q", r.code, r.stderr)
	}
	f1.stop(t)
	f2.stop(t)
	if r := run(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/true"), limUIDBystander)); r.code != 0 {
		t.Errorf("lease once the floods ended: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
	e.limNoFaults()
}

// A lease request whose body is JSON but not an object (null, an array,
// a number, a string) is refused with 400 naming the problem; it is not
// granted as an empty request.
func TestNonObjectLeaseRequestRefused(t *testing.T) {
	const member = 64164
	e := newOwnerEnv(t, member)
	e.start()
	e.waitStatus("every instance ready", isoAllReady)
	helper := e.isoBuildAPICall()
	for _, tc := range []struct{ body, kind string }{{"null", "null"}, {"[]", "an array"}, {"1", "a number"}, {`"x"`, "a string"}} {
		code, body, _ := e.isoAPICall(helper, member, api.PathLeases, tc.body, false)
		if code != api.CodeBadRequest || !strings.Contains(string(body), "must be a JSON object, got "+tc.kind) {
			t.Errorf("lease request %s: %q %s; want bad_request saying it must be a JSON object, got %s", tc.body, code, body, tc.kind)
		}
	}
	if st := e.d.Status(); len(st.Leases) != 0 {
		t.Errorf("leases after the refused requests: %+v", st.Leases)
	}
}

// A quarantine's reason, as a non-admin's status shows it, keeps the
// failures' count and window but not the last failure's reason, which
// names processes: a server's pid, perhaps another tenant's.
func TestOwnViewHidesTheLastFailure(t *testing.T) {
	st := api.Status{Instances: []api.InstanceStatus{{State: api.InstanceQuarantined, DaemonPID: 4100, ServerPIDs: []int{4242},
		QuarantineReason: "5 failures in 10m0s" + lastFailure + "MPS server 4242 of group a on GPU 0 died (killed by SIGKILL)"}}}
	got := ownView(st, 1000).Instances[0]
	if strings.Contains(got.QuarantineReason, "4242") || !strings.HasPrefix(got.QuarantineReason, "5 failures in 10m0s") {
		t.Errorf("non-admin's quarantine reason %q; want the count and window without the server's pid", got.QuarantineReason)
	}
	if got.DaemonPID != 0 || len(got.ServerPIDs) != 0 {
		t.Errorf("non-admin sees daemon %d, servers %v", got.DaemonPID, got.ServerPIDs)
	}
	if st.Instances[0].QuarantineReason == got.QuarantineReason {
		t.Error("the admin's status was changed too")
	}
}
