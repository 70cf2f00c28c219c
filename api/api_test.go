package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

func intp(n int) *int { return &n }

func TestDecodeLeaseRequest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		want    LeaseRequest
		wantErr error
		errHas  string
	}{
		{"empty object takes every default", `{}`, LeaseRequest{}, nil, ""},
		{"all fields", `{"sm":30,"mem_bytes":8589934592,"gpus":2,"group":"inference","requeue_attempts":0,"wait_ms":1000,"command":["./infer","-x"]}`,
			LeaseRequest{SM: 30, MemBytes: 8 << 30, GPUs: 2, Group: "inference", RequeueAttempts: intp(0), WaitMillis: 1000, Command: []string{"./infer", "-x"}}, nil, ""},
		{"resume", `{"resume_lease_id":"l-7","attempt":2}`, LeaseRequest{ResumeLeaseID: "l-7", Attempt: 2}, nil, ""},
		{"no wait", `{"no_wait":true}`, LeaseRequest{NoWait: true}, nil, ""},
		{"procs", `{"sm":30,"procs":4}`, LeaseRequest{SM: 30, Procs: 4}, nil, ""},
		{"procs with the group's sm", `{"procs":48}`, LeaseRequest{Procs: 48}, nil, ""},
		{"procs over MaxProcs", `{"procs":49}`, LeaseRequest{}, ErrInvalid, "procs 49: want 1 to 48 processes (MPS serves at most 48 clients per GPU), or 0 for 1"},
		{"procs negative", `{"procs":-1}`, LeaseRequest{}, ErrInvalid, "procs -1: want 1 to 48"},
		{"procs over sm", `{"sm":3,"procs":4}`, LeaseRequest{}, ErrInvalid, "procs 4 is more than sm 3: each process would get under 1% of the SMs"},
		{"unknown field", `{"sm":30,"smm":1}`, LeaseRequest{}, ErrInvalid, `unknown field "smm"`},
		{"trailing data", `{"sm":30} {}`, LeaseRequest{}, ErrInvalid, "data after the JSON object"},
		{"not JSON", `sm=30`, LeaseRequest{}, ErrInvalid, "lease request"},
		{"empty body", ``, LeaseRequest{}, ErrInvalid, "got an empty body"},
		{"null", `null`, LeaseRequest{}, ErrInvalid, "lease request must be a JSON object, got null"},
		{"array", ` [] `, LeaseRequest{}, ErrInvalid, "must be a JSON object, got an array"},
		{"wrong type", `{"sm":"30"}`, LeaseRequest{}, ErrInvalid, "sm"},
		{"sm over 100", `{"sm":101}`, LeaseRequest{}, ErrInvalid, "sm 101"},
		{"negative everything", `{"sm":-1,"mem_bytes":-1,"gpus":-1,"requeue_attempts":-1,"wait_ms":-1}`, LeaseRequest{}, ErrInvalid,
			"sm -1: want 1 to 100, or 0 for the group's default; mem_bytes -1 is negative; gpus -1 is negative; requeue_attempts -1 is negative; wait_ms -1 is negative"},
		{"no_wait with wait_ms", `{"no_wait":true,"wait_ms":5}`, LeaseRequest{}, ErrInvalid, "exclude each other"},
		{"wait_ms past a time.Duration", `{"wait_ms":9223372036855}`, LeaseRequest{}, ErrInvalid, "wait_ms 9223372036855 is more than 9223372036854"},
		{"bad resume id", `{"resume_lease_id":"../x","attempt":1}`, LeaseRequest{}, ErrInvalid, "resume_lease_id"},
		{"resume without attempt", `{"resume_lease_id":"l-1"}`, LeaseRequest{}, ErrInvalid, "attempt 0"},
		{"attempt without resume", `{"attempt":2}`, LeaseRequest{}, ErrInvalid, "only sent with resume_lease_id"},
		{"huge command", `{"command":["` + strings.Repeat("a", MaxCommandBytes+1) + `"]}`, LeaseRequest{}, ErrInvalid, "command is"},
		{"too large", `{"group":"` + strings.Repeat("a", MaxRequestBytes) + `"}`, LeaseRequest{}, ErrTooLarge, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeLeaseRequest(strings.NewReader(tc.body))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want %v containing %q", err, tc.wantErr, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a, _ := json.Marshal(got)
			b, _ := json.Marshal(tc.want)
			if !bytes.Equal(a, b) {
				t.Errorf("got %s, want %s", a, b)
			}
		})
	}
}

