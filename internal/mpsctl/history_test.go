package mpsctl

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

// historyFixture is a history of every kind of end: released with a
// status, killed by a signal, withdrawn while queued (never ran), revoked
// with no attempts left after a requeue, of a uid without a name.
func historyFixture() api.History {
	at := time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC)
	ptr := func(v int) *int { return &v }
	peak := func(v uint64) *uint64 { return &v }
	granted := func(d time.Duration) *time.Time { g := at.Add(d); return &g }
	return api.History{Records: []api.HistoryRecord{
		{Lease: "inference-0a1b2c", JobID: "slurm-881", UID: 1001, User: "alice", Group: "inference", GPUIndexes: []int{0}, SM: 30, MemBytes: 8 << 30, Procs: 1,
			Start: at, Granted: granted(1500 * time.Millisecond), End: at.Add(10 * time.Minute), WaitMillis: 1500, Attempts: 1,
			Ended: api.EndedReleased, Reason: "its command ended", ExitStatus: ptr(0), PeakMemBytes: peak(6 << 30)},
		{Lease: "inference-3d4e5f", UID: 1003, User: "bob", Group: "inference", GPUIndexes: []int{1}, SM: 10, MemBytes: 1 << 30, Procs: 2,
			Start: at.Add(time.Minute), Granted: granted(time.Minute), End: at.Add(2 * time.Minute), Attempts: 1,
			Ended: api.EndedReleased, Reason: "its command ended", ExitStatus: ptr(137), Signal: "SIGKILL"},
		{Lease: "training-6a7b8c", UID: 1002, Group: "training", GPUIndexes: []int{}, SM: 50, MemBytes: 20 << 30, Procs: 1,
			Start: at.Add(3 * time.Minute), End: at.Add(4 * time.Minute), WaitMillis: 60000, Attempts: 1,
			Ended: api.EndedWithdrawn, Reason: "wait ran out"},
		{Lease: "training-9d0e1f", UID: 1001, User: "alice", Group: "training", GPUIndexes: []int{2, 3}, SM: 100, MemBytes: 40 << 30, Procs: 1,
			Start: at.Add(5 * time.Minute), Granted: granted(7 * time.Minute), End: at.Add(9 * time.Minute), WaitMillis: 4200, Attempts: 3,
			Ended: api.EndedExhausted, Reason: "lease revoked: Xid 31 on GPU 2; no requeue attempts left (2 used)", PeakMemBytes: peak(39 << 30)},
	}}
}

func TestHistory(t *testing.T) {
	own := historyFixture()
	own.Records, own.OwnOnly = own.Records[1:2], true
	cut := historyFixture()
	cut.Truncated = true
	for _, tc := range []struct {
		name   string
		h      reply
		args   []string
		golden string
	}{
		{"table", ok(t, historyFixture()), []string{"history"}, "history.golden"},
		{"json", ok(t, historyFixture()), []string{"history", "--json"}, "history.json.golden"},
		{"non-admin view", ok(t, own), []string{"history"}, "history-own.golden"},
		{"truncated", ok(t, cut), []string{"history", "--user", "alice"}, "history-truncated.golden"},
		{"empty", ok(t, api.History{Records: []api.HistoryRecord{}}), []string{"history", "--group", "inference"}, "history-empty.golden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"GET " + api.PathHistory: tc.h})
			names := map[uint32]string{0: "root"}
			cfg := Config{LookupUser: func(uid uint32) string { return names[uid] }}
			r := mpsctl(t, cfg, nil, append([]string{"--socket", fake.socket}, tc.args...)...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
			}
			golden(t, tc.golden, r.stdout)
			reqs := fake.requests()
			if len(reqs) != 1 || reqs[0].method != http.MethodGet || reqs[0].path != api.PathHistory {
				t.Errorf("requests = %+v; want one GET %s", reqs, api.PathHistory)
			}
		})
	}
}

// The flags become the query mpsd reads: --since as a duration ago or a
// time; what mpsd would refuse is a usage error naming the flag's value.
func TestHistoryQuery(t *testing.T) {
	now := time.Date(2026, 12, 7, 22, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, since, user, group string
		want                     string // the query's encoding, or the error's words
		bad                      bool
	}{
		{"none", "", "", "", "", false},
		{"duration", "2h", "", "", "since=2026-12-07T20%3A00%3A00Z", false},
		{"time", "2026-12-01T08:00:00+01:00", "", "", "since=2026-12-01T07%3A00%3A00Z", false},
		{"user and group", "", "alice", "inference", "group=inference&user=alice", false},
		{"uid", "", "1001", "", "user=1001", false},
		{"negative", "-1h", "", "", "not negative", true},
		{"neither", "yesterday", "", "", `--since "yesterday": want a duration`, true},
		{"blank user", "", "al ice", "", "holds a space", true},
	} {
		q, err := historyQuery(tc.since, tc.user, tc.group, now)
		switch {
		case tc.bad && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v; want one saying %q", tc.name, err, tc.want)
		case !tc.bad && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.bad && q.Values().Encode() != tc.want:
			t.Errorf("%s: query %q; want %q", tc.name, q.Values().Encode(), tc.want)
		}
	}
}

// --user NAME is asked by the uid the name resolves to (mpsd matches
// uids; a record's name may be empty); a uid as given; a name this host
// does not know as it is.
func TestHistoryUserByUID(t *testing.T) {
	for _, tc := range []struct {
		name, user, query string
	}{
		{"name", "alice", "user=1001"},
		{"uid", "1002", "user=1002"},
		{"unknown name", "carol", "user=carol"},
		{"none", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(t, map[string]reply{"GET " + api.PathHistory: ok(t, api.History{Records: []api.HistoryRecord{}})})
			cfg := Config{LookupUser: func(uint32) string { return "" }, LookupUID: func(name string) (uint32, bool) {
				return 1001, name == "alice"
			}}
			args := []string{"--socket", fake.socket, "history"}
			if tc.user != "" {
				args = append(args, "--user", tc.user)
			}
			if r := mpsctl(t, cfg, nil, args...); r.code != ExitOK {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if reqs := fake.srv.Requests(); len(reqs) != 1 || reqs[0].Query != tc.query {
				t.Errorf("requests %+v; want one whose query is %q", reqs, tc.query)
			}
		})
	}
}
