package mpsd

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mpsd/mpsd/api"
)

// The command a lease keeps for display is cut to maxKeptCommand bytes of
// its JSON encoding, with a marker; one that fits is kept as it is.
func TestKeptCommand(t *testing.T) {
	lt := strings.Repeat("<", api.MaxCommandBytes-len("/bin/true"))
	for _, tc := range []struct {
		name string
		argv []string
		want []string // nil: argv itself
	}{
		{"empty", nil, nil},
		{"short", []string{"./train", "--epochs", "3"}, nil},
		{"escapes that fit", []string{"sh", "-c", strings.Repeat("<", (maxKeptCommand-2-6)/6-3)}, nil},
		{"one long argument after the program", []string{"/bin/true", lt}, []string{"/bin/true", "…(+1-more-argument)"}},
		{"program too long on its own", []string{strings.Repeat("a", 4000)},
			[]string{strings.Repeat("a", maxKeptCommand-2-keptMarkerRoom-2-len("…")) + "…"}},
		{"program of escapes too long on its own", []string{strings.Repeat("<", 4000), "x"},
			[]string{strings.Repeat("<", (maxKeptCommand-2-keptMarkerRoom-2-len("…"))/6) + "…", "…(+1-more-argument)"}},
		{"many empty arguments", make([]string, 20000), append(make([]string, (maxKeptCommand-2-keptMarkerRoom+1)/3), "…(+19841-more-arguments)")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := keptCommand(tc.argv)
			want := tc.want
			if want == nil {
				want = tc.argv
				if len(got) > 0 && &got[0] != &tc.argv[0] {
					t.Errorf("a command that fits was copied")
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("keptCommand = %q (%d), want %q (%d)", trimArgs(got), len(got), trimArgs(want), len(want))
			}
			if n := len(appendJSONStrings(nil, got)); n > maxKeptCommand {
				t.Errorf("kept command takes %d bytes of JSON, more than %d", n, maxKeptCommand)
			}
		})
	}
}

func trimArgs(argv []string) []string {
	out := make([]string, 0, min(len(argv), 4))
	for i, a := range argv {
		if i == 3 {
			out = append(out, "...")
			break
		}
		out = append(out, truncate(a, 40))
	}
	return out
}

// The kept command never passes its bound, keeps every argument it keeps
// whole as it was, in order, and cuts nothing from one that fits; the
// length it computes is the encoder's.
func FuzzKeptCommand(f *testing.F) {
	f.Add([]byte("/bin/true\x00" + strings.Repeat("<", 700)))
	f.Add([]byte(strings.Repeat("\xff\xe2\x80\xa8&\x00", 200)))
	f.Add([]byte(strings.Repeat("\x00", 300)))
	f.Add([]byte("python\x00train.py\x00--lr\x000.1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		argv := strings.Split(string(b), "\x00")
		for _, a := range argv {
			enc := len(appendJSONString(nil, a))
			if n := jsonStringLen(a); n != enc {
				t.Fatalf("jsonStringLen(%q) = %d, the encoder writes %d", a, n, enc)
			}
			for _, limit := range []int{0, 2, enc - 1, enc, enc + 1, len(a)} {
				if n := jsonStringLenUpTo(a, limit); enc <= limit && n != enc || enc > limit && n <= limit {
					t.Fatalf("jsonStringLenUpTo(%q, %d) = %d, the encoder writes %d", a, limit, n, enc)
				}
			}
		}
		got := keptCommand(argv)
		n := len(appendJSONStrings(nil, got))
		if len(appendJSONStrings(nil, argv)) <= maxKeptCommand {
			if !slices.Equal(got, argv) {
				t.Fatalf("a command that fits was changed: %q", got)
			}
			return
		}
		if n > maxKeptCommand {
			t.Fatalf("kept %d bytes of JSON, bound %d", n, maxKeptCommand)
		}
		if len(got) == 0 || len(got) > len(argv)+1 {
			t.Fatalf("kept %d arguments of %d", len(got), len(argv))
		}
		whole := len(got)
		if last := got[len(got)-1]; strings.HasPrefix(last, "…(+") {
			whole--
		}
		for i := range whole {
			if got[i] == argv[i] {
				continue
			}
			// Only the first may be cut, and then it is a prefix of its
			// own, cut at a character, with an ellipsis.
			if i != 0 || !strings.HasSuffix(got[0], "…") || !strings.HasPrefix(argv[0], strings.TrimSuffix(got[0], "…")) {
				t.Fatalf("argument %d kept as %q, was %q", i, truncate(got[i], 60), truncate(argv[i], 60))
			}
			if p := strings.TrimSuffix(got[0], "…"); utf8.ValidString(argv[0]) && !utf8.ValidString(p) {
				t.Fatalf("cut inside a character: %q", p)
			}
		}
	})
}