// Every request decoder refuses a body that is not a JSON object, saying
// what it got: json.Decoder alone would take null as an empty request.
func TestDecodersRefuseNonObjects(t *testing.T) {
	decoders := map[string]func(io.Reader) error{
		"lease request":      func(r io.Reader) error { _, err := DecodeLeaseRequest(r); return err },
		"attach request":     func(r io.Reader) error { _, err := DecodeAttachRequest(r); return err },
		"admin request":      func(r io.Reader) error { _, err := DecodeAdminTarget(r); return err },
		"requeue request":    func(r io.Reader) error { _, err := DecodeRequeueRequest(r); return err },
		"cancel request":     func(r io.Reader) error { _, err := DecodeCancelRequest(r); return err },
		"inject-xid request": func(r io.Reader) error { _, err := DecodeInjectXidRequest(r); return err },
		"pod binding":        func(r io.Reader) error { _, err := DecodeBindPodRequest(r); return err },
	}
	for what, decode := range decoders {
		for _, tc := range []struct{ body, kind string }{
			{"null", "null"},
			{" null\n", "null"},
			{"[]", "an array"},
			{`[{"pid":12}]`, "an array"},
			{"1", "a number"},
			{"-1", "a number"},
			{`"x"`, "a string"},
			{"true", "a boolean"},
			{"", "an empty body"},
			{"\n\t ", "an empty body"},
			{"nul", "null"},
			{"=", "something that is not JSON"},
		} {
			err := decode(strings.NewReader(tc.body))
			want := what + " must be a JSON object, got " + tc.kind
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s of %q: err = %v, want ErrInvalid saying %q", what, tc.body, err, want)
			}
		}
	}
}

func TestLeaseRequestRoundTrip(t *testing.T) {
	in := LeaseRequest{SM: 10, MemBytes: 1 << 30, GPUs: 1, Group: "g", RequeueAttempts: intp(2), WaitMillis: 1500, Command: []string{"/bin/true"}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeLeaseRequest(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if out.SM != in.SM || out.MemBytes != in.MemBytes || *out.RequeueAttempts != 2 || out.WaitMillis != 1500 || !slices.Equal(out.Command, in.Command) {
		t.Errorf("round trip: %+v, want %+v", out, in)
	}
	// Absent requeue_attempts stays absent: the group's default.
	b, _ = json.Marshal(LeaseRequest{SM: 10})
	if string(b) != `{"sm":10}` {
		t.Errorf("minimal request encodes as %s", b)
	}
}

func TestDecodeAttachRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		pid  int
		err  error
	}{
		{"ok", `{"pid":1234}`, 1234, nil},
		{"pid 1", `{"pid":1}`, 0, ErrInvalid},
		{"negative", `{"pid":-5}`, 0, ErrInvalid},
		{"missing", `{}`, 0, ErrInvalid},
		{"unknown field", `{"pid":12,"uid":0}`, 0, ErrInvalid},
		{"too large", `{"pid":12` + strings.Repeat(" ", MaxRequestBytes) + `}`, 0, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeAttachRequest(strings.NewReader(tc.body))
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if got.PID != tc.pid {
				t.Errorf("pid = %d, want %d", got.PID, tc.pid)
			}
		})
	}
}

func TestAttachPath(t *testing.T) {
	if got := AttachPath("lease-1"); got != "/v1/leases/lease-1/attach" {
		t.Errorf("AttachPath = %q", got)
	}
	for _, tc := range []struct {
		path string
		id   string
		ok   bool
	}{
		{"/v1/leases/lease-1/attach", "lease-1", true},
		{"/v1/leases/a.b_c-9/attach", "a.b_c-9", true},
		{"/v1/leases//attach", "", false},
		{"/v1/leases/../attach", "", false},
		{"/v1/leases/a/b/attach", "", false},
		{"/v1/leases/lease-1", "", false},
		{"/v2/leases/lease-1/attach", "", false},
	} {
		id, ok := LeaseIDFromAttachPath(tc.path)
		if id != tc.id || ok != tc.ok {
			t.Errorf("LeaseIDFromAttachPath(%q) = %q, %v; want %q, %v", tc.path, id, ok, tc.id, tc.ok)
		}
	}
}

