package mpsctl

import (
	"net/http"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// postedOnce checks that fake received exactly one POST of JSON to path
// and returns its body.
func postedOnce(t *testing.T, fake *fakeMPSD, path string) string {
	t.Helper()
	reqs := fake.requests()
	if len(reqs) != 1 {
		t.Fatalf("requests = %+v; want one", reqs)
	}
	q := reqs[0]
	if q.method != http.MethodPost || q.path != path || q.contentType != api.ContentTypeJSON {
		t.Errorf("request %s %s (%s); want POST %s (%s)", q.method, q.path, q.contentType, path, api.ContentTypeJSON)
	}
	return q.body
}

func TestRestart(t *testing.T) {
	restarted := api.AdminResult{Instances: []api.InstanceStatus{
		{GPUUUID: "GPU-bbbbbbbb-1111-2222-3333-444444444444", GPUIndex: 1, Group: "inference", State: api.InstanceRecovering},
		{GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "inference", State: api.InstanceRecovering},
		{GPUUUID: "GPU-cccccccc-1111-2222-3333-444444444444", GPUIndex: 2, Group: "batch", State: api.InstanceStarting,
			GPUIndexes: []int{2, 3}, GPUUUIDs: []string{"GPU-cccccccc-1111-2222-3333-444444444444", "GPU-dddddddd-1111-2222-3333-444444444444"}},
	}}
	one := api.AdminResult{Instances: []api.InstanceStatus{
		{GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "inference", State: api.InstanceRecovering},
	}}
	for _, tc := range []struct {
		name string
		args []string
		// socketAfter passes --socket after the command's flags instead
		// of $MPSD_SOCKET.
		socketAfter bool
		rep         reply
		body        api.AdminTarget
		stdout      string
	}{
		{
			name: "group", args: []string{"restart", "--group", "inference"}, rep: ok(t, restarted),
			body: api.AdminTarget{Group: "inference"},
			stdout: "restarting gpu 0 (GPU-aaaaaaaa…) group inference: state recovering\n" +
				"restarting gpu 1 (GPU-bbbbbbbb…) group inference: state recovering\n" +
				"restarting gpu 2,3 (GPU-cccccccc…,GPU-dddddddd…) group batch: state starting\n",
		},
		{
			name: "gpu", args: []string{"restart", "--gpu=0"}, rep: ok(t, one),
			body:   api.AdminTarget{GPU: "0"},
			stdout: "restarting gpu 0 (GPU-aaaaaaaa…) group inference: state recovering\n",
		},
		{
			name: "group on gpu, socket after the command", args: []string{"restart", "--gpu", "GPU-aaaa", "--group", "inference"},
			socketAfter: true, rep: ok(t, one),
			body:   api.AdminTarget{GPU: "GPU-aaaa", Group: "inference"},
			stdout: "restarting gpu 0 (GPU-aaaaaaaa…) group inference: state recovering\n",
		},
		{
			name: "nothing restarted", args: []string{"restart", "--group", "idle"}, rep: ok(t, api.AdminResult{}),
			body:   api.AdminTarget{Group: "idle"},
			stdout: "no instance restarting\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"POST " + api.PathRestart: tc.rep})
			environ, args := []string{api.EnvSocket + "=" + fake.socket}, tc.args
			if tc.socketAfter {
				environ, args = nil, append(args[:len(args):len(args)], "--socket", fake.socket)
			}
			r := mpsctl(t, Config{}, environ, args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
			}
			if r.stdout != tc.stdout {
				t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, tc.stdout)
			}
			body := postedOnce(t, fake, api.PathRestart)
			got, err := api.DecodeAdminTarget(strings.NewReader(body)) // as strictly as mpsd
			if err != nil || got != tc.body {
				t.Errorf("body %s decodes to %+v, %v; want %+v", body, got, err, tc.body)
			}
		})
	}
}