// A state file written by an older mpsd, which kept commands whole, loads
// with them cut as a new request's is.
func TestDecodeStateCutsCommands(t *testing.T) {
	st := sampleState()
	st.Leases[0].Command = []string{"/bin/true", strings.Repeat("<", 16000)}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := keptCommand(st.Leases[0].Command); !slices.Equal(got.Leases[0].Command, want) {
		t.Errorf("loaded command %q, want %q", trimArgs(got.Leases[0].Command), want)
	}
}

// Whatever a tenant puts in its request, its lease's record stays within
// docLeaseRecord bytes (docs/architecture.md#the-state-file): the command
// kept, the longest job id of characters JSON spells in six, every GPU
// selected, a revocation's reason, every time and count set.
func TestLeaseRecordBounded(t *testing.T) {
	now := time.Now()
	only := make([]int, api.MaxGPUSelect)
	for i := range only {
		only[i] = 100 + i
	}
	l := savedLease{
		ID: "group-name-of-sixteen-0123456789ab", Group: "group-name-of-sixteen", Instance: "group-name-of-sixteen/0,1,2,3,4,5,6,7",
		UID: 1<<32 - 1, SM: 100, MemBytes: 1 << 62, GPUs: 8, Priority: -1 << 31, Seq: 1<<64 - 1,
		Attempt: 1 << 31, Requeue: 1 << 31, Spared: 1 << 30,
		Command: keptCommand([]string{strings.Repeat("<", api.MaxCommandBytes)}), Created: now, Only: only,
		JobID:      strings.Repeat("<", api.MaxJobIDLen),
		RevokedFor: "a client's fault on the instance's server (Xid 31 on GPU 7, GPU-01234567-89ab-cdef-0123-456789abcdef): its MPS server was restarted",
		AwaySince:  now, Ran: 1 << 31, Granted: now, Revoking: true, Spare: true, Queued: true, Adopted: true, Procs: 48,
	}
	b, err := l.appendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > docLeaseRecord {
		t.Errorf("a lease's record takes %d bytes, more than %d:\n%s", len(b), docLeaseRecord, b)
	}
}

// stateLease is a lease record for the store's tests.
func stateLease(id string, queued bool) savedLease {
	l := sampleState().Leases[0]
	l.ID, l.Queued = id, queued
	if queued {
		l.Instance = ""
	}
	return l
}

