package mpsd

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func sampleState() savedState {
	return savedState{Version: stateVersion, Leases: []savedLease{{
		ID: "inference-0123456789ab", Group: "inference", Instance: "inference/0", UID: 1001,
		SM: 30, MemBytes: 8 << 30, GPUs: 1, Seq: 7, Attempt: 2, Requeue: 3, Procs: 4,
		Command: []string{"./infer", "--model", "x"}, Created: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
	}}}
}

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := sampleState()
	s := newStore(filepath.Join(dir, "state.json"), func() savedState { return want }, slog.New(slog.DiscardHandler))
	defer s.close()
	done := s.request()
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("request's channel not closed by the flush that wrote it")
	}
	got, err := s.load()
	if err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Errorf("loaded %s, want %s", gb, wb)
	}
	// No temporary file is left next to it: the state file and its
	// journal only.
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"state.json", "state.json" + journalSuffix}) {
		t.Errorf("directory holds %v, want only the state file and its journal", names)
	}
	// A flush with nothing requested writes nothing.
	if err := os.Remove(s.path); err != nil {
		t.Fatal(err)
	}
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("flush without a request wrote the file: %v", err)
	}
	if fi, err := os.Stat(s.path + journalSuffix); err != nil || fi.Size() != 0 {
		t.Errorf("flush without a request wrote the journal: %v, %v", fi, err)
	}
	s.close()
}

// Writes after the first append one record each to the journal (the state
// file stays as the first wrote it), and load takes the journal's last
// whole record: past a record a crash cut short, and over a state file
// that is unreadable (moved aside all the same). Past its bound a write
// compacts: the state file is the state again and the journal is empty.
func TestStoreJournal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	n := 0
	snap := func() savedState {
		st := sampleState()
		st.Drained = []string{fmt.Sprintf("g/%d", n)}
		return st
	}
	s := newStore(path, snap, slog.New(slog.DiscardHandler))
	defer s.close()
	write := func() {
		t.Helper()
		n++
		s.request()
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
	}
	drained := func(st savedState) string { return strings.Join(st.Drained, ",") }
	load := func() savedState {
		t.Helper()
		st, err := newStore(path, nil, slog.New(slog.DiscardHandler)).load()
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	write() // compacts: the state file
	first, _ := os.ReadFile(path)
	for range 3 {
		write()
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, first) {
		t.Errorf("the state file changed on a write that should append: %s", b)
	}
	jb, _ := os.ReadFile(path + journalSuffix)
	if c := bytes.Count(jb, []byte("\n")); c != 3 {
		t.Errorf("journal holds %d records, want 3", c)
	}
	if got := drained(load()); got != "g/4" {
		t.Errorf("loaded drains %q, want the last write's g/4", got)
	}
	// A record cut short (mpsd killed in the middle of the write).
	f, err := os.OpenFile(path+journalSuffix, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"version":1,"leases":[],"drained":["g/9`); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if got := drained(load()); got != "g/4" {
		t.Errorf("loaded drains %q past a torn record, want g/4", got)
	}
	// An unreadable state file: the journal has the state.
	if err := os.WriteFile(path, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := drained(load()); got != "g/4" {
		t.Errorf("loaded drains %q over a bad state file, want the journal's g/4", got)
	}
	if aside, _ := filepath.Glob(path + ".bad-*"); len(aside) != 1 {
		t.Errorf("bad state file not moved aside: %v", aside)
	}
	// Compaction: with a bound of two records, the write that would make
	// a third replaces the state file and empties the journal (cutting
	// the torn record off too).
	s.jbytes, s.jrecords = 0, 2
	s.jbroken = true // as a failed write leaves it
	write()
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), `"g/5"`) {
		t.Errorf("after a compaction the state file holds %s, want g/5", b)
	}
	if jb, _ := os.ReadFile(path + journalSuffix); len(jb) != 0 {
		t.Errorf("after a compaction the journal holds %q", jb)
	}
	write()
	write()
	if jb, _ := os.ReadFile(path + journalSuffix); bytes.Count(jb, []byte("\n")) != 2 {
		t.Errorf("journal holds %q, want two records", jb)
	}
	write() // past the bound: compacts
	if jb, _ := os.ReadFile(path + journalSuffix); len(jb) != 0 {
		t.Errorf("past its bound the journal holds %q, want it compacted", jb)
	}
	if got := drained(load()); got != "g/8" {
		t.Errorf("loaded drains %q, want g/8", got)
	}
}

