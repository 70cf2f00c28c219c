package mpsctl

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/buildinfo"
)

func TestStatus(t *testing.T) {
	empty := api.Status{Instances: []api.InstanceStatus{}, Leases: []api.LeaseStatus{}, Queue: map[string]int{}}
	for _, tc := range []struct {
		name   string
		st     reply
		args   []string
		golden string
	}{
		{"table", ok(t, statusFixture()), []string{"status"}, "status.golden"},
		{"json", withUnknownField(t, ok(t, statusFixture())), []string{"status", "--json"}, "status.json.golden"},
		{"non-admin view", ok(t, ownViewFixture()), []string{"status"}, "status-own.golden"},
		{"empty table", ok(t, empty), []string{"status"}, "status-empty.golden"},
		{"empty json", ok(t, empty), []string{"status", "--json"}, "status-empty.json.golden"},
		{"null lists", reply{status: 200, body: `{"instances":null,"leases":null,"queue":null}`}, []string{"status"}, "status-empty.golden"},
		{"wide", ok(t, statusFixture()), []string{"status", "-o", "wide"}, "status-wide.golden"},
		{"json by -o", withUnknownField(t, ok(t, statusFixture())), []string{"status", "-o", "json"}, "status.json.golden"},
		{"group", ok(t, statusFixture()), []string{"status", "--group", "inference"}, "status-group.golden"},
		{"gpu by uuid prefix", ok(t, statusFixture()), []string{"status", "--gpu", "GPU-cccc"}, "status-gpu.golden"},
		{"user by name, wide", ok(t, statusFixture()), []string{"status", "--user", "alice", "-o", "wide"}, "status-user.golden"},
		{"user by uid", ok(t, statusFixture()), []string{"status", "--user", "1001", "-o", "wide"}, "status-user.golden"},
		{"instance state", ok(t, statusFixture()), []string{"status", "--state", "ready"}, "status-state-ready.golden"},
		{"running, rows only", ok(t, statusFixture()), []string{"status", "--state", "running", "--no-headers"}, "status-running-rows.golden"},
		{"rows only", ok(t, statusFixture()), []string{"status", "--no-headers"}, "status-rows.golden"},
		{"non-admin view of a group", ok(t, ownViewFixture()), []string{"status", "--group", "batch"}, "status-own-group.golden"},
		{"json of a group on a gpu", withUnknownField(t, ok(t, statusFixture())), []string{"status", "--json", "--group", "inference", "--gpu", "0"}, "status-filtered.json.golden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"GET " + api.PathStatus: tc.st})
			// uid 1002 has no name: status shows the number.
			names := map[uint32]string{0: "root", 1001: "alice", 1003: "bob"}
			cfg := Config{LookupUser: func(uid uint32) string { return names[uid] }, LookupUID: func(name string) (uint32, bool) {
				for uid, n := range names {
					if n == name {
						return uid, true
					}
				}
				return 0, false
			}}
			r := mpsctl(t, cfg, nil, append([]string{"--socket", fake.socket}, tc.args...)...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
			}
			golden(t, tc.golden, r.stdout)
			reqs := fake.requests()
			if len(reqs) != 1 || reqs[0].method != http.MethodGet || reqs[0].body != "" {
				t.Errorf("requests = %+v; want one GET without body", reqs)
			}
		})
	}
}

// The JSON mpsctl prints is the document mpsd sent: it decodes to the same
// Status, and keeps the fields this version does not know.
func TestStatusJSONKeepsDocument(t *testing.T) {
	fake := newFake(t, map[string]reply{"GET " + api.PathStatus: withUnknownField(t, ok(t, statusFixture()))})
	r := mpsctl(t, Config{}, nil, "--socket", fake.socket, "status", "--json")
	if r.code != ExitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var got api.Status
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	want := statusFixture()
	wantJSON, _ := json.Marshal(want)
	gotJSON, _ := json.Marshal(got)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("status --json decodes to\n%s\nwant\n%s", gotJSON, wantJSON)
	}
	if !strings.Contains(r.stdout, `"future_field"`) {
		t.Errorf("status --json dropped an unknown field:\n%s", r.stdout)
	}
}

