package mpsd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
)

// histRecord is a record of uid's lease n that ended at minute n.
func histRecord(uid uint32, n int) api.HistoryRecord {
	at := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Minute)
	status := n % 10 // one digit: every line the same length
	return api.HistoryRecord{Lease: fmt.Sprintf("g-%d-%04d", uid, n), UID: uid, Group: "g", GPUIndexes: []int{0}, SM: 10, MemBytes: 1 << 30,
		Procs: 1, Start: at.Add(-time.Minute), End: at, Attempts: 1, Ended: api.EndedReleased, Reason: releaseCommandEnded, ExitStatus: &status}
}

// recordLine is r as one line of the file.
func recordLine(t *testing.T, r api.HistoryRecord) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// addAll adds recs and waits until each is on disk (or dropped).
func addAll(h *history, recs ...api.HistoryRecord) {
	var done []<-chan struct{}
	for _, r := range recs {
		done = append(done, h.add(r, nil))
	}
	for _, c := range done {
		<-c
	}
}

func recordIDs(recs []api.HistoryRecord) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Lease)
	}
	return out
}

// What a crash can leave at the end of the live file (a record cut short,
// or garbage where one was being written) is dropped at the start, the
// records before it kept; the next record follows them on a line of its
// own, and every reader sees whole records only.
func TestHistoryTornLastLineDropped(t *testing.T) {
	whole := append(recordLine(t, histRecord(1000, 1)), recordLine(t, histRecord(1001, 2))...)
	for _, tc := range []struct {
		name string
		tail string
	}{
		{"cut record", string(recordLine(t, histRecord(1000, 3))[:40])},
		{"garbage line", "\x00\x00\x00\x00\n"},
		{"nothing torn", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, historyLive)
			if err := os.WriteFile(path, append(bytes.Clone(whole), tc.tail...), 0o600); err != nil {
				t.Fatal(err)
			}
			var logb syncBuffer
			h, err := openHistory(dir, 0, slog.New(slog.NewTextHandler(&logb, nil)))
			if err != nil {
				t.Fatal(err)
			}
			h.start()
			addAll(h, histRecord(1000, 4))
			got, err := h.read(api.HistoryQuery{}, false, 0)
			h.close()
			if err != nil {
				t.Fatal(err)
			}
			if ids := strings.Join(recordIDs(got.Records), " "); ids != "g-1000-0001 g-1001-0002 g-1000-0004" {
				t.Errorf("records after a torn tail %q: %s; want the two before it and the new one", tc.tail, ids)
			}
			b, _ := os.ReadFile(path)
			if want := append(bytes.Clone(whole), recordLine(t, histRecord(1000, 4))...); !bytes.Equal(b, want) {
				t.Errorf("file after a torn tail %q:\n%s\nwant:\n%s", tc.tail, b, want)
			}
			if torn := strings.Contains(logb.String(), "torn last record"); torn != (tc.tail != "") {
				t.Errorf("torn tail %q logged %v; log:\n%s", tc.tail, torn, logb.String())
			}
		})
	}
}

// A reader meets a line being written (no newline yet) and skips it, and
// a line too long to be a record, and goes on.
func TestReadHistorySkipsWhatIsNoRecord(t *testing.T) {
	var b bytes.Buffer
	b.Write(recordLine(t, histRecord(1000, 1)))
	b.WriteString(strings.Repeat("x", maxHistoryLine+10) + "\n")
	b.WriteString("{}\n")
	b.Write(recordLine(t, histRecord(1000, 2)))
	b.Write(recordLine(t, histRecord(1000, 3))[:30])
	var got []api.HistoryRecord
	if err := readHistory(&b, func(r api.HistoryRecord) { got = append(got, r) }); err != nil {
		t.Fatal(err)
	}
	if ids := strings.Join(recordIDs(got), " "); ids != "g-1000-0001 g-1000-0002" {
		t.Errorf("records read: %s; want the two whole ones", ids)
	}
}