func TestStoreLoad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string // "" means no file
		leases  int
		err     string
	}{
		{"missing file is an empty state", "", 0, ""},
		{"with drains and quarantines", `{"version":1,"leases":[],"quarantined":["g/0"],"drained":["g/1"]}`, 0, ""},
		{"valid", `{"version":1,"leases":[{"id":"g-1","group":"g","instance":"g/0","uid":1,"sm":10,"mem_bytes":1048576,"gpus":1,"priority":0,"seq":1,"attempt":1,"requeue":3,"created":"2026-11-29T12:00:00Z"}]}`, 1, ""},
		{"not JSON", `{"version":1,`, 0, "unexpected EOF"},
		{"unknown field", `{"version":1,"leases":[],"extra":true}`, 0, "unknown field"},
		{"newer version", `{"version":2,"leases":[]}`, 0, "version 2"},
		{"trailing data", `{"version":1,"leases":[]} {}`, 0, "data after"},
		{"bad lease id", `{"version":1,"leases":[{"id":"../x","group":"g","instance":"g/0","uid":1,"sm":10,"mem_bytes":1,"gpus":1,"attempt":1}]}`, 0, "lease"},
		{"procs", `{"version":1,"leases":[{"id":"g-1","group":"g","instance":"g/0","uid":1,"sm":10,"mem_bytes":1048576,"gpus":1,"attempt":1,"procs":4}]}`, 1, ""},
		{"procs over sm", `{"version":1,"leases":[{"id":"g-1","group":"g","instance":"g/0","uid":1,"sm":3,"mem_bytes":1,"gpus":1,"attempt":1,"procs":4}]}`, 0, "out of range"},
		{"sm out of range", `{"version":1,"leases":[{"id":"g-1","group":"g","instance":"g/0","uid":1,"sm":0,"mem_bytes":1,"gpus":1,"attempt":1}]}`, 0, "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.json")
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s := newStore(path, nil, slog.New(slog.DiscardHandler))
			st, err := s.load()
			if tc.err == "" {
				if err != nil || len(st.Leases) != tc.leases {
					t.Fatalf("load = %d leases, %v; want %d, nil", len(st.Leases), err, tc.leases)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("load error %v, want one containing %q", err, tc.err)
			}
			if len(st.Leases) != 0 {
				t.Errorf("a bad file gave %d leases", len(st.Leases))
			}
			// The bad file is kept aside for a person, never deleted.
			aside, _ := filepath.Glob(path + ".bad-*")
			if len(aside) != 1 {
				t.Fatalf("bad state file not moved aside: %v", aside)
			}
			if b, _ := os.ReadFile(aside[0]); string(b) != tc.content {
				t.Errorf("moved-aside file holds %q", b)
			}
		})
	}
}