// newBoundStore is a store in a temporary directory whose snapshot is
// *st, written once (its first write, which compacts).
func newBoundStore(t *testing.T, st *savedState) *store {
	t.Helper()
	s := newStore(filepath.Join(t.TempDir(), "state.json"), func() savedState {
		c := *st
		c.Leases = slices.Clone(st.Leases)
		return c
	}, slog.New(slog.DiscardHandler))
	t.Cleanup(s.close)
	s.request()
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// A change that only queues or withdraws requests is not written at once:
// it waits queueDelay after the first such change for company, while a
// grant, a release or any other change is written at once and takes the
// queue's changes with it. Asked with a clock of the test's, so nothing
// here waits for time to pass.
func TestStoreQueueChangesWait(t *testing.T) {
	st := savedState{Version: stateVersion, Leases: []savedLease{stateLease("g-000000000001", false)}}
	s := newBoundStore(t, &st)
	t0 := time.Now()
	step := func(at time.Duration, wantWrote bool, wantAgain time.Duration) <-chan struct{} {
		t.Helper()
		ch := s.request()
		wrote, again, err := s.flushDue(t0.Add(at), false)
		if err != nil {
			t.Fatal(err)
		}
		if wrote != wantWrote || again != wantAgain {
			t.Fatalf("at %s: wrote %v, again in %s; want %v, %s", at, wrote, again, wantWrote, wantAgain)
		}
		if closed(ch) != wantWrote {
			t.Fatalf("at %s: waiter released %v, want %v", at, closed(ch), wantWrote)
		}
		return ch
	}
	records := func() uint64 {
		n, _ := s.writeCounts()
		return n
	}

	// Requests queued and withdrawn: put off, the wait counted from the
	// first, not renewed by each.
	st.Leases = append(st.Leases, stateLease("g-000000000002", true))
	first := step(0, false, time.Second)
	st.Leases = append(st.Leases, stateLease("g-000000000003", true))
	step(300*time.Millisecond, false, 700*time.Millisecond)
	st.Leases = st.Leases[:2]
	step(600*time.Millisecond, false, 400*time.Millisecond)
	// Nothing new at all waits the same way.
	step(700*time.Millisecond, false, 300*time.Millisecond)
	// Its time has come: written, every waiter released.
	step(time.Second, true, 0)
	if !closed(first) {
		t.Fatal("the first waiter was not released by the write that covers it")
	}
	if got := records(); got != 2 {
		t.Fatalf("%d writes, want 2 (the first and the queue's)", got)
	}

	// A queued request changed (its launcher away) waits too; a grant
	// is written at once, with it.
	st.Leases[1].AwaySince = t0
	step(2*time.Second, false, time.Second)
	st.Leases = append(st.Leases, stateLease("g-000000000004", false))
	step(2100*time.Millisecond, true, 0)
	// A release, a requeue, a running lease's change, intent, a daemon:
	// each at once.
	for _, change := range []func(){
		func() { st.Leases = slices.Delete(st.Leases, 2, 3) },            // released
		func() { st.Leases[0].Queued, st.Leases[0].Instance = true, "" }, // requeued
		func() { st.Leases[1].Queued, st.Leases[1].Instance = false, "g/0" },
		func() { st.Leases[1].Ran = 1 },
		func() { st.Drained = []string{"g/0"} },
		func() { st.Daemons = map[string]savedDaemon{"g/0": {PID: 7, StartTime: 9}} },
	} {
		change()
		step(3*time.Second, true, 0)
	}
	// A forced write (mpsd stopping) never waits.
	st.Leases = append(st.Leases, stateLease("g-000000000005", true))
	ch := s.request()
	if err := s.flush(); err != nil || !closed(ch) {
		t.Fatalf("flush: %v, released %v", err, closed(ch))
	}
	b, err := os.ReadFile(s.path + journalSuffix)
	if err != nil {
		t.Fatal(err)
	}
	recs := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	last, err := decodeState([]byte(recs[len(recs)-1] + "\n"))
	if err != nil || len(last.Leases) != len(st.Leases) {
		t.Fatalf("last record: %d leases, %v; want %d", len(last.Leases), err, len(st.Leases))
	}
}

// Whatever asks for writes, the store writes at most rate bytes a second
// on average after a burst: past it a write waits, a grant's included
// (its changes gather meanwhile), and the wait is what the bytes owed
// take at the rate. A forced write spends without waiting.
func TestStoreWriteBudget(t *testing.T) {
	st := savedState{Version: stateVersion}
	s := newBoundStore(t, &st)
	_, first := s.writeCounts()
	s.rate, s.burst = 1000, 1000
	s.tokens = 0
	t0 := time.Now()
	s.refilled = t0
	grant := func(n int) {
		st.Leases = append(st.Leases, stateLease("g-"+strings.Repeat("0", 11)+string(rune('0'+n)), false))
	}
	grant(1)
	ch := s.request()
	wrote, again, err := s.flushDue(t0, false)
	if err != nil || !wrote {
		t.Fatalf("a write with the budget at 0: wrote %v, %v", wrote, err)
	}
	_, after := s.writeCounts()
	size := after - first
	if !closed(ch) || s.tokens != -float64(size) || again != 0 {
		t.Fatalf("released %v, tokens %v (want -%d), again %s", closed(ch), s.tokens, size, again)
	}
	// The next grant waits until the bytes owed are earned back.
	grant(2)
	ch = s.request()
	owed := time.Duration(float64(size) / 1000 * float64(time.Second))
	wrote, again, _ = s.flushDue(t0, false)
	if wrote || closed(ch) || again != owed {
		t.Fatalf("over the budget: wrote %v, released %v, again in %s; want a wait of %s", wrote, closed(ch), again, owed)
	}
	wrote, again, _ = s.flushDue(t0.Add(owed/2), false)
	if rest := owed - owed/2; wrote || again < rest-time.Microsecond || again > rest+time.Microsecond {
		t.Fatalf("half way: wrote %v, again in %s; want a wait of %s", wrote, again, rest)
	}
	wrote, _, _ = s.flushDue(t0.Add(owed+time.Microsecond), false)
	if !wrote || !closed(ch) {
		t.Fatalf("once earned back: wrote %v, released %v", wrote, closed(ch))
	}
	// Forced: written at once, owing.
	grant(3)
	ch = s.request()
	if err := s.flush(); err != nil || !closed(ch) || s.tokens >= 0 {
		t.Fatalf("forced: %v, released %v, tokens %v", err, closed(ch), s.tokens)
	}
	// The budget's burst is all it keeps: a long quiet earns no more.
	s.refill(t0.Add(time.Hour))
	if s.tokens != s.burst {
		t.Fatalf("tokens %v after an hour, want the burst %v", s.tokens, s.burst)
	}
}

// The journal is bounded in bytes however large the state: past jmax
// (journalMaxBytes) a write compacts even before journalRecords records.
func TestJournalBoundedInBytes(t *testing.T) {
	st := savedState{Version: stateVersion}
	for i := range 40 {
		l := stateLease("g-"+strings.Repeat("0", 10)+string(rune('a'+i/26))+string(rune('a'+i%26)), false)
		l.Command = []string{strings.Repeat("x", 400)}
		st.Leases = append(st.Leases, l)
	}
	s := newBoundStore(t, &st)
	fi, err := os.Stat(s.path)
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()
	s.jbytes, s.jmax = 0, 3*size+size/2
	compactions := 0
	for i := range 2 * journalRecords {
		st.Drained = []string{"g/" + string(rune('a'+i%26))}
		s.request()
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
		jfi, err := os.Stat(s.path + journalSuffix)
		if err != nil {
			t.Fatal(err)
		}
		if jfi.Size() > s.jmax {
			t.Fatalf("journal of %d bytes after %d writes of %d, bound %d", jfi.Size(), i+1, size, s.jmax)
		}
		if jfi.Size() == 0 {
			compactions++
		}
	}
	if compactions < 2*journalRecords/4 {
		t.Errorf("%d compactions in %d writes with room for 3 records, want one every 4", compactions, 2*journalRecords)
	}
	if journalMaxBytes < journalMinBytes || journalMaxBytes > 64<<20 {
		t.Errorf("journalMaxBytes %d: want between journalMinBytes and the 64 MiB the documentation promises", journalMaxBytes)
	}
}

// Every field of a lease's record and of the state besides the leases is
// compared by changeOf: a field added to savedLease or savedState that
// it missed would let a change of it wait (or never be written).
func TestChangeOfSeesEveryField(t *testing.T) {
	base := savedState{Version: stateVersion, Leases: []savedLease{stateLease("g-000000000001", false), stateLease("g-000000000002", true)}}
	s := &store{}
	s.wrote(cloneState(base))

	lt := reflect.TypeOf(savedLease{})
	for i := range lt.NumField() {
		f := lt.Field(i)
		for _, queued := range []bool{false, true} {
			st := cloneState(base)
			l := &st.Leases[0]
			if queued {
				l = &st.Leases[1]
			}
			setOther(t, reflect.ValueOf(l).Elem().Field(i), f.Name)
			if l.ID != base.Leases[0].ID && l.ID != base.Leases[1].ID {
				continue // another lease, not a change of one
			}
			want := writeNow
			if queued && l.Queued {
				want = writeQueue
			}
			if got := s.changeOf(&st); got != want {
				t.Errorf("lease field %s changed on a lease queued=%v: %v, want %v", f.Name, queued, got, want)
			}
			if !queued && sameLease(&base.Leases[0], l) {
				t.Errorf("sameLease does not compare %s", f.Name)
			}
		}
	}
	stt := reflect.TypeOf(savedState{})
	for i := range stt.NumField() {
		f := stt.Field(i)
		if f.Name == "Leases" {
			continue
		}
		st := cloneState(base)
		setOther(t, reflect.ValueOf(&st).Elem().Field(i), f.Name)
		if got := s.changeOf(&st); got != writeNow {
			t.Errorf("state field %s changed: %v, want writeNow", f.Name, got)
		}
	}
	st := cloneState(base)
	if got := s.changeOf(&st); got != writeQueue {
		t.Errorf("nothing changed: %v, want writeQueue", got)
	}
}

func cloneState(st savedState) savedState {
	b, err := json.Marshal(st)
	if err != nil {
		panic(err)
	}
	var c savedState
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	// Times as they were, monotonic reading and all.
	for i := range c.Leases {
		c.Leases[i].Created = st.Leases[i].Created
	}
	return c
}

// setOther gives v a value other than the one it has.
func setOther(t *testing.T, v reflect.Value, name string) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Slice:
		e := reflect.New(v.Type().Elem()).Elem()
		if e.Kind() == reflect.String {
			e.SetString("x")
		}
		v.Set(reflect.Append(v, e))
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k := reflect.New(v.Type().Key()).Elem()
		k.SetString("g/9")
		e := reflect.New(v.Type().Elem()).Elem()
		switch e.Kind() {
		case reflect.Map:
			e.Set(reflect.MakeMap(e.Type()))
		case reflect.Slice:
			e.Set(reflect.MakeSlice(e.Type(), 1, 1))
		}
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if tm, ok := v.Interface().(time.Time); ok {
			v.Set(reflect.ValueOf(tm.Add(time.Second)))
			return
		}
		t.Fatalf("field %s: no other value for a %s", name, v.Type())
	default:
		t.Fatalf("field %s: no other value for a %s", name, v.Type())
	}
}