func TestRequeue(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		rep    reply
		lease  string
		stdout string
	}{
		{
			name: "running lease", args: []string{"requeue", "i-0042"},
			rep: ok(t, api.AdminResult{Instances: []api.InstanceStatus{
				{GPUUUID: "GPU-aaaaaaaa-1111-2222-3333-444444444444", GPUIndex: 0, Group: "inference", State: api.InstanceReady},
			}}),
			lease: "i-0042", stdout: "requeued lease i-0042 (was on gpu 0 group inference)\n",
		},
		{
			name: "lease on a multi-GPU instance", args: []string{"requeue", "b.7_x"},
			rep: ok(t, api.AdminResult{Instances: []api.InstanceStatus{
				{GPUUUID: "GPU-cccccccc", GPUIndex: 2, Group: "batch", State: api.InstanceReady,
					GPUIndexes: []int{2, 3}, GPUUUIDs: []string{"GPU-cccccccc", "GPU-dddddddd"}},
			}}),
			lease: "b.7_x", stdout: "requeued lease b.7_x (was on gpu 2,3 group batch)\n",
		},
		{
			name: "lease id starting with a dash, after --", args: []string{"requeue", "--", "-x1"},
			rep:   ok(t, api.AdminResult{Instances: []api.InstanceStatus{{GPUIndex: 1, Group: "g"}}}),
			lease: "-x1", stdout: "requeued lease -x1 (was on gpu 1 group g)\n",
		},
		{
			name: "no instance named", args: []string{"requeue", "a"}, rep: ok(t, api.AdminResult{}),
			lease: "a", stdout: "requeued lease a\n",
		},
		{
			name: "group name is data", args: []string{"requeue", "a"},
			rep:   ok(t, api.AdminResult{Instances: []api.InstanceStatus{{GPUIndex: 0, Group: "a b\nc"}}}),
			lease: "a", stdout: "requeued lease a (was on gpu 0 group a?b?c)\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"POST " + api.PathRequeue: tc.rep})
			r := mpsctl(t, Config{}, nil, append([]string{"--socket", fake.socket}, tc.args...)...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
			}
			if r.stdout != tc.stdout {
				t.Errorf("stdout %q; want %q", r.stdout, tc.stdout)
			}
			body := postedOnce(t, fake, api.PathRequeue)
			got, err := api.DecodeRequeueRequest(strings.NewReader(body))
			if want := (api.RequeueRequest{Lease: tc.lease}); err != nil || got != want {
				t.Errorf("body %s decodes to %+v, %v; want %+v", body, got, err, want)
			}
		})
	}
}

func TestInjectXid(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		rep    reply
		body   api.InjectXidRequest
		stdout string
	}{
		{
			name: "xid", args: []string{"inject-xid", "0", "79"}, rep: ok(t, struct{}{}),
			body: api.InjectXidRequest{GPU: 0, Xid: 79}, stdout: "injected Xid 79 on gpu 0\n",
		},
		{
			name: "with pid after", args: []string{"inject-xid", "3", "13", "--pid", "4242"}, rep: ok(t, struct{}{}),
			body: api.InjectXidRequest{GPU: 3, Xid: 13, PID: 4242}, stdout: "injected Xid 13 on gpu 3 for pid 4242\n",
		},
		{
			name: "with pid first", args: []string{"inject-xid", "--pid=7", "1", "31"}, rep: ok(t, struct{}{}),
			body: api.InjectXidRequest{GPU: 1, Xid: 31, PID: 7}, stdout: "injected Xid 31 on gpu 1 for pid 7\n",
		},
		{
			name: "largest values", args: []string{"inject-xid", "1023", "65536", "--pid", "2147483647"}, rep: ok(t, struct{}{}),
			body:   api.InjectXidRequest{GPU: 1023, Xid: 65536, PID: 2147483647},
			stdout: "injected Xid 65536 on gpu 1023 for pid 2147483647\n",
		},
		{
			name: "leading zeros", args: []string{"inject-xid", "007", "0079"}, rep: ok(t, struct{}{}),
			body: api.InjectXidRequest{GPU: 7, Xid: 79}, stdout: "injected Xid 79 on gpu 7\n",
		},
		{
			name: "answer with fields this version does not know", args: []string{"inject-xid", "0", "48"},
			rep:  reply{status: http.StatusOK, body: `{"future":1}`},
			body: api.InjectXidRequest{GPU: 0, Xid: 48}, stdout: "injected Xid 48 on gpu 0\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"POST " + api.PathInjectXid: tc.rep})
			r := mpsctl(t, Config{}, []string{api.EnvSocket + "=" + fake.socket}, tc.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
			}
			if r.stdout != tc.stdout {
				t.Errorf("stdout %q; want %q", r.stdout, tc.stdout)
			}
			body := postedOnce(t, fake, api.PathInjectXid)
			got, err := api.DecodeInjectXidRequest(strings.NewReader(body))
			if err != nil || got != tc.body {
				t.Errorf("body %s decodes to %+v, %v; want %+v", body, got, err, tc.body)
			}
			if tc.body.PID == 0 && strings.Contains(body, "pid") {
				t.Errorf("body %s sends a pid nobody gave", body)
			}
		})
	}
}