// The live file never passes its bound: the record that would pass it
// goes into a new one, the old one kept as history.1.jsonl (replacing the
// one before); the history reads both, oldest first.
func TestHistoryRotatesAtItsBound(t *testing.T) {
	dir := t.TempDir()
	line := int64(len(recordLine(t, histRecord(1000, 1))))
	bound := 10 * line
	h, err := openHistory(dir, bound, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	defer h.close()
	// Ten uids, two records each, then five more: the bound of ten lines
	// is passed after ten, and after twenty.
	var recs []api.HistoryRecord
	for i := range 25 {
		recs = append(recs, histRecord(uint32(1000+i%10), i+1))
	}
	for _, r := range recs {
		addAll(h, r) // one by one: each batch its own write
	}
	for _, name := range []string{historyLive, historyRotated} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > bound {
			t.Errorf("%s is %d bytes; bound %d", name, fi.Size(), bound)
		}
	}
	got, err := h.read(api.HistoryQuery{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(recordIDs(recs[10:]), " "); strings.Join(recordIDs(got.Records), " ") != want {
		t.Errorf("records after two rotations: %s; want the last 15, oldest first: %s", recordIDs(got.Records), want)
	}
	if n := h.written.Load(); n != 25 {
		t.Errorf("mpsd_history_records_total %d; want 25", n)
	}
}

// One uid's flood of records stops at its share of the live file's bound
// (a quarter): the rest of its records are dropped, counted and logged
// once until the file rotates, and another uid's records after the flood
// are all kept. After the rotation the uid has its share again.
func TestHistoryUserShare(t *testing.T) {
	dir := t.TempDir()
	line := int64(len(recordLine(t, histRecord(1000, 1))))
	bound := 40 * line // a share of 10 records
	var logb syncBuffer
	h, err := openHistory(dir, bound, slog.New(slog.NewTextHandler(&logb, nil)))
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	defer h.close()
	var flood []api.HistoryRecord
	for i := range 50 {
		flood = append(flood, histRecord(1000, i+1))
	}
	addAll(h, flood...)
	var others []api.HistoryRecord
	for i := range 5 {
		others = append(others, histRecord(1001, 100+i))
	}
	addAll(h, others...)
	got, err := h.read(api.HistoryQuery{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	per := map[uint32]int{}
	for _, r := range got.Records {
		per[r.UID]++
	}
	if per[1000] != 10 || per[1001] != 5 {
		t.Errorf("records kept per uid: %v; want uid 1000's share (10) and all 5 of uid 1001", per)
	}
	if n := h.dropShare.Load(); n != 40 {
		t.Errorf("records dropped for their uid's share: %d; want 40", n)
	}
	if n := strings.Count(logb.String(), "take its share"); n != 1 {
		t.Errorf("%d log lines of uid 1000 over its share; want 1:\n%s", n, logb.String())
	}
	// Others fill the file until it rotates: uid 1000 is recorded again,
	// and logged again when over its share once more.
	var fill []api.HistoryRecord
	for i := range 30 {
		fill = append(fill, histRecord(uint32(2000+i), 200+i))
	}
	addAll(h, fill...)
	addAll(h, histRecord(1000, 500))
	got, err = h.read(api.HistoryQuery{User: "1000", Since: histRecord(0, 500).End}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != 1 {
		t.Errorf("uid 1000's record after the rotation: %v; want it kept", recordIDs(got.Records))
	}
}

// A query selects by end time, uid (or name) and group; a non-admin's
// only its own records; at most api.MaxHistoryRecords, the newest.
func TestHistoryRead(t *testing.T) {
	dir := t.TempDir()
	h, err := openHistory(dir, 1<<30, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	defer h.close()
	a, b, c := histRecord(1000, 1), histRecord(1001, 2), histRecord(1000, 3)
	a.User, c.Group = "alice", "other"
	addAll(h, a, b, c)
	for _, tc := range []struct {
		name string
		q    api.HistoryQuery
		own  bool
		uid  uint32
		want string
	}{
		{"all", api.HistoryQuery{}, false, 0, "g-1000-0001 g-1001-0002 g-1000-0003"},
		{"since", api.HistoryQuery{Since: b.End}, false, 0, "g-1001-0002 g-1000-0003"},
		{"uid", api.HistoryQuery{User: "1000"}, false, 0, "g-1000-0001 g-1000-0003"},
		{"name", api.HistoryQuery{User: "alice"}, false, 0, "g-1000-0001"},
		{"group", api.HistoryQuery{Group: "other"}, false, 0, "g-1000-0003"},
		{"own", api.HistoryQuery{}, true, 1001, "g-1001-0002"},
		{"own asks for another", api.HistoryQuery{User: "1000"}, true, 1001, ""},
	} {
		got, err := h.read(tc.q, tc.own, tc.uid)
		if err != nil {
			t.Fatal(err)
		}
		if ids := strings.Join(recordIDs(got.Records), " "); ids != tc.want || got.OwnOnly != tc.own {
			t.Errorf("%s: %q own_only %v; want %q own_only %v", tc.name, ids, got.OwnOnly, tc.want, tc.own)
		}
	}
	var many []api.HistoryRecord
	for i := range api.MaxHistoryRecords + 5 {
		many = append(many, histRecord(3000, 10+i))
	}
	for c := range slices.Chunk(many, 1000) {
		addAll(h, c...)
	}
	got, err := h.read(api.HistoryQuery{User: "3000"}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != api.MaxHistoryRecords || !got.Truncated || got.Records[0].Lease != many[5].Lease {
		t.Errorf("%d records, truncated %v, first %s; want the newest %d, truncated", len(got.Records), got.Truncated, got.Records[0].Lease, api.MaxHistoryRecords)
	}
}

// A record added once the history is closed is not written, and its
// waiter is not left waiting.
func TestHistoryAddAfterClose(t *testing.T) {
	h, err := openHistory(t.TempDir(), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	h.close()
	ran := false
	<-h.add(histRecord(1000, 1), func() { ran = true })
	if !ran || h.dropPending.Load() != 1 {
		t.Errorf("record added after close: after ran %v, dropped %d; want the line written and 1 dropped", ran, h.dropPending.Load())
	}
}

// A lease's record says what the history needs of its life: its GPUs
// while it runs or after it left them, its wait over every attempt (the
// current one too when it ends queued), whether it ran, its peak memory
// and its command's status.
func TestLeaseHistoryRecord(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	peak, status := uint64(3<<30), 0
	in := &instance{gpus: []gpu.Info{{Index: 2}, {Index: 3}}}
	for _, tc := range []struct {
		name  string
		l     *lease
		gpus  string
		wait  int64
		ran   bool
		peak  bool
		exit  bool
		tries int
	}{
		{"withdrawn queued", &lease{created: at(0), queuedAt: at(0), attempt: 1}, "[]", 10000, false, false, false, 1},
		{"released", &lease{created: at(0), queuedAt: at(0), grantedAt: at(2), waited: 2 * time.Second, attempt: 1, inst: in, memPeak: &peak, exitStatus: &status},
			"[2 3]", 2000, true, true, true, 1},
		{"requeued, ends queued", &lease{created: at(0), queuedAt: at(6), grantedAt: at(2), waited: 2 * time.Second, attempt: 2, lastGPUs: []int{1}},
			"[1]", 6000, true, false, false, 2},
	} {
		tc.l.req.Mem = 1 << 30
		r := tc.l.historyLocked(api.EndedReleased, "why", at(10))
		if fmt.Sprint(r.GPUIndexes) != tc.gpus || r.WaitMillis != tc.wait || (r.Granted != nil) != tc.ran ||
			(r.PeakMemBytes != nil) != tc.peak || (r.ExitStatus != nil) != tc.exit || r.Attempts != tc.tries || !r.End.Equal(at(10)) {
			t.Errorf("%s: %+v; want gpus %s, wait %dms, ran %v, peak %v, exit %v, attempts %d", tc.name, r, tc.gpus, tc.wait, tc.ran, tc.peak, tc.exit, tc.tries)
		}
	}
}

// A write that fails drops its records (counted, logged once) without
// holding up the ends waiting for it; the next write reopens the file and
// records again.
func TestHistoryWriteFailure(t *testing.T) {
	dir := t.TempDir()
	var logb syncBuffer
	h, err := openHistory(dir, 0, slog.New(slog.NewTextHandler(&logb, nil)))
	if err != nil {
		t.Fatal(err)
	}
	// The writer's file swapped for one it cannot write (as a disk that
	// turned read-only would answer).
	_ = h.f.Close()
	if h.f, err = os.Open(filepath.Join(dir, historyLive)); err != nil {
		t.Fatal(err)
	}
	h.start()
	defer h.close()
	ran := 0
	for _, r := range []api.HistoryRecord{histRecord(1000, 1), histRecord(1001, 2)} {
		<-h.add(r, func() { ran++ })
	}
	if h.dropWrite.Load() != 1 || ran != 2 || !strings.Contains(logb.String(), "cannot be written") {
		t.Errorf("after a failed write: %d dropped, %d end lines written, log:\n%s; want the first dropped and told, both ends reported", h.dropWrite.Load(), ran, logb.String())
	}
	got, err := h.read(api.HistoryQuery{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ids := strings.Join(recordIDs(got.Records), " "); ids != "g-1001-0002" || !strings.Contains(logb.String(), "written again") {
		t.Errorf("records after the file was reopened: %q; want the second, and the recovery logged", ids)
	}
}