func TestSocketChoice(t *testing.T) {
	st := ok(t, statusFixture())
	good := newFake(t, map[string]reply{"GET " + api.PathStatus: st})
	missing := filepath.Join(t.TempDir(), "missing.sock")
	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
		// want is the socket that must be used; "" means good's.
		want string
	}{
		{"global flag", nil, []string{"--socket", good.socket, "status"}, ""},
		{"global flag with =", nil, []string{"--socket=" + good.socket, "status"}, ""},
		{"flag after command", nil, []string{"status", "--socket", good.socket}, ""},
		{"flag after command wins", nil, []string{"--socket", missing, "status", "--socket", good.socket}, ""},
		{"environment", []string{api.EnvSocket + "=" + good.socket}, []string{"status"}, ""},
		{"flag beats environment", []string{api.EnvSocket + "=" + missing}, []string{"--socket", good.socket, "status"}, ""},
		{"empty environment is unset", []string{api.EnvSocket + "="}, []string{"status"}, api.DefaultSocket},
		{"environment names the missing one", []string{api.EnvSocket + "=" + missing}, []string{"status"}, missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == api.DefaultSocket {
				if _, err := os.Stat(api.DefaultSocket); err == nil {
					t.Skipf("%s exists on this host", api.DefaultSocket)
				}
			}
			r := mpsctl(t, Config{}, tc.environ, tc.args...)
			if tc.want == "" {
				if r.code != ExitOK {
					t.Fatalf("exit %d: %s", r.code, r.stderr)
				}
				return
			}
			want := "mpsctl: cannot reach mpsd at " + tc.want + ": "
			if r.code != ExitFailure || !strings.HasPrefix(r.stderr, want) {
				t.Errorf("exit %d, stderr %q; want 1 and %q...", r.code, r.stderr, want)
			}
		})
	}
}