// resume says per instance what it lifted; --gpu all lifting a
// quarantine says so, with why the instance had been quarantined.
func TestResumeSaysWhatItLifted(t *testing.T) {
	res := api.AdminResult{
		Instances: []api.InstanceStatus{
			{GPUUUID: "GPU-bbbbbbbb", GPUIndex: 1, Group: "a", State: api.InstanceReady},
			{GPUUUID: "GPU-aaaaaaaa", GPUIndex: 0, Group: "b", State: api.InstanceReady},
			{GPUUUID: "GPU-aaaaaaaa", GPUIndex: 0, Group: "a", State: api.InstanceReady},
		},
		Lifted: []api.Lifted{
			{},
			{Drain: true, Quarantine: true, QuarantineReason: "3 failures in 10m0s; the last: hung"},
			{Drain: true},
		},
	}
	fake := newFake(t, map[string]reply{"POST " + api.PathResume: ok(t, res)})
	r := mpsctl(t, Config{}, nil, "--socket", fake.socket, "resume", "--gpu", "all")
	if r.code != ExitOK || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
	}
	want := "gpu 0 (GPU-aaaaaaaa) group a: drain lifted; state ready\n" +
		"gpu 0 (GPU-aaaaaaaa) group b: drain lifted; quarantine lifted (was: 3 failures in 10m0s; the last: hung); state ready\n" +
		"gpu 1 (GPU-bbbbbbbb) group a: nothing to lift (neither drained nor quarantined); state ready\n"
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
	body := postedOnce(t, fake, api.PathResume)
	if got, err := api.DecodeAdminTarget(strings.NewReader(body)); err != nil || got != (api.AdminTarget{GPU: "all"}) {
		t.Errorf("body %s decodes to %+v, %v", body, got, err)
	}
}

// shutdown posts an empty object and prints what mpsd did; a non-admin's
// refusal is mpsd's one line, exit 1.
func TestShutdown(t *testing.T) {
	res := api.ShutdownResult{Revoked: 2, Withdrawn: 1, Daemons: 3, Problems: []string{"GPU 1 group a: control daemon did not quit in time and was killed"}}
	fake := newFake(t, map[string]reply{"POST " + api.PathShutdown: ok(t, res)})
	r := mpsctl(t, Config{}, nil, "--socket", fake.socket, "shutdown")
	if r.code != ExitOK || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
	}
	want := "mpsd shut down: 2 running lease(s) revoked, 1 queued request(s) refused, 3 MPS control daemon(s) stopped, compute modes restored where mpsd had set them\n" +
		"  problem: GPU 1 group a: control daemon did not quit in time and was killed\n"
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
	if body := postedOnce(t, fake, api.PathShutdown); strings.TrimSpace(body) != "{}" {
		t.Errorf("shutdown body %q; want {}", body)
	}

	refused := newFake(t, map[string]reply{"POST " + api.PathShutdown: {status: http.StatusForbidden,
		body: `{"code":"forbidden","message":"uid 1000 is not an mpsd admin (admins in the config)"}`}})
	r = mpsctl(t, Config{}, nil, "--socket", refused.socket, "shutdown")
	if r.code != ExitFailure || r.stderr != "mpsctl: uid 1000 is not an mpsd admin (admins in the config)\n" {
		t.Errorf("refused shutdown: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := mpsctl(t, Config{}, nil, "--socket", refused.socket, "shutdown", "now"); r.code != ExitUsage {
		t.Errorf("shutdown now: exit %d; want %d", r.code, ExitUsage)
	}
}

// The instances' driver and MPS versions are summed up below their table;
// a status without them shows no such line.
func TestWriteStatusVersions(t *testing.T) {
	st := api.Status{Instances: []api.InstanceStatus{
		{Group: "a", GPUIndex: 0, DriverVersion: "580.159.04", MPSVersion: "13000"},
		{Group: "b", GPUIndex: 0, DriverVersion: "580.159.04", MPSVersion: "13000"},
		{Group: "c", GPUIndex: 1, DriverVersion: "550.163.01"},
	}}
	var b strings.Builder
	if err := WriteStatus(&b, st, nil); err != nil {
		t.Fatal(err)
	}
	want := "  MPS - (driver 550.163.01): 1 instance\n  MPS 13000 (driver 580.159.04): 2 instances\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("status:\n%s\nwant the lines\n%s", b.String(), want)
	}
	b.Reset()
	for i := range st.Instances {
		st.Instances[i].DriverVersion, st.Instances[i].MPSVersion = "", ""
	}
	if err := WriteStatus(&b, st, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "MPS ") {
		t.Errorf("status without versions names some:\n%s", b.String())
	}
}
