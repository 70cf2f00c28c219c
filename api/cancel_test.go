package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzDecodeCancelRequest: a cancel request names a valid lease, a signal
// 0-64 and a grace within MaxCancelGrace; it survives a round trip.
func FuzzDecodeCancelRequest(f *testing.F) {
	for _, seed := range []string{`{"lease":"a1"}`, `{"lease":"a1","signal":15,"grace_ms":5000}`, `{"lease":"a1","signal":65}`,
		`{"lease":"a1","grace_ms":-1}`, `{"lease":"../x"}`, `{}`, `null`, `{"lease":"a1"}{}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		q, err := DecodeCancelRequest(bytes.NewReader(body))
		if !acceptedObject(t, body, err) {
			return
		}
		if ValidLeaseID(q.Lease) != nil || q.Signal < 0 || q.Signal > 64 || q.Grace() <= 0 || q.Grace() > MaxCancelGrace {
			t.Fatalf("accepted %+v", q)
		}
		enc, _ := json.Marshal(q)
		again, err := DecodeCancelRequest(bytes.NewReader(enc))
		if err != nil || again != q {
			t.Fatalf("round trip of %q: %+v, %v", body, again, err)
		}
	})
}

// FuzzDecodeAdminTarget: an admin request names a gpu or a group, and its
// reason is one printable line of at most MaxReasonBytes.
func FuzzDecodeAdminTarget(f *testing.F) {
	for _, seed := range []string{`{"gpu":"0"}`, `{"group":"a","reason":"fan replacement"}`, `{"gpu":"0","reason":"a\nb"}`, `{"gpu":"0","reason":"fan \u202ereplacement"}`,
		`{"gpu":"0","reason":"` + strings.Repeat("x", MaxReasonBytes+1) + `"}`, `{}`, `null`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		q, err := DecodeAdminTarget(bytes.NewReader(body))
		if !acceptedObject(t, body, err) {
			return
		}
		if q.GPU == "" && q.Group == "" {
			t.Fatalf("accepted %q, which names nothing", body)
		}
		if len(q.Reason) > MaxReasonBytes || !utf8.ValidString(q.Reason) || strings.IndexFunc(q.Reason, unprintable) >= 0 {
			t.Fatalf("accepted reason %q", q.Reason)
		}
	})
}

func TestCancelRequestGrace(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want time.Duration
	}{{0, DefaultCancelGrace}, {1, time.Millisecond}, {30000, 30 * time.Second}} {
		if got := (CancelRequest{Lease: "x", GraceMs: tc.ms}).Grace(); got != tc.want {
			t.Errorf("GraceMs %d: Grace() = %s, want %s", tc.ms, got, tc.want)
		}
	}
}
