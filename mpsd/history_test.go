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
		c, _ := h.add(r, nil)
		done = append(done, c)
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
	if err := readHistory(&b, nil, func(r api.HistoryRecord) { got = append(got, r) }); err != nil {
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

// One uid's flood of records stays within its share of the live file's
// bound (a quarter): its oldest records are removed to make room for its
// newest, counted and logged once until the file rotates; another uid's
// records after the flood are all kept, and the flooding uid (root's, as
// every pod lease of the device plugin is) goes on being recorded however
// many it ends. After the rotation the uid has its share again.
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
	// Within its share in the file itself, whatever a reader shows.
	shareOf := func(uid uint32) (n int64) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, historyLive))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.SplitAfter(b, []byte("\n")) {
			var r api.HistoryRecord
			if json.Unmarshal(line, &r) == nil && r.UID == uid {
				n += int64(len(line))
			}
		}
		return n
	}
	if n := shareOf(1000); n > bound/historyUserShare {
		t.Errorf("uid 1000's records take %d bytes of the live file; its share is %d", n, bound/historyUserShare)
	}
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
	if ids := strings.Join(recordIDs(got.Records[:10]), " "); ids != strings.Join(recordIDs(flood[40:]), " ") {
		t.Errorf("uid 1000's records kept: %s; want its newest 10", ids)
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

// Root ends thousands of leases (the device plugin's pods are all its):
// its newest are always recorded, within its share, and the other uids'
// records between them are all kept.
func TestHistoryRootKeepsBeingRecorded(t *testing.T) {
	dir := t.TempDir()
	line := int64(len(recordLine(t, histRecord(0, 1))))
	bound := 40 * line // a share of 10 records
	h, err := openHistory(dir, bound, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	defer h.close()
	var others []api.HistoryRecord
	for i := range 3000 {
		r := histRecord(0, i+1)
		if i%1000 == 999 {
			r = histRecord(1001, i+1)
			others = append(others, r)
		}
		addAll(h, r)
	}
	last := histRecord(0, 3001)
	addAll(h, last)
	got, err := h.read(api.HistoryQuery{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	var root []string
	for _, r := range got.Records {
		if r.UID == 0 {
			root = append(root, r.Lease)
		}
	}
	// Its newest: more than half its share (a compaction leaves half), at
	// most all of it.
	var want []string
	for i := 3001; len(want) < len(root); i-- {
		if i%1000 != 0 {
			want = append(want, histRecord(0, i).Lease)
		}
	}
	slices.Reverse(want)
	if len(root) <= 5 || len(root) > 10 || !slices.Equal(root, want) {
		t.Errorf("root's records: %v; want its newest, 6 to 10 of them, ending with %s", root, last.Lease)
	}
	var kept []api.HistoryRecord
	for _, r := range got.Records {
		if r.UID == 1001 {
			kept = append(kept, r)
		}
	}
	if !slices.Equal(recordIDs(kept), recordIDs(others)) {
		t.Errorf("uid 1001's records: %v; want all of them: %v", recordIDs(kept), recordIDs(others))
	}
	if n, want := h.dropShare.Load(), uint64(3001-len(others)-len(root)); n != want {
		t.Errorf("root's records removed for its share: %d; want all but those kept (%d)", n, want)
	}
}

// A query that matches many more records than it answers with keeps the
// newest, oldest first, across both files, copying each record a bounded
// number of times: its cost is what it reads, not what it reads times
// what it keeps.
func TestHistoryReadKeepsNewestLinearly(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
		adds int
	}{
		{"under", 5, 3},
		{"exactly", 5, 5},
		{"wrapped", 5, 12},
		{"over twice the answer", api.MaxHistoryRecords, 2*api.MaxHistoryRecords + 123},
	} {
		n := newestRecords{max: tc.max}
		var all []api.HistoryRecord
		for i := range tc.adds {
			r := histRecord(1000, i+1)
			all = append(all, r)
			n.add(r)
		}
		got := n.records()
		want := all[max(tc.adds-tc.max, 0):]
		if !slices.Equal(recordIDs(got), recordIDs(want)) || n.truncated != (tc.adds > tc.max) {
			t.Errorf("%s: %d records from %s, truncated %v; want the newest %d, oldest first", tc.name, len(got), got[0].Lease, n.truncated, len(want))
		}
		if n.copies > tc.adds+tc.max {
			t.Errorf("%s: %d records copied for %d added; want at most %d", tc.name, n.copies, tc.adds, tc.adds+tc.max)
		}
	}
	// Through read, the newest of two files.
	dir := t.TempDir()
	h, err := openHistory(dir, 1<<30, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	defer h.close()
	var many []api.HistoryRecord
	for i := range 2*api.MaxHistoryRecords + 123 {
		many = append(many, histRecord(3000, i+1))
	}
	for c := range slices.Chunk(many, 1000) {
		addAll(h, c...)
	}
	// The writer is idle (each record added was written): the test may
	// rotate as the writer would.
	if err := h.rotate(); err != nil {
		t.Fatal(err)
	}
	more := []api.HistoryRecord{histRecord(3000, len(many)+1), histRecord(3000, len(many)+2)}
	addAll(h, more...)
	many = append(many, more...)
	got, err := h.read(api.HistoryQuery{User: "3000"}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Truncated || !slices.Equal(recordIDs(got.Records), recordIDs(many[len(many)-api.MaxHistoryRecords:])) {
		t.Errorf("%d records from %s, truncated %v; want the newest %d of both files, oldest first", len(got.Records), got.Records[0].Lease, got.Truncated, api.MaxHistoryRecords)
	}
}

// A history file that cannot be opened (here a symlink, which it never
// follows) leaves the history without a file rather than stopping mpsd:
// its records are dropped and counted, mpsd_history_writable is 0, and
// once the file can be opened the writer opens it at its next write.
func TestHistoryOpenFailure(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, historyLive)
	if err := os.Symlink(filepath.Join(dir, "elsewhere"), live); err != nil {
		t.Fatal(err)
	}
	var logb syncBuffer
	h, err := openHistory(dir, 0, slog.New(slog.NewTextHandler(&logb, nil)))
	if err == nil || h == nil || h.writable.Load() {
		t.Fatalf("open over a symlink: %v, writable %v; want an error and a history that is not writable", err, h != nil && h.writable.Load())
	}
	h.start()
	defer h.close()
	addAll(h, histRecord(1000, 1))
	if h.dropWrite.Load() != 1 || h.writable.Load() {
		t.Errorf("record while the file cannot be opened: %d dropped, writable %v; want 1, false", h.dropWrite.Load(), h.writable.Load())
	}
	if err := os.Remove(live); err != nil {
		t.Fatal(err)
	}
	addAll(h, histRecord(1001, 2))
	got, err := h.read(api.HistoryQuery{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ids := strings.Join(recordIDs(got.Records), " "); ids != "g-1001-0002" || !h.writable.Load() || !strings.Contains(logb.String(), "written again") {
		t.Errorf("records once the file can be opened: %q, writable %v; want the second, and the recovery logged:\n%s", ids, h.writable.Load(), logb.String())
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
// waiter is not left waiting; add neither runs its end's line nor logs
// (its caller holds Daemon.mu): it says dropped, and dropLine gives the
// drop's line at most once a period, with the count since the last.
func TestHistoryAddAfterClose(t *testing.T) {
	var logb syncBuffer
	h, err := openHistory(t.TempDir(), 0, slog.New(slog.NewTextHandler(&logb, nil)))
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	h.close()
	ran := false
	done, dropped := h.add(histRecord(1000, 1), func() { ran = true })
	<-done
	if ran || !dropped || h.dropPending.Load() != 1 || logb.String() != "" {
		t.Errorf("record added after close: after ran %v, dropped %v (%d counted), log %q; want it dropped, counted, nothing run or logged", ran, dropped, h.dropPending.Load(), logb.String())
	}
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		adds    int
		at      time.Time
		want    bool
		dropped uint64
	}{
		{"first", 0, t0, true, 1},
		{"within the period", 3, t0.Add(historyDropLogEvery / 2), false, 0},
		{"after it, the count since", 0, t0.Add(historyDropLogEvery), true, 3},
		{"none since", 0, t0.Add(3 * historyDropLogEvery), false, 0},
	} {
		for i := range tc.adds {
			_, _ = h.add(histRecord(1000, 2+i), nil)
		}
		attrs, ok := h.dropLine(tc.at)
		if ok != tc.want || (ok && attrs[1] != tc.dropped) {
			t.Errorf("%s: line %v %v; want %v with %d dropped", tc.name, ok, attrs, tc.want, tc.dropped)
		}
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
		done, _ := h.add(r, func() { ran++ })
		<-done
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

// A compaction after a failed write (the file closed, a torn tail left)
// drops the torn tail first: every line of the compacted file is a
// record, and the uid's newest are kept.
func TestHistoryCompactAfterTornTail(t *testing.T) {
	dir := t.TempDir()
	line := int64(len(recordLine(t, histRecord(1000, 1))))
	h, err := openHistory(dir, 40*line, slog.New(slog.DiscardHandler)) // a share of 10 records
	if err != nil {
		t.Fatal(err)
	}
	var recs []api.HistoryRecord
	for i := range 10 {
		recs = append(recs, histRecord(1000, i+1))
	}
	h.start()
	defer h.close()
	addAll(h, recs...)
	// As a failed write leaves it (the writer idle: each record added
	// was written).
	if _, err := h.f.Write([]byte(`{"lease":"g-1000-99`)); err != nil {
		t.Fatal(err)
	}
	_ = h.f.Close()
	h.f = nil
	next := histRecord(1000, 11)
	addAll(h, next)
	b, err := os.ReadFile(filepath.Join(dir, historyLive))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range bytes.SplitAfter(b, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var r api.HistoryRecord
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatalf("line %q of the compacted file is no record: %v", l, err)
		}
		ids = append(ids, r.Lease)
	}
	if want := recordIDs(append(recs[5:], next)); !slices.Equal(ids, want) {
		t.Errorf("compacted file: %v; want uid 1000's newest: %v", ids, want)
	}
}

// recordUID reads a record's uid as a decode of the line would, whatever
// its strings hold (a job id or a reason that spells a "uid" key), and
// finds none in a line that is no record.
func FuzzRecordUID(f *testing.F) {
	f.Add(uint32(1001), `x`, `its command ended`)
	f.Add(uint32(0), `"uid":7`, `{"uid":9}`)
	f.Add(uint32(4294967295), `\"uid\":1`, "\"uid\":12\n")
	f.Fuzz(func(t *testing.T, uid uint32, job, reason string) {
		r := histRecord(uid, 1)
		r.JobID, r.Reason = job, reason
		line := append(recordLine(t, r), '\n')
		if got, ok := recordUID(line); !ok || got != uid {
			t.Fatalf("recordUID(%s) = %d, %v; want %d", line, got, ok, uid)
		}
	})
}

func TestRecordUIDOfNoRecord(t *testing.T) {
	for _, line := range []string{"", "\n", "{\"lease\":\"g-1\",\"ui", "garbage\n"} {
		if u, ok := recordUID([]byte(line)); ok {
			t.Errorf("recordUID(%q) = %d, true; want false", line, u)
		}
	}
}