func TestValidLeaseID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"l", true}, {"lease-1", true}, {"A.b_C-0", true}, {strings.Repeat("a", MaxLeaseIDLen), true},
		{"", false}, {".hidden", false}, {"a/b", false}, {"a b", false}, {"é", false},
		{strings.Repeat("a", MaxLeaseIDLen+1), false},
	} {
		if err := ValidLeaseID(tc.id); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("ValidLeaseID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

func goodLease() *Lease {
	return &Lease{ID: "lease-1", Group: "g", GPUIndexes: []int{0}, GPUUUIDs: []string{"GPU-1"}, SM: 30, MemBytes: 1 << 30,
		Attempt: 1, Env: map[string]string{EnvThreadPercentage: "30"}}
}

func TestEventValidate(t *testing.T) {
	bad := func(mut func(*Lease)) *Lease { l := goodLease(); mut(l); return l }
	for _, tc := range []struct {
		name   string
		ev     Event
		errHas string // "" = valid
	}{
		{"queued", Event{Type: EventQueued, Position: 1, Group: "g"}, ""},
		{"queued position 0", Event{Type: EventQueued}, "position 0"},
		{"queued with its lease id", Event{Type: EventQueued, Position: 1, LeaseID: "g-1a2b"}, ""},
		{"queued bad lease id", Event{Type: EventQueued, Position: 1, LeaseID: "../x"}, "lease id"},
		{"granted", Event{Type: EventGranted, Lease: goodLease()}, ""},
		{"granted without lease", Event{Type: EventGranted}, "without a lease"},
		{"granted bad id", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.ID = "a/b" })}, "lease id"},
		{"granted no group", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.Group = "" })}, "no group"},
		{"granted sm 0", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.SM = 0 })}, "sm 0"},
		{"granted negative mem", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.MemBytes = -1 })}, "negative"},
		{"granted attempt 0", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.Attempt = 0 })}, "attempt 0"},
		{"granted procs", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.Procs = 4 })}, ""},
		{"granted procs over sm", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.SM, l.Procs = 3, 4 })}, "procs 4"},
		{"granted procs over MaxProcs", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.SM, l.Procs = 100, 49 })}, "procs 49"},
		{"granted negative procs", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.Procs = -1 })}, "procs -1"},
		{"granted env key with =", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.Env["A=B"] = "c" })}, "environment"},
		{"granted env value with NUL", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.Env["A"] = "c\x00" })}, "environment"},
		{"granted empty env key", Event{Type: EventGranted, Lease: bad(func(l *Lease) { l.Env[""] = "c" })}, "environment"},
		{"revoked", Event{Type: EventRevoked, Reason: "server fault"}, ""},
		{"revoked without reason", Event{Type: EventRevoked}, "without a reason"},
		{"requeued", Event{Type: EventRequeued, Attempt: 2}, ""},
		{"requeued attempt 1", Event{Type: EventRequeued, Attempt: 1}, "attempt 1"},
		{"error", Event{Type: EventError, Code: CodeRefused, Message: "no"}, ""},
		{"error unknown code is still an error", Event{Type: EventError, Code: "future", Message: "no"}, ""},
		{"error without message", Event{Type: EventError, Code: CodeRefused}, "without a message"},
		{"unknown type", Event{Type: "paused"}, "unknown event type"},
		{"no type", Event{}, "unknown event type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ev.Validate()
			if tc.errHas == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("Validate = %v, want ErrInvalid containing %q", err, tc.errHas)
			}
		})
	}
}