func TestAdmin(t *testing.T) {
	changed := api.AdminResult{Instances: []api.InstanceStatus{
		{GPUUUID: "GPU-bbbbbbbb-1111-2222-3333-444444444444", GPUIndex: 1, Group: "inference", State: api.InstanceDraining},
		{GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "inference", State: api.InstanceDraining},
		{GPUUUID: "GPU-cccccccc-1111-2222-3333-444444444444", GPUIndex: 2, Group: "batch", State: api.InstanceDraining,
			GPUIndexes: []int{2, 3}, GPUUUIDs: []string{"GPU-cccccccc-1111-2222-3333-444444444444", "GPU-dddddddd-1111-2222-3333-444444444444"}},
	}}
	resumed := api.AdminResult{Instances: []api.InstanceStatus{
		{GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "batch", State: api.InstanceReady},
	}}
	replies := map[string]reply{
		"POST " + api.PathDrain:  ok(t, changed),
		"POST " + api.PathResume: ok(t, resumed),
	}
	for _, tc := range []struct {
		name     string
		args     []string
		path     string
		body     api.AdminTarget
		stdout   string
		override map[string]reply
	}{
		{
			name: "drain gpu", args: []string{"drain", "--gpu", "0", "--reason", " fan replacement "}, path: api.PathDrain,
			body: api.AdminTarget{GPU: "0", Reason: "fan replacement"},
			stdout: "drained gpu 0 (GPU-aaaaaaaa…) group inference: state draining\n" +
				"drained gpu 1 (GPU-bbbbbbbb…) group inference: state draining\n" +
				"drained gpu 2,3 (GPU-cccccccc…,GPU-dddddddd…) group batch: state draining\n",
		},
		{
			name: "drain, some drained already", args: []string{"drain", "--group", "inference", "--reason", "reset"}, path: api.PathDrain,
			body: api.AdminTarget{Group: "inference", Reason: "reset"},
			stdout: "drained gpu 0 (GPU-aaaaaaaa…) group inference: state draining\n" +
				"gpu 1 (GPU-bbbbbbbb…) group inference: drained already by alice at 2026-12-07T09:30:00Z: fan replacement; state drained\n",
			override: map[string]reply{"POST " + api.PathDrain: ok(t, api.AdminResult{
				Instances: []api.InstanceStatus{
					{GPUUUID: "GPU-bbbbbbbb-1111-2222-3333-444444444444", GPUIndex: 1, Group: "inference", State: api.InstanceDrained,
						Drained: true, DrainReason: "fan replacement", DrainedBy: "alice", DrainedAt: time.Date(2026, 12, 7, 9, 30, 0, 0, time.UTC)},
					{GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "inference", State: api.InstanceDraining, Drained: true},
				},
				Already: []bool{true, false},
			})},
		},
		{
			name: "resume group on gpu", args: []string{"resume", "--group=batch", "--gpu", "GPU-aaaa"}, path: api.PathResume,
			body:   api.AdminTarget{GPU: "GPU-aaaa", Group: "batch"},
			stdout: "resumed gpu 0 (GPU-aaaaaaaa…) group batch: state ready\n",
		},
		{
			name: "nothing changed", args: []string{"resume", "--group", "idle"}, path: api.PathResume, body: api.AdminTarget{Group: "idle"},
			stdout:   "no instance resumed\n",
			override: map[string]reply{"POST " + api.PathResume: ok(t, api.AdminResult{})},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := replies
			if tc.override != nil {
				rs = tc.override
			}
			fake := newFake(t, rs)
			r := mpsctl(t, Config{}, []string{api.EnvSocket + "=" + fake.socket}, tc.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
			}
			if r.stdout != tc.stdout {
				t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, tc.stdout)
			}
			reqs := fake.requests()
			if len(reqs) != 1 {
				t.Fatalf("requests = %+v; want one", reqs)
			}
			q := reqs[0]
			if q.method != http.MethodPost || q.path != tc.path || q.contentType != api.ContentTypeJSON {
				t.Errorf("request %s %s (%s); want POST %s (%s)", q.method, q.path, q.contentType, tc.path, api.ContentTypeJSON)
			}
			// mpsd decodes the body strictly; so does this test.
			got, err := api.DecodeAdminTarget(strings.NewReader(q.body))
			if err != nil || got != tc.body {
				t.Errorf("body %s decodes to %+v, %v; want %+v", q.body, got, err, tc.body)
			}
		})
	}
}

