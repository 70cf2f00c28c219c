package api

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A release request's exit status is 0 to 255, and its signal a name
// that comes with one; both are optional (an older launcher sends none).
func TestDecodeReleaseRequest(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		ok         bool
	}{
		{"old client", `{"attempt":2}`, true},
		{"status", `{"attempt":1,"exit_status":3}`, true},
		{"signal", `{"attempt":1,"exit_status":137,"signal":"SIGKILL"}`, true},
		{"realtime signal", `{"exit_status":150,"signal":"SIGRTMIN+3"}`, true},
		{"status too big", `{"exit_status":256}`, false},
		{"negative status", `{"exit_status":-1}`, false},
		{"signal alone", `{"signal":"SIGKILL"}`, false},
		{"signal not a name", `{"exit_status":1,"signal":"kill -9"}`, false},
		{"signal too long", `{"exit_status":1,"signal":"SIGAAAAAAAAAAAAAAAAAAAAA"}`, false},
	} {
		_, err := DecodeReleaseRequest(strings.NewReader(tc.body))
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%s: %s: %v; want ok %v", tc.name, tc.body, err, tc.ok)
		}
	}
}

// A history query is read strictly: unknown or repeated keys, a since
// that is no RFC 3339 time and names with blanks are refused.
func TestParseHistoryQuery(t *testing.T) {
	at := time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, raw string
		want      HistoryQuery
		ok        bool
	}{
		{"empty", "", HistoryQuery{}, true},
		{"all", "since=2026-12-07T20:00:00Z&user=alice&group=inference", HistoryQuery{Since: at, User: "alice", Group: "inference"}, true},
		{"uid", "user=1001", HistoryQuery{User: "1001"}, true},
		{"unknown key", "state=done", HistoryQuery{}, false},
		{"repeated", "user=a&user=b", HistoryQuery{}, false},
		{"since a duration", "since=2h", HistoryQuery{}, false},
		{"blank user", "user=a+b", HistoryQuery{}, false},
		{"empty group", "group=", HistoryQuery{}, false},
		{"control", "group=a%07", HistoryQuery{}, false},
		{"bad escape", "user=%zz", HistoryQuery{}, false},
	} {
		q, err := ParseHistoryQuery(tc.raw)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%s: %q: %v; want ok %v", tc.name, tc.raw, err, tc.ok)
			continue
		}
		if tc.ok && (!q.Since.Equal(tc.want.Since) || q.User != tc.want.User || q.Group != tc.want.Group) {
			t.Errorf("%s: %+v; want %+v", tc.name, q, tc.want)
		}
	}
}

// A query matches by end time (at or after since), uid or user name, and
// group.
func TestHistoryQueryMatches(t *testing.T) {
	end := time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)
	r := HistoryRecord{Lease: "g-1", UID: 1001, User: "alice", Group: "g", End: end}
	for _, tc := range []struct {
		name string
		q    HistoryQuery
		want bool
	}{
		{"any", HistoryQuery{}, true},
		{"since its end", HistoryQuery{Since: end}, true},
		{"since after", HistoryQuery{Since: end.Add(time.Second)}, false},
		{"uid", HistoryQuery{User: "1001"}, true},
		{"name", HistoryQuery{User: "alice"}, true},
		{"another user", HistoryQuery{User: "bob"}, false},
		{"group", HistoryQuery{Group: "g"}, true},
		{"another group", HistoryQuery{Group: "h"}, false},
	} {
		if got := tc.q.Matches(r); got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}
