package mpsd

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
)

// healthLog records what a store tells onHealth.
type healthLog struct {
	mu   sync.Mutex
	errs []error
}

func (h *healthLog) add(err error) {
	h.mu.Lock()
	h.errs = append(h.errs, err)
	h.mu.Unlock()
}

func (h *healthLog) all() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.errs...)
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A write that fails releases none of its waiters, is reported and
// counted, and is done again by the next flush even with nothing new
// requested; that write releases every waiter of the failed ones.
func TestStoreFailedWriteHoldsWaiters(t *testing.T) {
	// The state directory is missing: every write fails, as on a full or
	// read-only disk, without needing root to make one.
	dir := filepath.Join(t.TempDir(), "state")
	want := sampleState()
	var h healthLog
	s := newStore(filepath.Join(dir, "state.json"), func() savedState { return want }, slog.New(slog.DiscardHandler))
	defer s.close()
	s.onHealth = h.add

	first := s.request()
	err := s.flush()
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("flush into a missing directory: %v, want ENOENT naming %s", err, dir)
	}
	if closed(first) {
		t.Fatal("a failed write released its waiter")
	}
	second := s.request()
	if err := s.flush(); err == nil {
		t.Fatal("second flush succeeded")
	}
	if closed(first) || closed(second) {
		t.Fatal("a failed write released a waiter")
	}
	if n, err := s.health(); err == nil || n != 2 {
		t.Fatalf("health = %v, %d failures; want the error and 2", err, n)
	}
	if got := h.all(); len(got) != 2 || got[0] == nil || got[1] == nil {
		t.Fatalf("onHealth got %v, want two errors", got)
	}

	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Nothing new is requested: the failed write is due all the same.
	if err := s.flush(); err != nil {
		t.Fatalf("flush once the directory is there: %v", err)
	}
	if !closed(first) || !closed(second) {
		t.Fatal("the write that succeeded did not release the waiters of the failed ones")
	}
	if n, err := s.health(); err != nil || n != 2 {
		t.Fatalf("health = %v, %d; want nil, 2", err, n)
	}
	if got := h.all(); len(got) != 3 || got[2] != nil {
		t.Fatalf("onHealth got %v, want nil last (writes succeed again)", got)
	}
	if st, err := s.load(); err != nil || len(st.Leases) != 1 {
		t.Fatalf("load = %+v, %v", st, err)
	}
	// Healthy again: a flush with nothing due writes nothing, and a
	// success is not reported again.
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	if got := h.all(); len(got) != 3 {
		t.Fatalf("onHealth called again for a healthy flush: %v", got)
	}
}

// run retries a failed write by itself, with no further request, until
// it succeeds, and stops with its context.
func TestStoreRunRetries(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var h healthLog
	s := newStore(filepath.Join(dir, "state.json"), sampleState, slog.New(slog.DiscardHandler))
	defer s.close()
	s.onHealth = h.add
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
	ch := s.request()
	deadline := time.Now().Add(waitFor)
	for len(h.all()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no retries within %s: %v", waitFor, h.all())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if closed(ch) {
		t.Fatal("waiter released while writes fail")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatal("the retry did not write the state once the directory was there")
	}
	if _, err := s.health(); err != nil {
		t.Errorf("health after the retry succeeded: %v", err)
	}
}

// A frozen store (a crash) writes nothing and tells nobody it did.
func TestStoreFrozenReleasesNobody(t *testing.T) {
	dir := t.TempDir()
	s := newStore(filepath.Join(dir, "state.json"), sampleState, slog.New(slog.DiscardHandler))
	defer s.close()
	s.freeze()
	ch := s.request()
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	if closed(ch) {
		t.Error("a frozen store released a waiter")
	}
	if _, err := os.Stat(s.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a frozen store wrote the file: %v", err)
	}
}

// A change of the operator's intent (drains as well as quarantines) is
// synced; the intent list tells them apart.
func TestStateIntent(t *testing.T) {
	a := savedState{Quarantined: []string{"g/0"}}.intent()
	b := savedState{Drained: []string{"g/0"}}.intent()
	if len(a) != 1 || len(b) != 1 || a[0] == b[0] {
		t.Errorf("intent of a quarantine %v and of a drain %v must differ", a, b)
	}
	st := sampleState()
	st.Drained = []string{"inference/0"}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeState(raw)
	if err != nil || len(back.Drained) != 1 || back.Drained[0] != "inference/0" {
		t.Errorf("drained does not round-trip: %+v, %v", back.Drained, err)
	}
}

func TestErrnoText(t *testing.T) {
	err := &os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}
	if got := errnoText(err); got != "no space left on device" {
		t.Errorf("errnoText = %q", got)
	}
	if got := errnoText(errors.New("plain")); got != "plain" {
		t.Errorf("errnoText = %q", got)
	}
}

// The hint of an orphaned lease comes from its own environment only.
func TestOrphanHintFromEnv(t *testing.T) {
	env := strings.Join([]string{
		"PATH=/bin",
		api.EnvLeaseID + "=g-0123456789ab",
		api.EnvPipeDirectory + "=/run/mpsd/g/GPU-0/pipe",
		api.EnvThreadPercentage + "=30",
		api.EnvPinnedMemLimit + "=0=2048M,1=2048M",
		api.EnvAttempt + "=2",
	}, "\x00") + "\x00"
	var h orphanHint
	h.fromEnv("g-0123456789ab", []byte(env))
	if h.pipeDir != "/run/mpsd/g/GPU-0/pipe" || h.sm != 30 || h.mem != 2048<<20 || h.attempt != 2 {
		t.Errorf("hint %+v", h)
	}
	var other orphanHint
	other.fromEnv("g-ffffffffffff", []byte(env))
	if other != (orphanHint{}) {
		t.Errorf("another lease's environment gave %+v", other)
	}
	// A lease of 4 processes gave each 7% of its 30%: charged 28%, 4
	// processes.
	var procs orphanHint
	procs.fromEnv("g-0123456789ab", []byte(strings.ReplaceAll(env, api.EnvThreadPercentage+"=30", api.EnvThreadPercentage+"=7")+api.EnvProcs+"=4\x00"))
	if procs.sm != 28 || procs.procs != 4 {
		t.Errorf("hint of a lease of 4 processes: %+v, want sm 28, procs 4", procs)
	}
}

func FuzzOrphanHintFromEnv(f *testing.F) {
	f.Add([]byte(api.EnvLeaseID + "=g-1\x00" + api.EnvPinnedMemLimit + "=0=1M\x00" + api.EnvThreadPercentage + "=5\x00"))
	f.Add([]byte(api.EnvLeaseID + "=g-1\x00" + api.EnvPinnedMemLimit + "=0=99999999999999999M\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h orphanHint
		h.fromEnv("g-1", b)
		if h.mem < 0 {
			t.Fatalf("negative memory %d", h.mem)
		}
		if h.procs < 0 || h.procs > api.MaxProcs {
			t.Fatalf("procs %d", h.procs)
		}
	})
}