// Refusals and failures of mpsd are one line, "mpsctl: <message>", exit 1.
func TestDaemonErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rep    reply
		args   []string
		stderr string
	}{
		{
			"forbidden", fail(t, http.StatusForbidden, api.CodeForbidden, "uid 1001 is not an mpsd admin"),
			[]string{"drain", "--gpu", "0"}, "mpsctl: uid 1001 is not an mpsd admin\n",
		},
		{
			"not found", fail(t, http.StatusNotFound, api.CodeNotFound, "no instance on gpu 9"),
			[]string{"resume", "--gpu", "9"}, "mpsctl: no instance on gpu 9\n",
		},
		{
			"multi-line message stays one line", fail(t, http.StatusInternalServerError, api.CodeInternal, "state\nwrite failed"),
			[]string{"drain", "--group", "x"}, "mpsctl: state write failed\n",
		},
		{
			"restart forbidden", fail(t, http.StatusForbidden, api.CodeForbidden, "uid 1001 is not an mpsd admin"),
			[]string{"restart", "--group", "inference"}, "mpsctl: uid 1001 is not an mpsd admin\n",
		},
		{
			"restart of no instance", fail(t, http.StatusNotFound, api.CodeNotFound, "no instance of group ghost"),
			[]string{"restart", "--group", "ghost"}, "mpsctl: no instance of group ghost\n",
		},
		{
			"requeue of no lease", fail(t, http.StatusNotFound, api.CodeNotFound, `no lease "i-0042"`),
			[]string{"requeue", "i-0042"}, "mpsctl: no lease \"i-0042\"\n",
		},
		{
			"requeue of a queued lease", fail(t, http.StatusConflict, api.CodeConflict, "lease i-0042 is not running"),
			[]string{"requeue", "i-0042"}, "mpsctl: lease i-0042 is not running\n",
		},
		{
			"requeue forbidden", fail(t, http.StatusForbidden, api.CodeForbidden, "uid 1001 is not an mpsd admin"),
			[]string{"requeue", "i-0042"}, "mpsctl: uid 1001 is not an mpsd admin\n",
		},
		{
			"inject-xid on real GPUs", fail(t, http.StatusConflict, api.CodeConflict, "inject-xid needs mpsd --simulate"),
			[]string{"inject-xid", "0", "79"}, "mpsctl: inject-xid needs mpsd --simulate\n",
		},
		{
			"inject-xid forbidden", fail(t, http.StatusForbidden, api.CodeForbidden, "uid 1001 is not an mpsd admin"),
			[]string{"inject-xid", "0", "79", "--pid", "12"}, "mpsctl: uid 1001 is not an mpsd admin\n",
		},
		{
			"inject-xid on a GPU mpsd does not have", fail(t, http.StatusBadRequest, api.CodeBadRequest, "no gpu 9"),
			[]string{"inject-xid", "9", "79"}, "mpsctl: no gpu 9\n",
		},
		{
			"not an error document", reply{status: http.StatusBadGateway, body: "<html>bad gateway</html>", contentType: "text/html"},
			[]string{"status"}, "",
		},
		{
			"2xx but not a status", reply{status: http.StatusOK, body: "[1,2"},
			[]string{"status"}, "",
		},
		{
			"2xx but not json for --json", reply{status: http.StatusOK, body: "nope"},
			[]string{"status", "--json"}, "",
		},
		{
			"2xx but not an admin result", reply{status: http.StatusOK, body: `{"instances":7}`},
			[]string{"restart", "--gpu", "0"}, "",
		},
		{
			"2xx but not an admin result for requeue", reply{status: http.StatusOK, body: `[]`},
			[]string{"requeue", "a"}, "",
		},
		{
			"2xx but no object for inject-xid", reply{status: http.StatusOK, body: ""},
			[]string{"inject-xid", "0", "79"}, "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := api.PathStatus
			method := "GET "
			switch tc.args[0] {
			case "drain":
				method, path = "POST ", api.PathDrain
			case "resume":
				method, path = "POST ", api.PathResume
			case "restart":
				method, path = "POST ", api.PathRestart
			case "requeue":
				method, path = "POST ", api.PathRequeue
			case "inject-xid":
				method, path = "POST ", api.PathInjectXid
			}
			fake := newFake(t, map[string]reply{method + path: tc.rep})
			r := mpsctl(t, Config{}, nil, append([]string{"--socket", fake.socket}, tc.args...)...)
			if r.code != ExitFailure || r.stdout != "" {
				t.Errorf("exit %d, stdout %q; want 1 and nothing", r.code, r.stdout)
			}
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "mpsctl: ") {
				t.Errorf("stderr %q; want one line starting mpsctl: ", r.stderr)
			}
			if tc.stderr != "" && r.stderr != tc.stderr {
				t.Errorf("stderr %q; want %q", r.stderr, tc.stderr)
			}
			if tc.rep.status == http.StatusBadGateway && !strings.Contains(r.stderr, "502") {
				t.Errorf("stderr %q does not name the HTTP status", r.stderr)
			}
			if tc.rep.status == http.StatusOK && !strings.Contains(r.stderr, "bad answer from mpsd at "+fake.socket) {
				t.Errorf("stderr %q does not say the answer was bad", r.stderr)
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.sock")
	// A socket file nobody listens on any more: connection refused.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	for _, tc := range []struct {
		socket, reason string
		args           []string
	}{
		{missing, "no such file or directory", []string{"status"}},
		{missing, "no such file or directory", []string{"drain", "--gpu", "0"}},
		{stale, "connection refused", []string{"resume", "--group", "g"}},
		{stale, "connection refused", []string{"restart", "--gpu", "1"}},
		{missing, "no such file or directory", []string{"requeue", "i-1"}},
		{missing, "no such file or directory", []string{"inject-xid", "0", "79"}},
	} {
		r := mpsctl(t, Config{}, nil, append([]string{"--socket", tc.socket}, tc.args...)...)
		want := "mpsctl: cannot reach mpsd at " + tc.socket + ": " + tc.reason + "; is it running?\n"
		if r.code != ExitFailure || r.stderr != want || r.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 1, nothing, %q", tc.args, r.code, r.stdout, r.stderr, want)
		}
	}
}