func FuzzDecodeState(f *testing.F) {
	b, _ := json.Marshal(sampleState())
	f.Add(b)
	f.Add([]byte(`{"version":1,"leases":[]}`))
	f.Add([]byte(`{"version":1,"leases":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeState(data)
		if err != nil {
			return
		}
		// What it accepts re-encodes and decodes to the same.
		again, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		st2, err := decodeState(again)
		if err != nil {
			t.Fatalf("re-encoded state refused: %v\n%s", err, again)
		}
		if len(st2.Leases) != len(st.Leases) {
			t.Fatalf("round trip changed the leases")
		}
	})
}

// run prepares the temporary file of the next write once a write is done,
// so the next grant's write does not create one; that write uses it, and
// run removes the one it prepared when it stops.
func TestStorePreparesNextTemp(t *testing.T) {
	dir := t.TempDir()
	s := newStore(filepath.Join(dir, "state.json"), sampleState, slog.New(slog.DiscardHandler))
	s.jbytes, s.jrecords = 0, 0 // every write compacts
	defer s.close()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.run(ctx)
	}()
	defer func() {
		cancel()
		<-stopped
	}()
	temps := func() []string {
		m, err := filepath.Glob(filepath.Join(dir, tempPattern))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	waitOneTemp := func() string {
		deadline := time.Now().Add(waitFor)
		for {
			if m := temps(); len(m) == 1 {
				return m[0]
			} else if len(m) > 1 {
				t.Fatalf("temporary files %v, want at most one", m)
			}
			if time.Now().After(deadline) {
				t.Fatalf("no temporary file prepared within %s", waitFor)
			}
			time.Sleep(time.Millisecond)
		}
	}
	used := ""
	for i := range 3 {
		ch := s.request()
		select {
		case <-ch:
		case <-time.After(waitFor):
			t.Fatalf("write %d not done within %s", i, waitFor)
		}
		prepared := waitOneTemp()
		if i > 0 {
			if prepared == used {
				t.Fatalf("write %d left the prepared %s where it was: it did not use it", i, prepared)
			}
		}
		used = prepared
		b, err := os.ReadFile(s.path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeState(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Leases) != 1 || got.Leases[0].ID != sampleState().Leases[0].ID {
			t.Fatalf("write %d: state %+v", i, got)
		}
	}
	cancel()
	<-stopped
	if m := temps(); len(m) != 0 {
		t.Errorf("temporary files %v left after run stopped", m)
	}
}

// load removes the temporary files a previous mpsd left, and only them.
func TestStoreLoadRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	s := newStore(path, sampleState, slog.New(slog.DiscardHandler))
	defer s.close()
	s.request()
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, ".state-12345.tmp")
	other := filepath.Join(dir, "instance-id")
	for _, p := range []string{stale, other} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.load(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale %s still there (stat: %v)", stale, err)
	}
	for _, p := range []string{path, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v; load removed what is not its temporary file", p, err)
		}
	}
}

// TestSortLeases: the store's sort of a state's leases (outside
// Daemon.mu, along the cycles of a sorted index) puts every record, whole,
// in id order, for every length and starting order, reusing its scratch.
func TestSortLeases(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var order []int32
	for n := range 40 {
		for range 20 {
			leases := make([]savedLease, n)
			for i := range leases {
				leases[i] = savedLease{ID: fmt.Sprintf("g-%06x", rng.IntN(1<<20)), Attempt: i}
			}
			want := slices.Clone(leases)
			slices.SortStableFunc(want, func(a, b savedLease) int { return strings.Compare(a.ID, b.ID) })
			order = sortLeases(leases, order)
			if !slices.IsSortedFunc(leases, func(a, b savedLease) int { return strings.Compare(a.ID, b.ID) }) {
				t.Fatalf("n=%d: not sorted: %v", n, leases)
			}
			// The same records, each whole (an id with its own attempt).
			got := slices.Clone(leases)
			slices.SortFunc(got, func(a, b savedLease) int { return cmp.Or(strings.Compare(a.ID, b.ID), a.Attempt-b.Attempt) })
			slices.SortFunc(want, func(a, b savedLease) int { return cmp.Or(strings.Compare(a.ID, b.ID), a.Attempt-b.Attempt) })
			if !slices.EqualFunc(got, want, func(a, b savedLease) bool { return a.ID == b.ID && a.Attempt == b.Attempt }) {
				t.Fatalf("n=%d: records changed: got %v, want %v", n, got, want)
			}
		}
	}
}
