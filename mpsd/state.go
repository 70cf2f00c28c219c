package mpsd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/cgroup"
	"github.com/mpsd/mpsd/mps"
	"github.com/mpsd/mpsd/policy"
)

// stateVersion is the schema of the state file; a newer file is not read.
const stateVersion = 1

// savedState is the state file: the running leases, enough to re-adopt
// them after a restart, and the queued ones, fresh or requeued, in their
// order (Seq), so that their launchers resume them by id in their place.
// A queued request is saved without its launcher waiting for the write
// (which may wait up to queueSaveDelay for company): one that a crash lost
// is asked for anew (the launcher gets CodeNotFound).
type savedState struct {
	Version int          `json:"version"`
	Leases  []savedLease `json:"leases"`
	// Quarantined are the keys of quarantined instances: a quarantine
	// holds until an operator lifts it, restarts included.
	Quarantined []string `json:"quarantined,omitempty"`
	// QuarantineReasons: why each quarantined instance was quarantined,
	// for status (an older mpsd's file has none: the reason is unknown).
	QuarantineReasons map[string]string `json:"quarantine_reasons,omitempty"`
	// Drained are the keys of the instances an operator drained (mpsctl
	// drain): a drain holds until mpsctl resume, restarts included. A
	// file without it (an older mpsd's) drains nothing.
	Drained []string `json:"drained,omitempty"`
	// Drains are the records of the drains of Drained (why, who, when),
	// by instance key; a drain from an older mpsd has none.
	Drains map[string]savedDrain `json:"drains,omitempty"`
	// ServerLogs is, per instance, where in its server.log the next mpsd
	// reads on, so a fault logged while none watched (or read too late to
	// handle) is not missed: just past the last fault whose recovery had
	// begun. A crash may replay a fault; none is lost.
	ServerLogs map[string]int64 `json:"server_logs,omitempty"`
	// Servers is, per instance, the MPS servers (pid: uid) running when
	// mpsd last wrote its state. MPS never shuts an idle server down, so one
	// missing when the next mpsd adopts the daemon died meanwhile, and its
	// clients with it.
	Servers map[string]map[int]int `json:"servers,omitempty"`
	// Daemons is, per instance, the MPS control daemon mpsd ran (pid and
	// start time): the next mpsd adopts that process only. A state file
	// without it (an older mpsd's) adopts the verified lock holder.
	Daemons map[string]savedDaemon `json:"daemons,omitempty"`
	// Barred is, per instance, the uids it bars for their clients'
	// faults (culprit.go), sorted by uid: a bar holds across restarts
	// until it lapses or an operator resumes the instance.
	Barred map[string][]savedBar `json:"barred,omitempty"`
}