func TestEventWireFormat(t *testing.T) {
	// The exact lines of the protocol (doc.go): a daemon and a client
	// written separately must agree on these bytes.
	for _, tc := range []struct {
		ev   Event
		want string
	}{
		{Event{Type: EventQueued, Position: 3, Group: "g"}, `{"type":"queued","position":3,"group":"g"}`},
		{Event{Type: EventQueued, Position: 3, Group: "g", LeaseID: "g-1"}, `{"type":"queued","position":3,"group":"g","lease_id":"g-1"}`},
		{Event{Type: EventRevoked, Reason: "server fault"}, `{"type":"revoked","reason":"server fault"}`},
		{Event{Type: EventRequeued, Attempt: 2}, `{"type":"requeued","attempt":2}`},
		{Event{Type: EventError, Code: CodeWaitTimeout, Message: "waited 1s"}, `{"type":"error","code":"wait_timeout","message":"waited 1s"}`},
		{Event{Type: EventGranted, Lease: &Lease{ID: "l", Group: "g", GPUIndexes: []int{1}, GPUUUIDs: []string{"GPU-x"}, SM: 10, MemBytes: 1024, Attempt: 1, Env: map[string]string{"A": "b"}}},
			`{"type":"granted","lease":{"id":"l","group":"g","gpu_indexes":[1],"gpu_uuids":["GPU-x"],"sm":10,"mem_bytes":1024,"attempt":1,"env":{"A":"b"}}}`},
	} {
		var buf bytes.Buffer
		if err := WriteEvent(&buf, tc.ev); err != nil {
			t.Fatal(err)
		}
		if got := buf.String(); got != tc.want+"\n" {
			t.Errorf("WriteEvent(%s) = %s, want %s", tc.ev.Type, got, tc.want)
		}
		back, err := ParseEvent([]byte(tc.want))
		if err != nil {
			t.Fatalf("ParseEvent(%s): %v", tc.want, err)
		}
		again, _ := json.Marshal(back)
		if string(again) != tc.want {
			t.Errorf("round trip of %s gave %s", tc.want, again)
		}
	}
}

func TestWriteEventRefusesInvalid(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteEvent(&buf, Event{Type: EventQueued}); !errors.Is(err, ErrInvalid) {
		t.Errorf("WriteEvent(invalid) = %v, want ErrInvalid", err)
	}
	if buf.Len() != 0 {
		t.Errorf("an invalid event wrote %q", buf.String())
	}
	big := Event{Type: EventRevoked, Reason: strings.Repeat("x", MaxEventBytes)}
	if err := WriteEvent(&buf, big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("WriteEvent(huge) = %v, want ErrTooLarge", err)
	}
}

func TestWriteEventFlushes(t *testing.T) {
	rec := httptest.NewRecorder()
	if err := WriteEvent(rec, Event{Type: EventRequeued, Attempt: 2}); err != nil {
		t.Fatal(err)
	}
	if !rec.Flushed {
		t.Error("WriteEvent did not flush the http.ResponseWriter")
	}
}

func TestEventDecoder(t *testing.T) {
	queued := `{"type":"queued","position":2}`
	for _, tc := range []struct {
		name    string
		stream  string
		types   []EventType
		lastErr error // the error after the events; io.EOF for a clean end
	}{
		{"empty", "", nil, io.EOF},
		{"one event", queued + "\n", []EventType{EventQueued}, io.EOF},
		{"keep-alive blank lines", "\n\r\n  \n" + queued + "\n\n", []EventType{EventQueued}, io.EOF},
		{"CRLF", queued + "\r\n" + queued + "\r\n", []EventType{EventQueued, EventQueued}, io.EOF},
		{"unknown fields ignored", `{"type":"requeued","attempt":3,"since":"v1.1"}` + "\n", []EventType{EventRequeued}, io.EOF},
		{"cut inside a line", queued + "\n" + `{"type":"que`, []EventType{EventQueued}, io.ErrUnexpectedEOF},
		{"no final newline", queued, nil, io.ErrUnexpectedEOF},
		{"garbage", "hello\n", nil, ErrInvalid},
		{"two objects on a line", queued + queued + "\n", nil, ErrInvalid},
		{"null", "null\n", nil, ErrInvalid},
		{"invalid event", `{"type":"queued","position":0}` + "\n", nil, ErrInvalid},
		{"line too long", `{"type":"revoked","reason":"` + strings.Repeat("x", MaxEventBytes) + "\"}\n", nil, ErrTooLarge},
		{"long line within bound", `{"type":"revoked","reason":"` + strings.Repeat("x", MaxEventBytes-40) + "\"}\n", []EventType{EventRevoked}, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read finds any dependence on read boundaries.
			d := NewEventDecoder(iotest.OneByteReader(strings.NewReader(tc.stream)))
			var got []EventType
			var err error
			for {
				var ev Event
				ev, err = d.Next()
				if err != nil {
					break
				}
				got = append(got, ev.Type)
			}
			if !slices.Equal(got, tc.types) {
				t.Errorf("events %v, want %v", got, tc.types)
			}
			if !errors.Is(err, tc.lastErr) {
				t.Errorf("final error %v, want %v", err, tc.lastErr)
			}
		})
	}
}

