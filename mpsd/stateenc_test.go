package mpsd

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

// fullState has every field of savedState and savedLease set (checked by
// TestStateEncodingIsJSONs), so that a field added to either and not to
// appendJSON fails the comparison.
func fullState() savedState {
	t0 := time.Date(2026, 12, 1, 16, 49, 18, 123456789, time.UTC)
	return savedState{
		Version: stateVersion,
		Leases: []savedLease{{
			ID: "l-1", Group: "inference", Instance: "inference/0", UID: 1001, SM: 30, MemBytes: 8 << 30,
			GPUs: 2, Priority: 1, Seq: 42, Attempt: 3, Requeue: 2, Spared: 1,
			Command: []string{"python", "serve.py", `--name="a<b>&c"`, "tab\there", "\x00\x1f\x7f", "nl\n", "\xff\xfe", "\u2028\u2029", "é😀"},
			Created: t0, Only: []int{0, 3}, JobID: "slurm-1234", RevokedFor: "server crashed (Xid 79)",
			AwaySince: t0.Add(time.Second), Ran: 2, Granted: t0.Add(2 * time.Second), Revoking: true, Spare: true, Queued: true, Adopted: true,
			EndCode: api.CodeCancelled, EndMessage: "lease l-1 cancelled by root (uid 0); its command was stopped",
			Procs: 3,
		}, {ID: "l-2", Group: "g", SM: 1, Attempt: 1, GPUs: 1, Created: t0.In(time.FixedZone("x", 3600))}},
		Quarantined:       []string{"g/0", "g/1"},
		QuarantineReasons: map[string]string{"g/1": "Xid 79", "g/0": "daemon \"hung\""},
		Drained:           []string{"g/2"},
		Drains:            map[string]savedDrain{"g/2": {Reason: "fan \"replacement\"\u2028", By: "root", At: t0}},
		ServerLogs:        map[string]int64{"g/0": 1 << 40, "a/1": 0},
		Servers:           map[string]map[int]int{"g/0": {100: 0, 99: 1001, 1000: 5}, "g/1": {}},
		Daemons:           map[string]savedDaemon{"g/0": {PID: 77, StartTime: 1 << 50}},
		Barred:            map[string][]savedBar{"g/0": {{UID: 1001, Until: t0.Add(time.Hour), Reason: "3 faults of uid 1001's clients in 10m0s; the last: \"Xid 13\""}, {UID: 1002, Until: t0, Reason: ""}}, "g/1": nil},
	}
}

func allFieldsSet(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		name := path + "." + v.Type().Field(i).Name
		if f.IsZero() {
			t.Errorf("%s is zero in fullState: set it, and encode it in appendJSON", name)
		}
	}
}

func assertSameAsJSON(t *testing.T, st savedState) {
	t.Helper()
	want, werr := json.Marshal(st)
	got, gerr := st.appendJSON(nil)
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("json.Marshal error %v, appendJSON error %v", werr, gerr)
	}
	if werr != nil {
		return
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("appendJSON differs from json.Marshal:\n got %s\nwant %s", got, want)
	}
	if _, err := decodeState(append(got, '\n')); err != nil && st.Version == stateVersion && validLeases(st) {
		t.Fatalf("decodeState of the encoding: %v", err)
	}
}

func validLeases(st savedState) bool {
	for _, l := range st.Leases {
		if l.Attempt < 1 || l.SM < 1 || l.SM > 100 || l.MemBytes < 0 || l.GPUs < 1 || l.Procs < 0 || l.Procs > l.SM {
			return false
		}
	}
	return true
}

func TestStateEncodingIsJSONs(t *testing.T) {
	st := fullState()
	allFieldsSet(t, reflect.ValueOf(st), "savedState")
	allFieldsSet(t, reflect.ValueOf(st.Leases[0]), "savedLease")
	allFieldsSet(t, reflect.ValueOf(st.Daemons["g/0"]), "savedDaemon")
	allFieldsSet(t, reflect.ValueOf(st.Barred["g/0"][0]), "savedBar")
	assertSameAsJSON(t, st)
	assertSameAsJSON(t, savedState{Version: stateVersion})
	assertSameAsJSON(t, savedState{Version: stateVersion, Leases: []savedLease{}})
	// A time json.Marshal refuses is refused.
	bad := fullState()
	bad.Leases[0].Created = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	assertSameAsJSON(t, bad)
	// A zone with seconds in its offset.
	odd := fullState()
	odd.Leases[1].Created = odd.Leases[1].Created.In(time.FixedZone("lmt", 3600+61))
	assertSameAsJSON(t, odd)
	// What a busy daemon holds: many leases, from the clock.
	r := rand.New(rand.NewPCG(1, 2))
	big := savedState{Version: stateVersion, Leases: []savedLease{}}
	for i := range 500 {
		big.Leases = append(big.Leases, savedLease{
			ID: "l-" + strings.Repeat("x", i%7), Group: "g", Instance: "g/1", UID: r.Uint32(), SM: 1 + r.IntN(100),
			MemBytes: r.Int64(), GPUs: 1, Seq: r.Uint64(), Attempt: 1, Created: time.Now(), Granted: time.Now(),
			Command: []string{"./infer", "--batch", strings.Repeat("é", i%5)}, Queued: i%2 == 0, Procs: i % 3,
		})
	}
	assertSameAsJSON(t, big)
}

func FuzzStateEncoding(f *testing.F) {
	f.Add("python", "job-1", "Xid 79", "g/0", int64(5), 7, uint32(1000), int64(0))
	f.Add("\xff<&>\u2028", "\x00", "\"\\", "", int64(-1), -3, uint32(0), int64(1<<62))
	f.Fuzz(func(t *testing.T, arg, job, reason, key string, n int64, pid int, uid uint32, nanos int64) {
		st := fullState()
		st.Leases[0].Command = []string{arg, arg + job}
		st.Leases[0].JobID = job
		st.Leases[0].RevokedFor = reason
		st.Leases[0].UID = uid
		st.Leases[0].MemBytes = n
		st.Leases[0].Created = time.Unix(0, nanos)
		st.QuarantineReasons[key] = reason
		st.ServerLogs[key] = n
		st.Servers[key] = map[int]int{pid: pid, pid + 1: 0}
		st.Daemons[key] = savedDaemon{PID: pid, StartTime: uint64(n)}
		st.Quarantined = append(st.Quarantined, key)
		assertSameAsJSON(t, st)
	})
}