// A daemon that accepts and never answers is a failure after Timeout,
// naming the socket, not a hang.
func TestTimeout(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
	r := mpsctl(t, Config{Timeout: 100 * time.Millisecond}, nil, "--socket", socket, "status")
	want := "mpsctl: GET " + api.PathStatus + " via " + socket + ": no answer within 100ms\n"
	if r.code != ExitFailure || r.stderr != want {
		t.Errorf("exit %d, stderr %q; want 1 and %q", r.code, r.stderr, want)
	}
	ln.Close()
	<-done
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		// line is the first line on stderr.
		line string
		// cmd is the command whose usage follows; "" for the global one.
		cmd string
	}{
		{nil, "mpsctl: no command given", ""},
		{[]string{"--socket", "/x"}, "mpsctl: no command given", ""},
		{[]string{"frob"}, `mpsctl: unknown command "frob"`, ""},
		{[]string{"--frob", "status"}, "mpsctl: unknown flag --frob", ""},
		{[]string{"--socket"}, "mpsctl: flag --socket needs an argument", ""},
		{[]string{"--socket=", "status"}, `mpsctl: invalid value "" for flag --socket: empty path`, ""},
		{[]string{"status", "extra"}, `mpsctl: status: unexpected argument "extra"`, "status"},
		{[]string{"status", "--frob"}, "mpsctl: status: unknown flag --frob", "status"},
		{[]string{"status", "--json=maybe"}, `mpsctl: status: invalid boolean value "maybe" for --json: parse error`, "status"},
		{[]string{"drain"}, "mpsctl: drain: name --gpu, --group or both", "drain"},
		{[]string{"drain", "--gpu"}, "mpsctl: drain: flag --gpu needs an argument", "drain"},
		{[]string{"drain", "--gpu", ""}, "mpsctl: drain: name --gpu, --group or both", "drain"},
		{[]string{"drain", "--gpu", strings.Repeat("9", 129)}, "mpsctl: drain: gpu or group longer than 128 bytes", "drain"},
		{[]string{"resume", "--group", "g", "now"}, `mpsctl: resume: unexpected argument "now"`, "resume"},
		{[]string{"restart"}, "mpsctl: restart: name --gpu, --group or both", "restart"},
		{[]string{"restart", "--group"}, "mpsctl: restart: flag --group needs an argument", "restart"},
		{[]string{"restart", "--group", strings.Repeat("g", 129)}, "mpsctl: restart: gpu or group longer than 128 bytes", "restart"},
		{[]string{"restart", "--gpu", "0", "all"}, `mpsctl: restart: unexpected argument "all"`, "restart"},
		{[]string{"restart", "--pid", "1"}, "mpsctl: restart: unknown flag --pid", "restart"},
		{[]string{"requeue"}, "mpsctl: requeue: missing LEASE", "requeue"},
		{[]string{"requeue", "a", "b"}, `mpsctl: requeue: unexpected argument "b"`, "requeue"},
		{[]string{"requeue", ""}, `mpsctl: requeue: lease id "": want 1 to 128 characters`, "requeue"},
		{[]string{"requeue", "a b"}, `mpsctl: requeue: lease id "a b": only letters, digits, '.', '_' and '-'`, "requeue"},
		{[]string{"requeue", "../x"}, `mpsctl: requeue: lease id "../x" starts with '.'`, "requeue"},
		{[]string{"requeue", "x/y"}, `mpsctl: requeue: lease id "x/y": only letters, digits, '.', '_' and '-'`, "requeue"},
		{[]string{"requeue", strings.Repeat("a", 129)}, `mpsctl: requeue: lease id "` + strings.Repeat("a", 129) + `": want 1 to 128 characters`, "requeue"},
		{[]string{"requeue", "-x1"}, "mpsctl: requeue: unknown flag --x1", "requeue"},
		{[]string{"requeue", "--gpu", "0", "a"}, "mpsctl: requeue: unknown flag --gpu", "requeue"},
		{[]string{"inject-xid"}, "mpsctl: inject-xid: missing GPU and XID", "inject-xid"},
		{[]string{"inject-xid", "0"}, "mpsctl: inject-xid: missing XID", "inject-xid"},
		{[]string{"inject-xid", "0", "79", "13"}, `mpsctl: inject-xid: unexpected argument "13"`, "inject-xid"},
		{[]string{"inject-xid", "gpu0", "79"}, `mpsctl: inject-xid: GPU "gpu0" is not a GPU index (0-1023)`, "inject-xid"},
		{[]string{"inject-xid", "GPU-aaaa", "79"}, `mpsctl: inject-xid: GPU "GPU-aaaa" is not a GPU index (0-1023)`, "inject-xid"},
		{[]string{"inject-xid", "1024", "79"}, `mpsctl: inject-xid: GPU "1024" is not a GPU index (0-1023)`, "inject-xid"},
		{[]string{"inject-xid", "+1", "79"}, `mpsctl: inject-xid: GPU "+1" is not a GPU index (0-1023)`, "inject-xid"},
		{[]string{"inject-xid", "--", "-1", "79"}, `mpsctl: inject-xid: GPU "-1" is not a GPU index (0-1023)`, "inject-xid"},
		{[]string{"inject-xid", "99999999999999999999", "79"}, `mpsctl: inject-xid: GPU "99999999999999999999" is not a GPU index (0-1023)`, "inject-xid"},
		{[]string{"inject-xid", "0", "0"}, `mpsctl: inject-xid: XID "0" is not an Xid (1-65536)`, "inject-xid"},
		{[]string{"inject-xid", "0", "65537"}, `mpsctl: inject-xid: XID "65537" is not an Xid (1-65536)`, "inject-xid"},
		{[]string{"inject-xid", "0", "0x4f"}, `mpsctl: inject-xid: XID "0x4f" is not an Xid (1-65536)`, "inject-xid"},
		{[]string{"inject-xid", "0", "xid79"}, `mpsctl: inject-xid: XID "xid79" is not an Xid (1-65536)`, "inject-xid"},
		{[]string{"inject-xid", "0", "", "--pid", "1"}, `mpsctl: inject-xid: XID "" is not an Xid (1-65536)`, "inject-xid"},
		{[]string{"inject-xid", "0", "79", "--pid"}, "mpsctl: inject-xid: flag --pid needs an argument", "inject-xid"},
		{[]string{"inject-xid", "0", "79", "--pid", "0"}, `mpsctl: inject-xid: invalid value "0" for flag --pid: not a process id`, "inject-xid"},
		{[]string{"inject-xid", "0", "79", "--pid=-5"}, `mpsctl: inject-xid: invalid value "-5" for flag --pid: not a process id`, "inject-xid"},
		{[]string{"inject-xid", "0", "79", "--pid", "init"}, `mpsctl: inject-xid: invalid value "init" for flag --pid: not a process id`, "inject-xid"},
		{[]string{"inject-xid", "0", "79", "--pid", "2147483648"}, `mpsctl: inject-xid: invalid value "2147483648" for flag --pid: not a process id`, "inject-xid"},
		{[]string{"check-config"}, "mpsctl: check-config: missing FILE", "check-config"},
		{[]string{"check-config", "a.yaml", "b.yaml"}, `mpsctl: check-config: unexpected argument "b.yaml"`, "check-config"},
		{[]string{"check-config", "--socket", "/x", "a.yaml"}, "mpsctl: check-config: unknown flag --socket", "check-config"},
		{[]string{"help", "frob"}, `mpsctl: help: unknown command "frob"`, ""},
		{[]string{"help", "status", "drain"}, `mpsctl: help: unexpected argument "drain"`, ""},
		{[]string{"drian", "--gpu", "0"}, `mpsctl: unknown command "drian"; did you mean "drain"?`, ""},
		{[]string{"help", "stauts"}, `mpsctl: help: unknown command "stauts"; did you mean "status"?`, ""},
		{[]string{"--sockt", "/x", "status"}, "mpsctl: unknown flag --sockt; did you mean --socket?", ""},
		{[]string{"status", "--jsno"}, "mpsctl: status: unknown flag --jsno; did you mean --json?", "status"},
		{[]string{"status", "--no-header"}, "mpsctl: status: unknown flag --no-header; did you mean --no-headers?", "status"},
		{[]string{"status", "-o", "yaml"}, `mpsctl: status: -o "yaml": want wide or json`, "status"},
		{[]string{"status", "-o", "wdie"}, `mpsctl: status: -o "wdie": want wide or json; did you mean "wide"?`, "status"},
		{[]string{"status", "--json", "-o", "wide"}, "mpsctl: status: --json and -o wide exclude each other", "status"},
		{[]string{"status", "--state", "runing"}, `mpsctl: status: --state "runing": did you mean "running"? (instance states: ready, starting, recovering, draining, drained, retiring, quarantined; lease states: running, queued)`, "status"},
		{[]string{"status", "--state", "x"}, `mpsctl: status: --state "x": want an instance state (ready, starting, recovering, draining, drained, retiring, quarantined) or a lease state (running, queued)`, "status"},
		{[]string{"status", "--watch=1ms"}, `mpsctl: status: invalid boolean value "1ms" for --watch: want an interval of 100ms or more, such as 2s or 1m`, "status"},
		{[]string{"status", "--watch", "soon"}, `mpsctl: status: unexpected argument "soon"`, "status"},
		{[]string{"status", "--gpu", "all"}, `mpsctl: status: --gpu "all": want a GPU index, a UUID or a UUID prefix`, "status"},
		{[]string{"status", "--user", "no-such-user-here"}, `mpsctl: status: --user "no-such-user-here": no such user (give a name this host knows, or a uid)`, "status"},
	} {
		// No socket exists: a usage error must be found before connecting.
		r := mpsctl(t, Config{}, []string{api.EnvSocket + "=/nonexistent/s.sock"}, tc.args...)
		if r.code != ExitUsage || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q; want 2 and nothing", tc.args, r.code, r.stdout)
		}
		if got := firstLine(r.stderr); got != tc.line {
			t.Errorf("%q: first line %q; want %q", tc.args, got, tc.line)
		}
		want := "usage: mpsctl [--socket PATH] COMMAND"
		if tc.cmd != "" {
			want = "usage: mpsctl [--socket PATH] " + tc.cmd + " "
		}
		if strings.Contains(tc.line, "unknown command") || strings.Contains(tc.line, "unknown flag") {
			// A name that does not exist: a hint, not the usage.
			hint := "Run 'mpsctl help' for the commands and options.\n"
			if tc.cmd != "" {
				hint = "Run 'mpsctl help " + tc.cmd + "' for its flags.\n"
			}
			if _, rest, _ := strings.Cut(r.stderr, "\n"); rest != hint {
				t.Errorf("%q: stderr after the first line %q; want the hint %q", tc.args, rest, hint)
			}
			continue
		}
		if _, rest, _ := strings.Cut(r.stderr, "\n\n"); !strings.HasPrefix(rest, want) {
			t.Errorf("%q: stderr after the first line:\n%s\nwant it to start %q", tc.args, rest, want)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"--socket", "/x", "--version"}, {"--version", "status"}} {
		r := mpsctl(t, Config{}, nil, args...)
		want := buildinfo.Read().Line("mpsctl") + "\n"
		if r.code != ExitOK || r.stderr != "" || r.stdout != want {
			t.Errorf("%q: exit %d, stderr %q, stdout %q; want 0, nothing, %q", args, r.code, r.stderr, r.stdout, want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"help"}, Usage()},
		{[]string{"--help"}, Usage()},
		{[]string{"-h"}, Usage()},
		{[]string{"--socket", "/x", "--help", "status"}, Usage()},
		{[]string{"help", "drain"}, commandUsage(lookup("drain"))},
		{[]string{"drain", "--help"}, commandUsage(lookup("drain"))},
		{[]string{"status", "-h"}, commandUsage(lookup("status"))},
		{[]string{"check-config", "--help"}, commandUsage(lookup("check-config"))},
		{[]string{"help", "restart"}, commandUsage(lookup("restart"))},
		{[]string{"requeue", "--help"}, commandUsage(lookup("requeue"))},
		{[]string{"inject-xid", "0", "79", "-h"}, commandUsage(lookup("inject-xid"))},
	} {
		r := mpsctl(t, Config{}, nil, tc.args...)
		if r.code != ExitOK || r.stderr != "" || r.stdout != tc.want {
			t.Errorf("%q: exit %d, stderr %q, stdout:\n%s\nwant 0, nothing and:\n%s", tc.args, r.code, r.stderr, r.stdout, tc.want)
		}
	}
	if u := commandUsage(lookup("inject-xid")); !strings.Contains(u, "only against mpsd --simulate") {
		t.Errorf("inject-xid's help does not say it needs mpsd --simulate:\n%s", u)
	}
	golden(t, "usage.golden", Usage())
	var all strings.Builder
	for i := range commands {
		all.WriteString(commandUsage(&commands[i]))
		all.WriteString("----\n")
	}
	golden(t, "usage-commands.golden", all.String())
	for _, c := range commands {
		if !strings.Contains(Usage(), "  "+c.name+" ") {
			t.Errorf("usage does not list %s", c.name)
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{usagef("x"), ExitUsage},
		{&usageError{cmd: lookup("status"), msg: "x"}, ExitUsage},
		{errReported, ExitFailure},
		{&api.Error{Code: api.CodeForbidden, Message: "no"}, ExitFailure},
		{errors.New("anything"), ExitFailure},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d; want %d", tc.err, got, tc.want)
		}
	}
}

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		want     []string
		simulate bool
	}{
		{nil, nil, false},
		{[]string{"f.yaml"}, []string{"f.yaml"}, false},
		{[]string{"--simulate", "f.yaml"}, []string{"f.yaml"}, true},
		{[]string{"f.yaml", "--simulate"}, []string{"f.yaml"}, true},
		{[]string{"a", "--simulate", "b"}, []string{"a", "b"}, true},
		{[]string{"--", "--simulate"}, []string{"--simulate"}, false},
		{[]string{"--simulate", "--", "-f.yaml", "--"}, []string{"-f.yaml", "--"}, true},
		{[]string{"-"}, []string{"-"}, false},
	} {
		fs := newFlagSet("t")
		sim := fs.Bool("simulate", false, "")
		got, err := parseInterspersed(fs, tc.args)
		if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") || *sim != tc.simulate {
			t.Errorf("parseInterspersed(%q) = %q, %v, simulate %v; want %q, simulate %v", tc.args, got, err, *sim, tc.want, tc.simulate)
		}
	}
}

func TestShortUUID(t *testing.T) {
	for in, want := range map[string]string{
		"GPU-1234abcd-1111-2222-3333-444444444444": "GPU-1234abcd…",
		"GPU-1234abcd":  "GPU-1234abcd",
		"GPU-12":        "GPU-12",
		"":              "-",
		"GPU-ééééééééé": "GPU-éééééééé…",
		"GPU-a b\nc":    "GPU-a?b?c",
	} {
		if got := ShortUUID(in); got != want {
			t.Errorf("ShortUUID(%q) = %q; want %q", in, got, want)
		}
	}
}