func TestEventDecoderReadError(t *testing.T) {
	boom := errors.New("boom")
	d := NewEventDecoder(io.MultiReader(strings.NewReader(`{"type":"que`), iotest.ErrReader(boom)))
	if _, err := d.Next(); !errors.Is(err, boom) {
		t.Errorf("Next = %v, want the reader's error", err)
	}
}

func TestDecodeError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   Error
	}{
		{"error body", 403, `{"code":"refused","message":"uid 1001 is not in group a"}`, Error{CodeRefused, "uid 1001 is not in group a"}},
		{"no code", 400, `{"message":"bad"}`, Error{CodeInternal, "bad"}},
		{"not JSON", 502, `<html>`, Error{CodeInternal, "mpsd answered 502 Bad Gateway"}},
		{"empty", 500, ``, Error{CodeInternal, "mpsd answered 500 Internal Server Error"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DecodeError(tc.status, strings.NewReader(tc.body))
			if *got != tc.want {
				t.Errorf("DecodeError = %+v, want %+v", *got, tc.want)
			}
		})
	}
}

func TestErrorCodeTemporary(t *testing.T) {
	for _, tc := range []struct {
		code ErrorCode
		want bool
	}{
		{CodeWaitTimeout, true}, {CodeAttemptsExhausted, true}, {CodeUnavailable, true}, {CodeOverLimit, true},
		{CodeBadRequest, false}, {CodeTooLarge, false}, {CodeRefused, false}, {CodeForbidden, false},
		{CodeNotFound, false}, {CodeConflict, false}, {CodeInternal, false}, {"from-the-future", false},
	} {
		if got := tc.code.Temporary(); got != tc.want {
			t.Errorf("%s.Temporary() = %v, want %v", tc.code, got, tc.want)
		}
	}
}

func TestStatusKeys(t *testing.T) {
	// docs/architecture.md#the-status-document fixes the first keys of each object for mpsctl status
	// --json; the rest are additions, which may only be appended.
	st := Status{
		Instances: []InstanceStatus{{GPUUUID: "GPU-1", GPUIndex: 0, Group: "g", State: InstanceReady, DaemonPID: 10, ServerPIDs: []int{11}, Clients: 1, Restarts: 0,
			GPUIndexes: []int{0}, GPUUUIDs: []string{"GPU-1"}, SMAllocated: 30, SMBudget: 100, MemAllocatedBytes: 1, MemBudgetBytes: 2, MaxClients: 48}},
		Leases:        []LeaseStatus{{ID: "l", Group: "g", GPUIndexes: []int{0}, UID: 1001, PIDs: []int{12}, SM: 30, MemBytes: 1, Attempt: 1, State: LeaseRunning}},
		Queue:         map[string]int{"g": 2},
		SchemaVersion: StatusSchemaVersion,
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"instances":[{"gpu_uuid":"GPU-1","gpu_index":0,"group":"g","state":"ready","daemon_pid":10,"server_pids":[11],"clients":1,"restarts":0,` +
		`"gpu_indexes":[0],"gpu_uuids":["GPU-1"],"sm_allocated":30,"sm_budget":100,"mem_allocated_bytes":1,"mem_budget_bytes":2,"max_clients":48}],` +
		`"leases":[{"id":"l","group":"g","gpu_indexes":[0],"uid":1001,"pids":[12],"sm":30,"mem_bytes":1,"attempt":1,"state":"running"}],"queue":{"g":2},` +
		`"schema_version":1}`
	if string(b) != want {
		t.Errorf("status JSON\n got %s\nwant %s", b, want)
	}
}
