package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzEventDecoder feeds arbitrary streams to the decoder: it must never
// panic, every event it returns must be valid and survive a write and a
// read back unchanged, and it must stop with an error.
func FuzzEventDecoder(f *testing.F) {
	for _, seed := range []string{
		"",
		`{"type":"queued","position":1,"group":"g"}` + "\n",
		`{"type":"granted","lease":{"id":"l","group":"g","gpu_indexes":[0],"gpu_uuids":["GPU-1"],"sm":10,"mem_bytes":1073741824,"attempt":1,"env":{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE":"10"}}}` + "\n",
		`{"type":"revoked","reason":"x"}` + "\n" + `{"type":"requeued","attempt":2}` + "\n",
		`{"type":"error","code":"wait_timeout","message":"m"}`,
		"\n\n\r\n",
		`{"type":"queued","position":1}{"type":"queued","position":1}` + "\n",
		`{"type":"granted","lease":{"id":"a/b"}}` + "\n",
		`{"type":"queued","position":1e3}` + "\n",
		"\xff\xfe\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		d := NewEventDecoder(bytes.NewReader(stream))
		for n := 0; ; n++ {
			if n > len(stream) {
				t.Fatalf("more events than bytes: the decoder does not advance")
			}
			ev, err := d.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) &&
					!errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			if err := ev.Validate(); err != nil {
				t.Fatalf("decoder returned an invalid event %+v: %v", ev, err)
			}
			var buf bytes.Buffer
			if err := WriteEvent(&buf, ev); err != nil {
				t.Fatalf("WriteEvent of a decoded event: %v", err)
			}
			back, err := ParseEvent(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
			if err != nil {
				t.Fatalf("ParseEvent(%s): %v", buf.Bytes(), err)
			}
			a, _ := json.Marshal(ev)
			b, _ := json.Marshal(back)
			if !bytes.Equal(a, b) {
				t.Fatalf("round trip changed the event: %s -> %s", a, b)
			}
		}
	})
}

// acceptedObject reports whether a request decoder accepted body (err is
// nil), failing the fuzz test when a refusal wraps neither ErrInvalid nor
// ErrTooLarge or an accepted body is not one JSON object.
func acceptedObject(t *testing.T, body []byte, err error) bool {
	t.Helper()
	if err != nil {
		if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		return false
	}
	if k := jsonKind(body); k != "an object" {
		t.Fatalf("accepted %s as a request: %q", k, body)
	}
	return true
}

// FuzzDecodeLeaseRequest checks the daemon-side request decoder: no
// panic, every accepted request is valid and re-encodes to a request that
// decodes the same, and every refusal wraps ErrInvalid or ErrTooLarge.
func FuzzDecodeLeaseRequest(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		`{"sm":30,"mem_bytes":8589934592,"gpus":1,"group":"g","requeue_attempts":2,"wait_ms":1000,"command":["a","b"]}`,
		`{"no_wait":true}`,
		`{"resume_lease_id":"l-1","attempt":3}`,
		`{"sm":30,"x":1}`,
		`{"sm":1}{}`,
		`{"SM":30}`,
		`{"requeue_attempts":null}`,
		`[`,
		`null`,
		`[]`,
		`1`,
		`"x"`,
		strings.Repeat(" ", 100) + `{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeLeaseRequest(bytes.NewReader(body))
		if !acceptedObject(t, body, err) {
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted an invalid request: %v", err)
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeLeaseRequest(bytes.NewReader(enc))
		if err != nil {
			t.Fatalf("re-encoded request %s refused: %v", enc, err)
		}
		enc2, _ := json.Marshal(again)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the request: %s -> %s", enc, enc2)
		}
	})
}

// FuzzDecodeReleaseRequest: a release request is one JSON object with
// nothing but a non-negative attempt and an exit status of 0 to 255 with
// a signal's name; it survives a round trip.
func FuzzDecodeReleaseRequest(f *testing.F) {
	for _, seed := range []string{`{}`, `{"attempt":2}`, `{"attempt":-1}`, `{"attempt":1.5}`, `{"x":1}`, `null`, `{}{}`,
		`{"attempt":1,"exit_status":3}`, `{"exit_status":137,"signal":"SIGKILL"}`, `{"exit_status":256}`, `{"signal":"SIGTERM"}`,
		`{"exit_status":1,"signal":"sig kill\n"}`, `{"exit_status":null}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		q, err := DecodeReleaseRequest(bytes.NewReader(body))
		if !acceptedObject(t, body, err) {
			return
		}
		if q.Attempt < 0 {
			t.Fatalf("accepted attempt %d", q.Attempt)
		}
		if q.ExitStatus != nil && (*q.ExitStatus < 0 || *q.ExitStatus > 255) {
			t.Fatalf("accepted exit_status %d", *q.ExitStatus)
		}
		if q.Signal != "" && (q.ExitStatus == nil || strings.ContainsAny(q.Signal, " \n\x00")) {
			t.Fatalf("accepted signal %q", q.Signal)
		}
		enc, _ := json.Marshal(q)
		again, err := DecodeReleaseRequest(bytes.NewReader(enc))
		enc2, _ := json.Marshal(again)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip of %q: %+v, %v", body, again, err)
		}
	})
}

// FuzzDecodeShutdownRequest: only one JSON object with no fields is a
// shutdown request; everything else is refused as invalid
// or too large.
func FuzzDecodeShutdownRequest(f *testing.F) {
	for _, seed := range []string{`{}`, ` {} `, `{"x":1}`, `null`, `[]`, `{}{}`, `"x"`, strings.Repeat(" ", 100) + `{}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, err := DecodeShutdownRequest(bytes.NewReader(body))
		if !acceptedObject(t, body, err) {
			return
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil || len(m) != 0 {
			t.Fatalf("accepted %q, not an empty object", body)
		}
	})
}

// FuzzParseHistoryQuery: a history query from the URL is refused (as
// invalid) or read into fields that survive the client's encoding and a
// second read unchanged; it never panics.
func FuzzParseHistoryQuery(f *testing.F) {
	for _, seed := range []string{"", "since=2026-12-07T20:00:00Z", "user=alice&group=inference", "user=1001", "since=yesterday",
		"user=a&user=b", "x=1", "user=%00", "group=" + strings.Repeat("g", 200), "since=2026-12-07T20:00:00.123456789%2B01:00", "%zz", ";"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := ParseHistoryQuery(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again, err := ParseHistoryQuery(q.Values().Encode())
		if err != nil {
			t.Fatalf("%q read as %+v, whose encoding is refused: %v", raw, q, err)
		}
		if !again.Since.Equal(q.Since) || again.User != q.User || again.Group != q.Group {
			t.Fatalf("round trip of %q: %+v, then %+v", raw, q, again)
		}
	})
}