type savedDrain struct {
	Reason string    `json:"reason"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
}

type savedBar struct {
	UID    uint32    `json:"uid"`
	Until  time.Time `json:"until"`
	Reason string    `json:"reason"`
}

type savedDaemon struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

type savedLease struct {
	ID       string `json:"id"`
	Group    string `json:"group"`
	Instance string `json:"instance"`
	UID      uint32 `json:"uid"`
	SM       int    `json:"sm"`
	MemBytes int64  `json:"mem_bytes"`
	GPUs     int    `json:"gpus"`
	Priority int    `json:"priority"`
	Seq      uint64 `json:"seq"`
	Attempt  int    `json:"attempt"`
	Requeue  int    `json:"requeue"`
	// Spared: requeues that did not use up an attempt (Attempt-1-Spared
	// did).
	Spared  int       `json:"spared,omitempty"`
	Command []string  `json:"command,omitempty"`
	Created time.Time `json:"created"`
	// Only: the GPUs the lease is confined to (LeaseRequest.GPUSelect,
	// resolved); JobID its batch job.
	Only  []int  `json:"only,omitempty"`
	JobID string `json:"job_id,omitempty"`
	// RevokedFor: why it was last revoked, for a launcher that resumes.
	RevokedFor string `json:"revoked_for,omitempty"`
	// AwaySince: the lease was already waiting for its launcher when
	// mpsd stopped, since then; its grace runs on from there rather than
	// starting again with every restart.
	AwaySince time.Time `json:"away_since,omitzero"`
	// Ran: the last attempt whose command was attached.
	Ran int `json:"ran,omitempty"`
	// Granted: when the running attempt was granted (status's run time).
	Granted time.Time `json:"granted,omitzero"`
	// Revoking: a revocation had taken the lease (RevokedFor says why)
	// and not yet requeued it; the next mpsd finishes it.
	Revoking bool `json:"revoking,omitempty"`
	// Spare: that revocation spares it (a victim of another lease's
	// fault): its requeue uses up no attempt.
	Spare bool `json:"spare,omitempty"`
	// EndCode and EndMessage: that revocation ends the lease with this
	// error instead of requeueing it (mpsctl cancel, mpsctl shutdown), so
	// the next mpsd that finishes it ends it too.
	EndCode    api.ErrorCode `json:"end_code,omitempty"`
	EndMessage string        `json:"end_message,omitempty"`
	// Queued: waiting in the queue, for its first run (Attempt 1) or,
	// revoked by a fault, its next; Instance is then empty.
	Queued bool `json:"queued,omitempty"`
	// Adopted: re-adopted from its cgroup, which no state file recorded
	// (durability.go); its launcher's attempt is taken at its resume.
	Adopted bool `json:"adopted,omitempty"`
	// Procs: the processes its sm is divided among (LeaseRequest.Procs),
	// when more than 1; absent, 1.
	Procs int `json:"procs,omitempty"`
}

// store keeps the state (see write) from a snapshot taken when a write is
// due: each write appends the whole state as one line to the journal
// beside the state file, and every so often (compaction) the state file
// itself is replaced and the journal emptied. The last whole record of the
// journal, if it has one, is the state; else the state file is. Writes are
// batched: every change since the last write goes in the next one, so a
// burst of grants costs one fsync, and each grant waits only for the write
// that covers it.
//
// What API traffic can make it write is bounded (run): a write that would
// record nothing but changes to queued requests (one queued, withdrawn,
// its launcher gone) waits up to queueSaveDelay for one that records more,
// so a tenant's request/close loop makes at most one write a second, not
// one per request; and every write waits while the writes before it took
// more than stateWriteRate bytes a second (after a stateWriteBurst). A
// grant, release, revocation or requeue, a change of the operator's
// intent, of a bar, daemon, server or log offset is written at once,
// budget allowing. A lease's command is cut before it reaches the state
// (keptCommand), so each lease's record is bounded too.
//
// A write that fails releases nobody: its waiters wait for the next write
// that succeeds, the store retries with a backoff (storeRetryInitial to
// storeRetryMax), and onHealth tells the daemon, which holds its grants
// meanwhile (durability.go). A launcher is never told of a lease that a
// crash could lose.
type store struct {
	path string
	// snapshotAnd takes the state and, before anything can change it
	// (the daemon holds its lock), runs decide with it.
	snapshotAnd func(decide func(*savedState)) savedState
	log         *slog.Logger
	// onHealth, when set, is called by the writer after every write that
	// failed (with its error) and after the first that succeeded again
	// (with nil), without the store's lock.
	onHealth func(err error)
	// beforeWrite, when set (tests), runs in the writer before each write.
	beforeWrite func()
	// order is the writer's scratch for sorting a state's leases.
	order []int32

	mu      sync.Mutex
	pending chan struct{} // closed when the next write is done; nil if none is due
	// unsaved are the waiters of writes that failed, released by the next
	// write that succeeds.
	unsaved []chan struct{}
	kick    chan struct{}

	frozen bool // freeze was called: nothing more is written
	// now: requestNow asked for the next write; it is not put off for
	// the queue.
	now bool
	// failing is the last write's error (nil: it succeeded, or none ran
	// yet); failures counts the writes that failed.
	failing  error
	failures uint64

	// Touched by the writer only (flush is not concurrent with itself:
	// run and Run's final flush never overlap).
	written    bool
	lastIntent []string
	// buf is the last write's encoding, its memory reused by the next.
	buf []byte
	// next is the temporary file the next compaction fills, created by
	// run after a write's waiters were released, off the grant's critical
	// path. nil when none is made yet; run removes it when it stops.
	next *os.File
	// j is the journal, open for appending (nil until the first write,
	// which compacts); jsize is its length; jbroken says a write to it
	// failed part way, so the next write compacts (and so cuts the torn
	// record off).
	j       *os.File
	jsize   int64
	jbroken bool
	// jbytes, jrecords and jmax bound the journal (journalMinBytes,
	// journalRecords and journalMaxBytes; tests lower them).
	jbytes, jrecords, jmax int64

	// prev is the state the last write that succeeded recorded (once
	// written is set), prevIdx its leases by id and prevRunning how many
	// of them were not queued: what run compares a snapshot with.
	prev        savedState
	prevIdx     map[string]*savedLease
	prevRunning int
	// queueSince is when run first put off a write that records only
	// queue changes (zero while none is put off); queueDelay is how long
	// it may put one off (queueSaveDelay; tests change it).
	queueSince time.Time
	queueDelay time.Duration
	// tokens are the bytes the store may write before a write waits
	// (negative: owed), refilled at rate bytes a second up to burst
	// (stateWriteRate, stateWriteBurst; tests change them) as of
	// refilled. A forced write (flush) spends them without waiting.
	tokens, rate, burst float64
	refilled            time.Time
	// throttled is when run last logged that writes wait for the budget.
	throttled time.Time
	// records and bytes count the writes that succeeded and the bytes
	// they put into the state directory (journal records and compacted
	// state files); guarded by mu.
	records, bytes uint64
}

// journalSuffix names the journal: the state file's path with it.
const journalSuffix = ".journal"

// journalMinBytes is the least the journal grows to before a write
// compacts it; it may also grow to journalRecords records, but never past
// journalMaxBytes.
const (
	journalMinBytes = 4 << 20
	journalRecords  = 32
	journalMaxBytes = 64 << 20
)

// What state writes may cost (docs/architecture.md#the-state-file).
const (
	// queueSaveDelay: a write that records only changes to queued
	// requests (or nothing new) waits up to this long for one that
	// records more. A crash loses at most this much of the queue's
	// changes, whose launchers ask anew (CodeNotFound).
	queueSaveDelay = time.Second
	// stateWriteRate bounds the bytes a second the store writes into
	// state_dir, on average, after a burst of stateWriteBurst: whatever
	// the API traffic, writes past it wait. Far above what a busy host
	// needs (a write is the whole state: BenchmarkAdmission's 100 clients
	// made it write 11 MB a second at 1,100 grants and releases a
	// second).
	stateWriteRate  = 64 << 20
	stateWriteBurst = 16 << 20
)

// throttleLogEvery spaces the log lines saying that writes wait for
// stateWriteRate.
const throttleLogEvery = time.Minute

// tempPattern names the store's temporary files in the state directory.
const tempPattern = ".state-*.tmp"

// Bounds of the backoff between retries of a state write that failed.
const (
	storeRetryInitial = 100 * time.Millisecond
	storeRetryMax     = 2 * time.Second
)

// newStore makes a store of the state snapshot returns. A daemon sets
// snapshotAnd to one that holds its lock (Daemon.snapshotAnd): with
// snapshot alone, a request made while it runs could be taken as written.
func newStore(path string, snapshot func() savedState, log *slog.Logger) *store {
	and := func(decide func(*savedState)) savedState {
		st := snapshot()
		decide(&st)
		return st
	}
	return &store{path: path, snapshotAnd: and, log: log, kick: make(chan struct{}, 1), jbytes: journalMinBytes, jrecords: journalRecords, jmax: journalMaxBytes,
		queueDelay: queueSaveDelay, rate: stateWriteRate, burst: stateWriteBurst, tokens: stateWriteBurst}
}

// request asks for a write of the state as it will be after the caller's
// change, and returns a channel closed once it is on disk.
func (s *store) request() <-chan struct{} {
	s.mu.Lock()
	if s.pending == nil {
		s.pending = make(chan struct{})
	}
	ch := s.pending
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return ch
}

// requestNow is request for a caller that waits for the write but asks
// only after letting Daemon.mu go (persistIntent): a write since its
// change may already hold it, so its own is never put off as one of
// queue changes alone.
func (s *store) requestNow() <-chan struct{} {
	s.mu.Lock()
	s.now = true
	s.mu.Unlock()
	return s.request()
}

// run writes whenever asked until ctx ends, and retries a write that
// failed until one succeeds. A write that records only queue changes is
// put off (queueDelay), and any write waits while the budget is spent
// (stateWriteRate): the changes meanwhile go into it.
func (s *store) run(ctx context.Context) {
	wake := time.NewTimer(time.Hour)
	wake.Stop()
	defer wake.Stop()
	defer s.dropNext()
	backoff := storeRetryInitial
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-wake.C:
		}
		wrote, again, err := s.flushDue(time.Now(), false)
		wake.Stop()
		if err == nil {
			if wrote {
				if lastErr != "" {
					s.log.Info("state written again; grants resume", "path", s.path)
				}
				lastErr, backoff = "", storeRetryInitial
				s.prepareNext()
			}
			if again > 0 {
				wake.Reset(again)
			}
			continue
		}
		// Logged when it begins or changes, not at every retry.
		if err.Error() != lastErr {
			s.log.Error("write state; no lease is granted until it is written", "err", err, "retry_in", backoff)
			lastErr = err.Error()
		}
		wake.Reset(max(backoff, again))
		backoff = min(2*backoff, storeRetryMax)
	}
}

// flush writes the state now if a write is due: one was requested, or
// the last one failed. Its waiters are released only once it is on disk.
// (Tests, and Run's last write when mpsd stops.)
func (s *store) flush() error {
	_, _, err := s.flushDue(time.Now(), true)
	return err
}

// flushDue writes the state if a write is due, and reports whether it
// wrote. Unless forced it may put the write off instead (its waiters
// wait on), and then says how soon to try again: a write that records
// only queue changes, until queueDelay after the first such was put off;
// any write, while the budget of stateWriteRate is spent.
func (s *store) flushDue(now time.Time, force bool) (wrote bool, again time.Duration, err error) {
	s.mu.Lock()
	frozen, due := s.frozen, s.pending != nil || len(s.unsaved) > 0 || s.failing != nil
	s.mu.Unlock()
	if frozen || !due {
		// Frozen: as after mpsd's death, nothing more is written and
		// nobody is told it was (they end with their connections).
		return false, 0, nil
	}
	var waiters []chan struct{}
	var owed time.Duration
	st := s.snapshotAnd(func(st *savedState) {
		// No change can be made meanwhile: the waiters taken asked
		// before st was taken, so it holds their changes, and one put
		// off keeps its channel, which later askers share.
		s.mu.Lock()
		defer s.mu.Unlock()
		if !force {
			again, owed = s.putOff(st, now, s.failing != nil || s.now)
			if again > 0 {
				return
			}
		}
		s.now = false
		waiters = s.unsaved
		s.unsaved = nil
		if s.pending != nil {
			waiters = append(waiters, s.pending)
			s.pending = nil
		}
	})
	if owed > 0 && now.Sub(s.throttled) >= throttleLogEvery {
		s.throttled = now
		s.log.Warn("state writes wait: they took more than their bound", "path", s.path,
			"bound_bytes_per_second", int64(s.rate), "wait", owed)
	}
	if again > 0 {
		return false, again, nil
	}
	s.order = sortLeases(st.Leases, s.order)
	if s.beforeWrite != nil {
		s.beforeWrite()
	}
	n, err := s.write(st)
	s.tokens -= float64(n)
	if err == nil {
		s.wrote(st)
	}
	s.mu.Lock()
	recovered := err == nil && s.failing != nil
	s.failing = err
	if err != nil {
		s.failures++
		s.unsaved = append(waiters, s.unsaved...)
	} else {
		s.records++
		s.bytes += uint64(n)
	}
	s.mu.Unlock()
	if err == nil {
		for _, ch := range waiters {
			close(ch)
		}
	}
	if s.onHealth != nil && (err != nil || recovered) {
		s.onHealth(err)
	}
	return err == nil, 0, err
}

// putOff says how long a write of st may wait, 0 if it is due now, and
// of that how long for the budget (owed): one that records only queue
// changes (unless it is wanted now: it retries a failed write, or
// requestNow asked) waits until queueDelay after the first such was put
// off; any waits until the bytes owed are earned back.
func (s *store) putOff(st *savedState, now time.Time, wanted bool) (wait, owed time.Duration) {
	if s.written && !wanted && s.changeOf(st) == writeQueue {
		if s.queueSince.IsZero() {
			s.queueSince = now
		}
		wait = s.queueSince.Add(s.queueDelay).Sub(now)
	}
	s.refill(now)
	if s.tokens < 0 {
		owed = time.Duration(-s.tokens / s.rate * float64(time.Second))
	}
	return max(wait, owed), owed
}

// refill adds the bytes the budget earned since it was last refilled.
func (s *store) refill(now time.Time) {
	if !s.refilled.IsZero() {
		s.tokens = min(s.burst, s.tokens+now.Sub(s.refilled).Seconds()*s.rate)
	}
	s.refilled = now
}

// wrote takes st as what the state directory holds.
func (s *store) wrote(st savedState) {
	s.prev = st
	clear(s.prevIdx)
	if s.prevIdx == nil {
		s.prevIdx = make(map[string]*savedLease, len(st.Leases))
	}
	s.prevRunning = 0
	for i := range st.Leases {
		l := &st.Leases[i]
		s.prevIdx[l.ID] = l
		if !l.Queued {
			s.prevRunning++
		}
	}
	s.queueSince = time.Time{}
}

// writeCounts is how many writes succeeded and the bytes they wrote.
func (s *store) writeCounts() (records, bytes uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records, s.bytes
}

// writeKind is how soon a state must be written, given the last written.
type writeKind int

const (
	// writeQueue: it differs from the last written only in queued
	// requests (queued, withdrawn, or changed while queued), or not at
	// all. Nobody waits for such a write (a queued request is saved
	// without its launcher waiting), so it may wait for company.
	writeQueue writeKind = iota
	// writeNow: anything else. A grant, a release, a revocation, a
	// requeue, a lease that is not queued changing, the operator's
	// intent, a bar, a daemon, a server, a log offset.
	writeNow
)

// changeOf says how soon st must be written, s.prev being on disk.
func (s *store) changeOf(st *savedState) writeKind {
	if !sameRest(&s.prev, st) {
		return writeNow
	}
	running := 0 // leases not queued in prev that st still has
	for i := range st.Leases {
		l := &st.Leases[i]
		p, ok := s.prevIdx[l.ID]
		if !ok {
			if !l.Queued {
				return writeNow // granted (or adopted)
			}
			continue
		}
		if !p.Queued {
			running++
		}
		if (!p.Queued || !l.Queued) && !sameLease(p, l) {
			return writeNow
		}
	}
	if running != s.prevRunning {
		return writeNow // a lease that was not queued is gone
	}
	return writeQueue
}

// sameRest reports whether a and b agree on everything but their leases.
func sameRest(a, b *savedState) bool {
	return a.Version == b.Version &&
		slices.Equal(a.Quarantined, b.Quarantined) &&
		maps.Equal(a.QuarantineReasons, b.QuarantineReasons) &&
		slices.Equal(a.Drained, b.Drained) &&
		maps.EqualFunc(a.Drains, b.Drains, func(x, y savedDrain) bool {
			return x.Reason == y.Reason && x.By == y.By && x.At.Equal(y.At)
		}) &&
		maps.Equal(a.ServerLogs, b.ServerLogs) &&
		maps.EqualFunc(a.Servers, b.Servers, func(x, y map[int]int) bool { return maps.Equal(x, y) }) &&
		maps.Equal(a.Daemons, b.Daemons) &&
		maps.EqualFunc(a.Barred, b.Barred, func(x, y []savedBar) bool {
			return slices.EqualFunc(x, y, func(p, q savedBar) bool {
				return p.UID == q.UID && p.Until.Equal(q.Until) && p.Reason == q.Reason
			})
		})
}

// sameLease reports whether a and b record the same.
func sameLease(a, b *savedLease) bool {
	return a.ID == b.ID && a.Group == b.Group && a.Instance == b.Instance && a.UID == b.UID &&
		a.SM == b.SM && a.MemBytes == b.MemBytes && a.GPUs == b.GPUs && a.Priority == b.Priority &&
		a.Seq == b.Seq && a.Attempt == b.Attempt && a.Requeue == b.Requeue && a.Spared == b.Spared &&
		slices.Equal(a.Command, b.Command) && a.Created.Equal(b.Created) && slices.Equal(a.Only, b.Only) &&
		a.JobID == b.JobID && a.RevokedFor == b.RevokedFor && a.AwaySince.Equal(b.AwaySince) &&
		a.Ran == b.Ran && a.Granted.Equal(b.Granted) && a.Revoking == b.Revoking && a.Spare == b.Spare &&
		a.EndCode == b.EndCode && a.EndMessage == b.EndMessage &&
		a.Queued == b.Queued && a.Adopted == b.Adopted && a.Procs == b.Procs
}

// health is how many writes have failed and the last write's error (nil
// if it succeeded or none ran yet).
func (s *store) health() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures, s.failing
}

// freeze stops all writing, as the death of mpsd would (tests of a
// crash); nobody waiting is told of a write.
func (s *store) freeze() {
	s.mu.Lock()
	s.frozen = true
	s.mu.Unlock()
}

// write records st: one write(2) of a line appended to the journal, which
// a crash of mpsd cannot take back once it returns (the page cache holds
// it), and costs no rename: replacing a file by rename makes ext4 flush
// the new file's data first (auto_da_alloc), about a millisecond that
// every grant and release would wait for. The journal is synced only when
// the operator's intent (quarantines, drains) changed: a lease cannot
// outlive the machine (its processes die with it), so its record need
// only survive mpsd; a drain or a quarantine is an operator's decision
// that must survive a reboot. The first write, one after a failed one, and
// one that would take the journal past its bound (journalMinBytes, or
// journalRecords records of this size, but never journalMaxBytes) compact
// instead. It returns the bytes it wrote.
func (s *store) write(st savedState) (int, error) {
	b, err := st.appendJSON(s.buf[:0])
	if err != nil {
		return 0, fmt.Errorf("write state %s: %w", s.path, err)
	}
	b = append(b, '\n')
	s.buf = b
	intent := st.intent()
	sync := !slices.Equal(intent, s.lastIntent) || !s.written
	limit := max(s.jbytes, min(s.jrecords*int64(len(b)), s.jmax))
	if s.j == nil || s.jbroken || !s.written || s.jsize+int64(len(b)) > limit {
		err = s.compact(b)
	} else {
		err = s.appendRecord(b, sync)
	}
	if err != nil {
		return len(b), err
	}
	// Only a write that is done counts: one that failed is synced again.
	s.lastIntent, s.written = intent, true
	return len(b), nil
}

// appendRecord appends one record to the journal.
func (s *store) appendRecord(b []byte, sync bool) error {
	n, err := s.j.Write(b)
	s.jsize += int64(n)
	if err == nil && sync {
		err = s.j.Sync()
	}
	if err != nil {
		s.jbroken = true
		return fmt.Errorf("write state journal %s: %w", s.path+journalSuffix, err)
	}
	return nil
}

// compact replaces the state file atomically with b (temp file, fsync,
// rename, fsync of the directory) and then empties the journal, synced
// too. The state file is never left empty. A crash or power loss between
// the rename and the emptying leaves the journal ending at the write
// before b, which is what load then takes: b's waiters were not yet told
// of it, so nothing anyone was told of is lost.
func (s *store) compact(b []byte) error {
	dir := filepath.Dir(s.path)
	f := s.next
	s.next = nil
	var err error
	if f == nil {
		if f, err = os.CreateTemp(dir, tempPattern); err != nil {
			return fmt.Errorf("write state %s: %w", s.path, err)
		}
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write state %s: %w", s.path, err)
	}
	// The rename is durable before the journal is emptied: a power loss
	// between the two never leaves the old file without the records that
	// followed it.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write state %s: sync its directory: %w", s.path, err)
	}
	jpath := s.path + journalSuffix
	opened := false
	if s.j == nil {
		s.j, err = os.OpenFile(jpath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			s.j = nil
			return fmt.Errorf("open state journal %s: %w", jpath, err)
		}
		opened = true
	}
	err = s.j.Truncate(0)
	if err == nil {
		err = s.j.Sync()
	}
	if err == nil && opened {
		// Its name too, once: a synced record in a journal whose entry
		// a power loss took would be lost with it.
		err = syncDir(dir)
	}
	if err != nil {
		s.jbroken = true
		return fmt.Errorf("empty state journal %s: %w", jpath, err)
	}
	s.jsize, s.jbroken = 0, false
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// close closes the journal (Run calls it last).
func (s *store) close() {
	if s.j != nil {
		_ = s.j.Close()
		s.j = nil
	}
}

// prepareNext creates the temporary file of the next write, unless there
// is one; a failure is left to the write, which creates it itself.
func (s *store) prepareNext() {
	if s.next != nil {
		return
	}
	s.mu.Lock()
	frozen := s.frozen
	s.mu.Unlock()
	if frozen {
		return
	}
	if f, err := os.CreateTemp(filepath.Dir(s.path), tempPattern); err == nil {
		s.next = f
	}
}

// dropNext removes the temporary file prepared for a write that will not
// come.
func (s *store) dropNext() {
	if s.next == nil {
		return
	}
	_ = s.next.Close()
	_ = os.Remove(s.next.Name())
	s.next = nil
}

// intent is the operator's decisions the state holds, as one comparable
// list: a change of it is synced to disk.
func (st savedState) intent() []string {
	out := make([]string, 0, len(st.Quarantined)+len(st.Drained))
	for _, k := range st.Quarantined {
		out = append(out, "q:"+k)
	}
	for _, k := range st.Drained {
		// A drain's record (its reason may change) is the operator's
		// intent too.
		dr := st.Drains[k]
		out = append(out, "d:"+k+"\x00"+dr.Reason+"\x00"+dr.By+"\x00"+dr.At.String())
	}
	return out
}

// load reads the state file. A missing file is an empty state; an
// unreadable one is moved aside (never deleted) and reported. Temporary
// files a previous mpsd left (it died between creating one and renaming
// it, or with one prepared) are removed: only the state file counts.
func (s *store) load() (savedState, error) {
	if stale, err := filepath.Glob(filepath.Join(filepath.Dir(s.path), tempPattern)); err == nil {
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}
	st, err := s.loadFile()
	jst, ok, jerr := s.loadJournal()
	switch {
	case jerr != nil:
		return st, errors.Join(err, jerr)
	case ok && err != nil:
		// The journal's last record is newer than any state file, and
		// whole: nothing is lost.
		s.log.Warn("state file unreadable; its journal's last record is the state", "err", err)
		return jst, nil
	case ok:
		return jst, nil
	}
	return st, err
}

// loadFile reads the state file: a missing one is an empty state, an
// unreadable one is moved aside.
func (s *store) loadFile() (savedState, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return savedState{Version: stateVersion}, nil
	}
	if err != nil {
		return savedState{Version: stateVersion}, fmt.Errorf("read state %s: %w", s.path, err)
	}
	st, err := decodeState(b)
	if err != nil {
		aside := s.path + ".bad-" + time.Now().UTC().Format("20060102T150405")
		_ = os.Rename(s.path, aside)
		return savedState{Version: stateVersion}, fmt.Errorf("state %s (moved to %s): %w", s.path, aside, err)
	}
	return st, nil
}

// loadJournal returns the journal's last whole record, if it has one. A
// record a crash cut short (or one a failed write left) is skipped, as is
// anything else that is not a state; a journal that cannot be read is
// moved aside and reported, like an unreadable state file. The journal is
// root's and bounded by compaction (journalMinBytes, journalRecords), so
// it is read whole.
func (s *store) loadJournal() (savedState, bool, error) {
	path := s.path + journalSuffix
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return savedState{}, false, nil
	}
	if err != nil {
		aside := path + ".bad-" + time.Now().UTC().Format("20060102T150405")
		_ = os.Rename(path, aside)
		return savedState{}, false, fmt.Errorf("read state journal %s (moved to %s): %w", path, aside, err)
	}
	skipped := 0
	for len(b) > 0 {
		rec := b
		b = b[:0]
		if i := bytes.LastIndexByte(rec[:len(rec)-1], '\n'); i >= 0 {
			b, rec = rec[:i+1], rec[i+1:]
		}
		if rec[len(rec)-1] != '\n' {
			skipped += len(rec) // no newline: cut short by a crash
			continue
		}
		st, err := decodeState(rec)
		if err != nil {
			skipped += len(rec)
			continue
		}
		if skipped > 0 {
			s.log.Info("state journal: a last record cut short is ignored (mpsd stopped while writing it, before anyone was told of it)", "path", path, "bytes", skipped)
		}
		return st, true, nil
	}
	if skipped > 0 {
		s.log.Info("state journal holds no whole record; the state file is the state", "path", path, "bytes", skipped)
	}
	return savedState{}, false, nil
}

// decodeState parses a state file strictly: one document of this
// version, no unknown fields, nothing after it, valid lease ids.
func decodeState(b []byte) (savedState, error) {
	var st savedState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return savedState{}, err
	}
	if dec.Decode(&struct{}{}) != io.EOF {
		return savedState{}, errors.New("data after the document")
	}
	if st.Version != stateVersion {
		return savedState{}, fmt.Errorf("version %d, this mpsd reads %d", st.Version, stateVersion)
	}
	for i, l := range st.Leases {
		if err := api.ValidLeaseID(l.ID); err != nil {
			return savedState{}, fmt.Errorf("lease %q: %w", l.ID, err)
		}
		if l.Attempt < 1 || l.Spared < 0 || l.Spared > l.Attempt-1 || l.SM < 1 || l.SM > 100 || l.MemBytes < 0 || l.GPUs < 1 || l.Procs < 0 || l.Procs > l.SM {
			return savedState{}, fmt.Errorf("lease %s: values out of range", l.ID)
		}
		// An older mpsd kept commands whole: cut as admit cuts them, so
		// they cost every write what a new request's would.
		st.Leases[i].Command = keptCommand(l.Command)
	}
	for key, bars := range st.Barred {
		for _, b := range bars {
			if b.Until.IsZero() {
				return savedState{}, fmt.Errorf("instance %q: a bar of uid %d without its end", key, b.UID)
			}
		}
	}
	return st, nil
}

func jsonEncode(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// snapshot is the state to persist: every running or queued lease (the
// store sorts them).
func (d *Daemon) snapshot() savedState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.snapshotLocked()
}

// sortLeases sorts leases by id, in place, outside Daemon.mu: it sorts
// their indexes (order, reused and returned), then moves each record
// once, along the cycles of the permutation (sorting the records
// themselves moved a quarter of a kilobyte per swap).
func sortLeases(leases []savedLease, order []int32) []int32 {
	order = order[:0]
	for i := range leases {
		order = append(order, int32(i))
	}
	slices.SortFunc(order, func(a, b int32) int { return strings.Compare(leases[a].ID, leases[b].ID) })
	// leases[i] is to become leases[order[i]]: follow each cycle from
	// its first place, marking the places filled with -1.
	for i := range order {
		if order[i] < 0 || int(order[i]) == i {
			continue
		}
		first := leases[i]
		j := i
		for {
			k := int(order[j])
			order[j] = -1
			if k == i {
				leases[j] = first
				break
			}
			leases[j] = leases[k]
			j = k
		}
	}
	return order
}

// snapshotAnd is snapshot, running decide with it before Daemon.mu is
// let go (the store's snapshotAnd): a change made under Daemon.mu asks
// for its write there, so the store takes as written by it the requests
// whose changes it holds, and only those. (One that asks after letting
// Daemon.mu go and waits uses requestNow.)
func (d *Daemon) snapshotAnd(decide func(*savedState)) savedState {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.snapshotLocked()
	decide(&st)
	return st
}

func (d *Daemon) snapshotLocked() savedState {
	st := savedState{Version: stateVersion, Leases: make([]savedLease, 0, len(d.leases))}
	now := d.clock.Now()
	// In the map's order: the store sorts them by id (a stable file)
	// once Daemon.mu is let go (sortLeases).
	for _, l := range d.leases {
		queued := !l.running()
		sl := savedLease{
			ID: l.id, Group: l.group, UID: l.uid,
			SM: l.req.SM, MemBytes: l.req.Mem, GPUs: l.req.GPUs, Priority: l.req.Priority, Seq: l.req.Seq,
			Attempt: l.attempt, Requeue: l.requeue, Spared: l.spared, Command: l.command, Created: l.created, Queued: queued,
			Only: l.req.Only, JobID: l.jobID, RevokedFor: l.revokedFor, Ran: l.ranAttempt,
			Revoking: l.state == leaseRevoking, Spare: l.state == leaseRevoking && l.spareNext, Adopted: d.dur.orphans[l.id], Granted: l.grantedAt,
		}
		if l.req.Procs > 1 {
			sl.Procs = l.req.Procs
		}
		if l.state == leaseRevoking && l.endWith != nil {
			sl.EndCode, sl.EndMessage = l.endWith.Code, l.endWith.Message
		}
		if l.grace != nil {
			sl.AwaySince = l.awaySince
		}
		if !queued {
			sl.Instance = l.inst.key
		}
		st.Leases = append(st.Leases, sl)
	}
	for key, in := range d.instances {
		if in.holds.quarantined {
			st.Quarantined = append(st.Quarantined, key)
			if in.quarantinedFor != "" {
				if st.QuarantineReasons == nil {
					st.QuarantineReasons = map[string]string{}
				}
				st.QuarantineReasons[key] = in.quarantinedFor
			}
		}
		if in.holds.drained {
			st.Drained = append(st.Drained, key)
			if in.drain != (drainRecord{}) {
				if st.Drains == nil {
					st.Drains = map[string]savedDrain{}
				}
				st.Drains[key] = savedDrain{Reason: in.drain.reason, By: in.drain.by, At: in.drain.at}
			}
		}
		for _, uid := range in.barredUIDs(now) {
			if st.Barred == nil {
				st.Barred = map[string][]savedBar{}
			}
			b := in.barred[uid]
			st.Barred[key] = append(st.Barred[key], savedBar{UID: uid, Until: b.until, Reason: b.reason})
		}
		if saved := in.mps.saved(); saved != nil {
			if st.Servers == nil {
				st.Servers = map[string]map[int]int{}
			}
			st.Servers[key] = saved
		}
		if in.daemon != nil {
			if st.Daemons == nil {
				st.Daemons = make(map[string]savedDaemon, len(d.instances))
			}
			id := in.daemon.Identity()
			st.Daemons[key] = savedDaemon{PID: id.PID, StartTime: id.StartTime}
		}
		if in.daemon != nil && in.logHandled >= 0 {
			if st.ServerLogs == nil {
				st.ServerLogs = make(map[string]int64, len(d.instances))
			}
			st.ServerLogs[key] = in.serverLogSavedLocked()
		}
	}
	slices.Sort(st.Quarantined)
	slices.Sort(st.Drained)
	// The marks of re-adopted leases that have ended go with them.
	for id := range d.dur.orphans {
		if _, ok := d.leases[id]; !ok {
			delete(d.dur.orphans, id)
		}
	}
	return st
}

// instanceIDFile holds the instance id in the state directory.
const instanceIDFile = "instance-id"

// errInstanceID: the instance id file is there but unusable.
var errInstanceID = errors.New("mpsd: instance id unusable")

// loadInstanceID reads this mpsd's instance id from the state directory,
// creating it (random, root-only) the first time. The id names the
// directory under the cgroup parent that holds this mpsd's lease cgroups,
// so two mpsds with their own state directories never take each other's
// leases for leftovers even when they share the parent; the same state
// directory is the same id, so a restart re-adopts its leases. A file
// that is there but unreadable is an error: a new id would orphan every
// running lease.
func loadInstanceID(stateDir string) (string, error) {
	path := filepath.Join(stateDir, instanceIDFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSuffix(string(b), "\n")
		if !validInstanceID(id) {
			return "", fmt.Errorf("%w: %s holds %q, not 16 hex digits; restore it, or remove it to start under a new id (the lease cgroups of the old one are then left alone)", errInstanceID, path, truncate(string(b), 40))
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("%w: read %s: %w", errInstanceID, path, err)
	}
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("make instance id: %w", err)
	}
	id := hex.EncodeToString(raw[:])
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	_, err = f.WriteString(id + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	_ = syncDir(stateDir)
	return id, nil
}

func validInstanceID(id string) bool {
	if len(id) != 16 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// openCgroups reads (or makes) the instance id and makes the cgroup
// manager under it.
func (d *Daemon) openCgroups() error {
	id, err := loadInstanceID(d.layout.StateDir)
	if err != nil {
		return err
	}
	d.instanceID = id
	if d.cgCfg != nil {
		cc := *d.cgCfg
		cc.Owner = id
		m, err := cgroup.New(cc)
		if err != nil {
			return fmt.Errorf("cgroups (set cgroup.enabled: false to run without isolation): %w", err)
		}
		d.cg = m
	}
	if d.opts.wrapCgroups != nil {
		d.cg = d.opts.wrapCgroups(d.cg)
	}
	d.log.Info("instance id", "instance_id", id, "state_dir", d.layout.StateDir)
	return nil
}

// adoptLeases takes back the leases of the saved state after a restart:
// each keeps its capacity on its instance and its cgroup, and waits for
// its launcher to resume it. One whose launcher does not come back within
// the grace is released like any abandoned lease. Lease cgroups under this
// mpsd's id that no saved lease owns are removed when empty; one with
// processes is a workload the state file failed to record (it could not
// be written, it was truncated or lost), and is re-adopted as well
// (adoptLeftovers): nothing is killed at start. Cgroups of other ids
// under the parent are never touched. The operator's drains and
// quarantines are put back first, before any instance takes a lease.
func (d *Daemon) adoptLeases(saved savedState) {
	owned := map[cgroup.LeaseID]bool{}
	// The config may have dropped a uid from its group while mpsd was down
	// (membership.go): its credentials are looked up before the lock.
	creds := map[uint32]policy.Credentials{}
	for _, sl := range saved.Leases {
		if _, ok := creds[sl.UID]; !ok {
			creds[sl.UID] = memberCredentials(sl.UID)
		}
	}
	d.mu.Lock()
	for key, off := range saved.ServerLogs {
		if in, ok := d.instances[key]; ok {
			in.serverLogOff = off
		}
	}
	for key, servers := range saved.Servers {
		if in, ok := d.instances[key]; ok {
			in.savedServers = servers
		}
	}
	for key, sd := range saved.Daemons {
		if in, ok := d.instances[key]; ok && sd.PID > 0 {
			in.savedDaemon = &mps.DaemonIdentity{PID: sd.PID, StartTime: sd.StartTime}
		}
	}
	if saved.Daemons == nil && (len(saved.ServerLogs) > 0 || len(saved.Servers) > 0 || len(saved.Leases) > 0) {
		d.log.Info("state file has no MPS daemon identities (written by an older mpsd); each instance adopts the verified holder of its control_lock")
	}
	d.applyIntentLocked(saved)
	var drop, revoking []*lease
	for _, sl := range saved.Leases {
		in, ok := d.instances[sl.Instance]
		l := &lease{
			id: sl.ID, group: sl.Group, uid: sl.UID, command: sl.Command, jobID: sl.JobID, revokedFor: sl.RevokedFor,
			req:     policy.Request{Group: sl.Group, UID: sl.UID, SM: sl.SM, Mem: sl.MemBytes, GPUs: sl.GPUs, Procs: max(sl.Procs, 1), Priority: sl.Priority, Seq: sl.Seq, Only: sl.Only},
			requeue: sl.Requeue, spared: sl.Spared, attempt: sl.Attempt, cgAttempt: sl.Attempt, created: sl.Created, queuedAt: sl.Created, box: newMailbox(d.log),
			awaySince: sl.AwaySince, ranAttempt: sl.Ran, log: d.log, grantedAt: sl.Granted,
		}
		if l.awaySince.IsZero() {
			l.awaySince = d.clock.Now()
		}
		if sl.Adopted {
			d.dur.orphans[l.id] = true
		}
		// Clamped both ways: a clock stepped back must not lengthen it.
		grace := min(d.opts.ReconnectGrace, max(0, d.opts.ReconnectGrace-d.clock.Since(l.awaySince)))
		d.seq = max(d.seq, sl.Seq)
		id := cgroup.LeaseID{Group: sl.Group, Lease: sl.ID}
		owned[id] = true
		if cg, err := d.cg.Open(id); err == nil {
			l.cg = cg
		}
		if sl.Queued {
			if _, known := d.cfg.Group(sl.Group); !known {
				d.log.Warn("saved queued lease's group is gone from the config; dropping it", "lease", sl.ID)
				d.recordEnded(l, api.EndedGroupRemoved, "its group left the config while mpsd was down")
				continue
			}
			// Only a requeue moves a lease past its first attempt.
			l.req.Requeued = sl.Attempt > 1
			d.leases[l.id] = l
			if _, err := d.cfg.Access.Choose(creds[sl.UID], sl.Group); err != nil {
				// Kept off the queue, so nothing places it; its launcher's
				// resume is refused with the reason (resume), or its grace
				// releases it.
				d.log.Info("saved queued request not queued: its uid is no longer a member of its group; its resume will be refused", l.logAttrs("group", sl.Group)...)
			} else {
				d.queues[l.group] = append(d.queues[l.group], l)
			}
			l.grace = d.clock.AfterFunc(grace, func() { d.spawn(func() { d.graceOver(l) }) })
			continue
		}
		// Taken up in the state it was saved in: running, or revoking
		// when the previous mpsd died in the middle of revoking it.
		l.state = leaseRunning
		if sl.Revoking {
			l.state = leaseRevoking
			l.spareNext = sl.Spare
			if sl.EndCode != "" {
				l.endWith = &api.Error{Code: sl.EndCode, Message: sl.EndMessage}
			}
		}
		if !ok {
			// Its instance left the config while mpsd was down: the lease
			// cannot be accounted anywhere, so it ends.
			d.log.Warn("saved lease's instance is gone from the config; ending it", "lease", sl.ID, "instance", sl.Instance)
			d.recordEnded(l, api.EndedRevoked, "its instance left the config while mpsd was down")
			drop = append(drop, l)
			continue
		}
		in.p.Assign(&l.req)
		in.leases[l.id] = l
		l.inst = in
		d.leases[l.id] = l
		if _, err := d.cfg.Access.Choose(creds[sl.UID], sl.Group); err != nil {
			l.logger().Info("running lease kept until it ends: its uid is no longer a member of its group; its command is not revoked, a resume after an mpsd restart is refused",
				l.logAttrs("group", l.group, "attempt", l.attempt)...)
		}
		l.grace = d.clock.AfterFunc(grace, func() { d.spawn(func() { d.graceOver(l) }) })
		if l.state == leaseRevoking {
			revoking = append(revoking, l)
		}
	}
	d.mu.Unlock()
	for _, l := range drop {
		if err := d.killLease(l); err != nil {
			d.log.Error("end lease of a removed instance", "lease", l.id, "err", err)
		}
	}
	for _, l := range revoking {
		d.log.Warn("finishing the revocation the previous mpsd began", "lease", l.id, "reason", l.revokedFor)
		d.revoke([]*lease{l}, l.revokedFor, revokeHow{finish: true})
	}
	d.adoptLeftovers(owned)
	others, err := d.cg.Unowned()
	if err != nil {
		d.log.Error("list cgroups under the parent", "err", err)
	}
	for _, c := range others {
		d.log.Warn("cgroup under parent is not ours; left alone", "cgroup", c, "instance_id", d.instanceID)
	}
	d.mu.Lock()
	adopted := len(d.leases)
	d.mu.Unlock()
	if adopted > 0 {
		d.log.Info("leases re-adopted; waiting for their launchers", "leases", adopted, "grace", d.opts.ReconnectGrace)
		d.spawn(d.reapAdopted)
	}
}

// reapAdoptedEvery is how often re-adopted leases without a launcher are
// checked for an empty cgroup.
const reapAdoptedEvery = 250 * time.Millisecond

// reapAdoptedAfter is how long after mpsd's start the first check waits:
// a launcher that is there resumes its lease within it and tells its
// command's end itself (the chaos soak met a lease released 28 ms after a
// restart, a millisecond before its launcher resumed it and was told it
// was unknown); the check is for launchers that are gone.
const reapAdoptedAfter = 2 * time.Second

// reapAdopted releases re-adopted leases whose launcher has not resumed
// them and whose cgroup has emptied: the command ended while mpsd was
// away (or while its launcher was still reconnecting), so nothing is left
// to wait for. It returns once every re-adopted lease is resumed or gone.
func (d *Daemon) reapAdopted() {
	select {
	case <-d.ctx.Done():
		return
	case <-d.after(reapAdoptedAfter):
	}
	t := d.clock.NewTicker(reapAdoptedEvery)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C():
		}
		d.mu.Lock()
		var waiting []*lease
		for _, l := range d.leases {
			if l.grace != nil && !l.bound && l.state == leaseRunning {
				waiting = append(waiting, l)
			}
		}
		d.mu.Unlock()
		if len(waiting) == 0 {
			return
		}
		for _, l := range waiting {
			l.cgMu.Lock()
			empty := false
			switch {
			case l.cg != nil:
				pids, err := l.cg.Pids()
				empty = err == nil && len(pids) == 0
			case d.cgCfg != nil:
				// No cgroup: an attempt that ran had its command in it,
				// so with the cgroup gone the command is gone too (its
				// release was done, not yet written, when mpsd went).
				_, err := d.cg.Open(cgroup.LeaseID{Group: l.group, Lease: l.id})
				empty = errors.Is(err, cgroup.ErrNotExist)
			}
			l.cgMu.Unlock()
			if empty && d.settled(l) {
				d.log.Info("re-adopted lease's command has ended; releasing it", "lease", l.id)
				d.releaseIf(l, releaseEndedAway, true)
			}
		}
	}
}

// settled reports whether a re-adopted lease whose cgroup has emptied
// ended on its own: its current attempt ran (a lease granted again while
// its launcher was away has an empty cgroup but ran nothing yet), its
// instance is up, every fault its MPS daemon has
// logged so far (those of mpsd's downtime included) is handled, and none
// is revoking the lease. A command killed by such a fault is the fault's
// victim, to be requeued, not a job that finished.
func (d *Daemon) settled(l *lease) bool {
	d.mu.Lock()
	in := l.inst
	var dm control
	if in != nil && in.life == instUp && l.ranAttempt == l.attempt {
		dm = in.daemon
	}
	d.mu.Unlock()
	if dm == nil {
		return false
	}
	select {
	case <-dm.Barrier():
	case <-d.ctx.Done():
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return l.inst == in && in.daemon == dm && in.life == instUp && l.state == leaseRunning && !l.bound && l.ranAttempt == l.attempt
}

// graceOver releases a re-adopted lease whose launcher never came back.
func (d *Daemon) graceOver(l *lease) {
	d.mu.Lock()
	bound := l.bound
	d.mu.Unlock()
	if !bound {
		d.log.Warn("launcher did not resume its lease; releasing it", "lease", l.id)
		d.releaseIf(l, "launcher did not reconnect", true)
	}
}
