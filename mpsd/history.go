package mpsd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apihttp"
)

// The history (docs/architecture.md#the-history): every ended lease is one
// JSON line (api.HistoryRecord) appended to state_dir/history.jsonl.
//
//   - Durable: a batch of records is written into the file (write(2):
//     the kernel has it, whatever becomes of mpsd) before any of its
//     leases' ends is reported (the end's log line, the launcher's answer
//     or error event), so a SIGKILL of mpsd loses no ended lease it
//     reported; it is fsynced within historySyncDelay (100 ms), off the
//     end path and once for a burst, so a crash of the host loses at most
//     the last 100 ms of ends. A crash
//     mid-write leaves at most a torn last line, which the next mpsd drops
//     at its start (openHistory).
//   - Bounded: once the live file would pass its bound it is renamed to
//     history.1.jsonl (replacing the one before) and a new one begun, so
//     the two hold at most twice the bound.
//   - Shared fairly: a uid's records take at most a historyUserShare-th
//     of the live file's bound. A record that would pass it compacts the
//     file first (compact): the uid's oldest records are removed until
//     it holds half its share (counted, and logged once per uid until the
//     next rotation), so one tenant's flood of tiny jobs cannot push
//     everyone else's history out, and no uid (root's, whose leases
//     include every pod's of the device plugin) ever stops being recorded.
//   - Off the end path: the ending lease's record is made under
//     Daemon.mu and handed to the writer's goroutine, which writes what
//     has gathered with one write, releases its waiters, and fsyncs within
//     historySyncDelay; no lock of the daemon is held across them, nor
//     while a line is logged.
//   - Not a condition: a file that cannot be opened (at the start, or
//     after a failed write) leaves mpsd running without it, its records
//     counted as dropped, mpsd_history_writable 0, and the writer opens
//     it again at its next write.

// DefaultHistoryMaxBytes bounds the live history file (history.jsonl):
// about 20,000 ended leases of 400 bytes.
const DefaultHistoryMaxBytes = 8 << 20

// historyUserShare: one uid's records may take at most 1/historyUserShare
// of the live file's bound.
const historyUserShare = 4

// maxHistoryPending bounds the records waiting for the writer (about a
// kilobyte each in memory): more than the leases a host holds at once,
// so only a writer stuck on a disk that does not answer meets it; beyond
// it a record is dropped and counted.
const maxHistoryPending = 16384

// historyDropLogEvery: a record dropped before it reached the writer (see
// add) is logged at most once in this period, with the count since the
// line before.
const historyDropLogEvery = time.Minute

// maxHistoryLine bounds one record's line as the reader takes it: longer
// lines are not mpsd's and are skipped.
const maxHistoryLine = 64 << 10

// Names of the history files in state_dir.
const (
	historyLive    = "history.jsonl"
	historyRotated = "history.1.jsonl"
	historyCompact = "history.jsonl.new" // compact's, renamed over historyLive
)

// Why a record was dropped (mpsd_history_records_dropped_total's reason).
const (
	historyDropShare   = "user_share"
	historyDropPending = "queue_full"
	historyDropWrite   = "write_failed"
)

var (
	descHistoryWritten  = prometheus.NewDesc("mpsd_history_records_total", "Ended leases written to the history file (state_dir/history.jsonl).", nil, nil)
	descHistoryDropped  = prometheus.NewDesc("mpsd_history_records_dropped_total", "Ended leases not written to the history file, or removed from it, by reason: user_share (an old record of a uid whose records took its share of the file's bound, removed to make room for its new ones), queue_full (the writer is stuck, or mpsd is stopping), write_failed (the file cannot be opened or written, or its fsync failed).", []string{"reason"}, nil)
	descHistoryBytes    = prometheus.NewDesc("mpsd_history_bytes", "Size of the live history file; it is rotated at its bound.", nil, nil)
	descHistoryWritable = prometheus.NewDesc("mpsd_history_writable", "1 while the history file is open and its last write succeeded, 0 while it cannot be opened or written (ended leases are not recorded; the writer tries again at each write).", nil, nil)
)

// historyEntry is one record on its way to the file: once it is on disk
// (or dropped) after runs (the end's log line), then done is closed.
type historyEntry struct {
	rec   api.HistoryRecord
	done  chan struct{}
	after func()
}

// history is the writer of the history file: add queues a record, the
// goroutine run starts writes and fsyncs what has gathered.
type history struct {
	dir      string
	maxBytes int64
	log      *slog.Logger

	mu      sync.Mutex
	pending []historyEntry
	closed  bool // stop was called: add writes nothing more
	kick    chan struct{}
	stop    chan struct{}
	stopped chan struct{}

	// fileMu is held by the writer while it rotates, and by a reader
	// while it opens the two files, so a reader never sees the live file
	// renamed and not yet replaced.
	fileMu sync.RWMutex
	// readMu lets one query read the files at a time: a tenant asking
	// again and again costs mpsd at most one core.
	readMu sync.Mutex

	// The writer's own (run's goroutine, or openHistory before it runs).
	f        *os.File
	size     int64
	uidBytes map[uint32]int64
	over     map[uint32]bool // logged as over its share since the last rotation

	lastErr string
	started bool // guarded by mu

	// Records add dropped since the last line that said so, and when that
	// line was left; guarded by mu.
	unlogged    uint64
	unloggedWhy string
	dropLogged  time.Time

	written, size64                   atomic.Int64
	dropShare, dropPending, dropWrite atomic.Uint64
	writable                          atomic.Bool
}

// openHistory opens (or creates) dir's live history file, drops a torn
// last line a crash left (anything after the last newline, and a last
// line that is no record), and counts each uid's bytes in it. It starts
// nothing; start does. The history is returned with the error too: one
// whose file cannot be opened records nothing, and opens it at its
// writer's next write (write).
func openHistory(dir string, maxBytes int64, log *slog.Logger) (*history, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultHistoryMaxBytes
	}
	h := &history{dir: dir, maxBytes: maxBytes, log: log, kick: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
		uidBytes: map[uint32]int64{}, over: map[uint32]bool{}}
	if err := h.reopen(); err != nil {
		h.lastErr = err.Error() // said by the caller; the writer says it again only when it changes
		return h, err
	}
	return h, nil
}

// reopen opens the live file: at the start, after a failed write (dropping
// what it may have left after the last whole record), or after a start
// that could not open it. A compaction's leftover (a crash in the middle
// of one) is removed.
func (h *history) reopen() error {
	path := filepath.Join(h.dir, historyLive)
	if err := os.Remove(filepath.Join(h.dir, historyCompact)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("mpsd: open history %s: remove a compaction's leftover: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		h.writable.Store(false)
		return fmt.Errorf("mpsd: open history %s: %w", path, err)
	}
	uidBytes := map[uint32]int64{}
	good, torn, err := scanHistory(f, uidBytes)
	if err == nil && torn > 0 {
		h.log.Warn("history: a torn last record (mpsd stopped while writing it) dropped", "path", path, "bytes", torn)
		err = f.Truncate(good)
		if err == nil {
			err = f.Sync()
		}
	}
	if err == nil {
		// Its name, once: a record synced into a file whose entry a power
		// loss took would be lost with it.
		err = syncDir(h.dir)
	}
	if err != nil {
		_ = f.Close()
		h.writable.Store(false)
		return fmt.Errorf("mpsd: open history %s: %w", path, err)
	}
	h.f, h.size, h.uidBytes = f, good, uidBytes
	h.size64.Store(good)
	h.writable.Store(true)
	return nil
}

// scanHistory reads the live file: good is the length of its whole
// records, torn how many bytes follow them; each uid's bytes are counted
// in uidBytes.
func scanHistory(f *os.File, uidBytes map[uint32]int64) (good, torn int64, err error) {
	r := bufio.NewReaderSize(f, 64<<10)
	var off int64
	for {
		line, err := r.ReadSlice('\n')
		for errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: not one of mpsd's records,
			// but whole lines are kept (a reader skips them).
			var more []byte
			more, err = r.ReadSlice('\n')
			line = append(append([]byte(nil), line...), more...)
		}
		n := int64(len(line))
		if errors.Is(err, io.EOF) {
			if n > 0 {
				return off, n, nil
			}
			return off, 0, nil
		}
		if err != nil {
			return 0, 0, err
		}
		// Only the last line may be torn (a crash between its write and
		// its fsync can leave garbage there): it is decoded whole; the
		// others need only their uid.
		_, perr := r.Peek(1)
		last := errors.Is(perr, io.EOF)
		uid, ok := recordUID(line)
		if last && ok {
			var rec api.HistoryRecord
			ok = json.Unmarshal(line, &rec) == nil
		}
		if !ok {
			// A line that is no record: torn if it is the last one, kept
			// and skipped by readers if not.
			if last {
				return off, n, nil
			}
		} else {
			uidBytes[uid] += n
		}
		off += n
	}
}

// start runs the writer; close ends it once what was added is written.
func (h *history) start() {
	h.mu.Lock()
	h.started = true
	h.mu.Unlock()
	go h.run()
}

// close writes what is pending, closes the file and returns once the
// writer has ended. A record added after it is dropped.
func (h *history) close() {
	h.mu.Lock()
	was := h.closed
	h.closed = true
	started := h.started
	h.mu.Unlock()
	if was {
		return
	}
	if started {
		close(h.stop)
		<-h.stopped
	} else {
		h.flush()
	}
	if h.f != nil {
		_ = h.f.Close()
		h.f = nil
	}
}

// add queues rec and returns a channel closed once it is on disk (or
// dropped: the write failed); after, when not nil, runs on the writer's
// goroutine once it is, before the channel is closed. It never blocks and
// never logs: the caller may hold Daemon.mu. A record that cannot be
// queued (the history is closed, or its writer maxHistoryPending records
// behind) is dropped at once and counted: add returns dropped, the
// channel closed and after not run (the caller writes the end's line
// itself once it lets go of its lock), and dropLine says when to log it.
func (h *history) add(rec api.HistoryRecord, after func()) (done <-chan struct{}, dropped bool) {
	e := historyEntry{rec: rec, done: make(chan struct{}), after: after}
	h.mu.Lock()
	if h.closed || len(h.pending) >= maxHistoryPending {
		h.unloggedWhy = "mpsd is stopping: its history is closed"
		if !h.closed {
			h.unloggedWhy = fmt.Sprintf("the history's writer is %d records behind", maxHistoryPending)
		}
		h.unlogged++
		h.mu.Unlock()
		h.dropPending.Add(1)
		close(e.done)
		return e.done, true
	}
	h.pending = append(h.pending, e)
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default:
	}
	return e.done, false
}

// dropLine is the Error line's attributes that say how many records add
// dropped since the line before, and why the last was, when one is due at
// now (at most one each historyDropLogEvery); ok is false when none is.
func (h *history) dropLine(now time.Time) (attrs []any, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unlogged == 0 || (!h.dropLogged.IsZero() && now.Sub(h.dropLogged) < historyDropLogEvery) {
		return nil, false
	}
	attrs = []any{"dropped", h.unlogged, "why", h.unloggedWhy, "dir", h.dir}
	h.unlogged, h.dropLogged = 0, now
	return attrs, true
}

// run writes whatever has gathered each time it is kicked, until stop.
func (h *history) run() {
	defer close(h.stopped)
	// The fsync of what was written waits up to historySyncDelay for
	// more: a burst of ends costs one, not one each.
	sync := time.NewTimer(time.Hour)
	sync.Stop()
	defer sync.Stop()
	syncing := false
	for {
		select {
		case <-h.kick:
			if h.flush() && !syncing {
				sync.Reset(historySyncDelay)
				syncing = true
			}
		case <-sync.C:
			syncing = false
			h.sync()
		case <-h.stop:
			h.flush()
			h.sync()
			return
		}
	}
}

// recordUID is the uid of a history line as this mpsd writes it (the
// first "uid": key; inside a JSON string every quote is escaped, so no
// value can hold it), or the whole line decoded when that finds none;
// false for a line that is no record (a torn tail).
func recordUID(line []byte) (uint32, bool) {
	if i := bytes.Index(line, []byte(`"uid":`)); i >= 0 {
		v, n := uint64(0), 0
		for _, c := range line[i+len(`"uid":`):] {
			if c < '0' || c > '9' || n == 10 {
				break
			}
			v, n = v*10+uint64(c-'0'), n+1
		}
		if n > 0 && v <= math.MaxUint32 {
			return uint32(v), true
		}
	}
	var rec api.HistoryRecord
	if json.Unmarshal(line, &rec) != nil {
		return 0, false
	}
	return rec.UID, true
}

// historySyncDelay bounds how long records written into the history file
// wait for their fsync: what a crash of the host (not of mpsd) can lose.
const historySyncDelay = 100 * time.Millisecond

// sync fsyncs what was written into the live file.
func (h *history) sync() {
	if h.f == nil {
		return
	}
	if err := h.f.Sync(); err != nil {
		// Written, not synced: the records survive mpsd, not a crash of
		// the host. Reopened (and a torn tail dropped) before the next
		// write.
		h.writable.Store(false)
		h.log.Error("history: fsync failed; the last records may not survive a crash of the host", "dir", h.dir, "err", err)
		_ = h.f.Close()
		h.f = nil
	}
}

// flush writes the pending records with one write (two and a rotation
// when they pass the bound) and releases their waiters, and reports
// whether it wrote any: what write(2) put in the file survives any end of
// mpsd, and run fsyncs it within historySyncDelay, off the ends' path.
func (h *history) flush() bool {
	h.mu.Lock()
	batch := h.pending
	h.pending = nil
	h.mu.Unlock()
	if len(batch) == 0 {
		return false
	}
	var buf bytes.Buffer
	kept := 0
	err := func() error {
		for _, e := range batch {
			line, err := json.Marshal(e.rec)
			if err != nil {
				return fmt.Errorf("encode record of lease %s: %w", e.rec.Lease, err)
			}
			line = append(line, '\n')
			n := int64(len(line))
			if h.size+int64(buf.Len())+n > h.maxBytes && h.size+int64(buf.Len()) > 0 {
				if err := h.write(buf.Bytes()); err != nil {
					return err
				}
				buf.Reset()
				if err := h.rotate(); err != nil {
					return err
				}
			}
			if share := h.maxBytes / historyUserShare; h.uidBytes[e.rec.UID]+n > share {
				// The uid's oldest records make room for its newest.
				if err := h.write(buf.Bytes()); err != nil {
					return err
				}
				buf.Reset()
				removed, err := h.compact(e.rec.UID, share/2)
				if err != nil {
					return err
				}
				h.dropShare.Add(removed)
				if !h.over[e.rec.UID] {
					h.over[e.rec.UID] = true
					h.log.Warn("history: the uid's records take its share of the history file; its oldest records are removed to make room for its newest",
						"uid", e.rec.UID, "user", e.rec.User, "share_bytes", share, "removed", removed, "path", filepath.Join(h.dir, historyLive))
				}
				if h.uidBytes[e.rec.UID]+n > share {
					// One record longer than the share: never recorded.
					h.dropShare.Add(1)
					continue
				}
			}
			h.uidBytes[e.rec.UID] += n
			buf.Write(line)
			kept++
		}
		return h.write(buf.Bytes())
	}()
	if err != nil {
		h.dropWrite.Add(uint64(kept))
		h.writable.Store(false)
		if err.Error() != h.lastErr {
			h.log.Error("history: ended leases not recorded: the history file cannot be written", "dir", h.dir, "err", err)
			h.lastErr = err.Error()
		}
	} else {
		if h.lastErr != "" {
			h.log.Info("history: the history file is written again", "dir", h.dir)
		}
		h.lastErr = ""
		h.writable.Store(true)
		h.written.Add(int64(kept))
	}
	for _, e := range batch {
		// The end's log line first: whoever waits on done sees it written.
		if e.after != nil {
			e.after()
		}
		close(e.done)
	}
	return err == nil && kept > 0
}

// write appends b to the live file (flush fsyncs it once the batch's
// waiters are released; rotate and compact before they replace it).
func (h *history) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if h.f == nil {
		if err := h.reopen(); err != nil {
			return err
		}
	}
	n, err := h.f.Write(b)
	h.size += int64(n)
	if err != nil {
		// Reopened (and a torn tail dropped) before the next write.
		_ = h.f.Close()
		h.f = nil
		return fmt.Errorf("append records: %w", err) // err names the file
	}
	h.size64.Store(h.size)
	return nil
}

// compact rewrites the live file without uid's oldest records, as many
// as leave it keep bytes at most, through historyCompact renamed over it:
// a reader sees the whole file before or after, a crash leaves one of the
// two (and a leftover the next open removes). It returns how many it
// removed. Everyone else's records, and lines that are no record, stay.
func (h *history) compact(uid uint32, keep int64) (removed uint64, err error) {
	// (A compaction reads every record's uid: recordUID, not a decode of
	// the whole record, which cost the admission benchmark's writer most
	// of its time.)
	live, tmp := filepath.Join(h.dir, historyLive), filepath.Join(h.dir, historyCompact)
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
			err = fmt.Errorf("compact %s: %w", live, err)
		}
	}()
	if h.f == nil {
		// A failed write may have left a torn tail: dropped first, or
		// the next record would follow it on its line.
		if err := h.reopen(); err != nil {
			return 0, err
		}
	}
	src, err := os.OpenFile(live, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, err
	}
	over := h.uidBytes[uid] - keep
	uidBytes := map[uint32]int64{}
	var size int64
	w := bufio.NewWriterSize(dst, 64<<10)
	r := bufio.NewReaderSize(src, 64<<10)
	for {
		line, rerr := r.ReadSlice('\n')
		for errors.Is(rerr, bufio.ErrBufferFull) {
			var more []byte
			more, rerr = r.ReadSlice('\n')
			line = append(append([]byte(nil), line...), more...)
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			_ = dst.Close()
			return 0, rerr
		}
		n := int64(len(line))
		if u, ok := recordUID(line); n > 0 && ok {
			if u == uid && over > 0 {
				over -= n
				removed++
				continue
			}
			uidBytes[u] += n
		}
		if _, werr := w.Write(line); werr != nil {
			_ = dst.Close()
			return 0, werr
		}
		size += n
		if rerr != nil {
			break
		}
	}
	err = w.Flush()
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	h.fileMu.Lock()
	defer h.fileMu.Unlock()
	if h.f != nil {
		_ = h.f.Close()
		h.f = nil // reopened at the next write if what follows fails
	}
	if err := os.Rename(tmp, live); err != nil {
		return 0, err
	}
	if err := syncDir(h.dir); err != nil {
		return 0, fmt.Errorf("sync its directory: %w", err)
	}
	f, err := os.OpenFile(live, os.O_RDWR|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, err
	}
	h.f, h.size, h.uidBytes = f, size, uidBytes
	h.size64.Store(size)
	return removed, nil
}

// rotate renames the live file to history.1.jsonl (replacing it) and
// begins an empty one; every uid's share starts anew.
func (h *history) rotate() error {
	live, old := filepath.Join(h.dir, historyLive), filepath.Join(h.dir, historyRotated)
	h.fileMu.Lock()
	defer h.fileMu.Unlock()
	if h.f != nil {
		// Its last records, written and not yet synced (flush syncs
		// after the batch), go to disk under the old name.
		_ = h.f.Sync()
		_ = h.f.Close()
		h.f = nil
	}
	if err := os.Rename(live, old); err != nil {
		return fmt.Errorf("rotate %s: %w", live, err)
	}
	f, err := os.OpenFile(live, os.O_RDWR|os.O_CREATE|os.O_APPEND|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("rotate %s: %w", live, err)
	}
	if err := syncDir(h.dir); err != nil {
		_ = f.Close()
		return fmt.Errorf("rotate %s: sync its directory: %w", live, err)
	}
	h.f, h.size = f, 0
	h.size64.Store(0)
	clear(h.uidBytes)
	clear(h.over)
	h.log.Info("history: rotated", "path", live, "to", old, "max_bytes", h.maxBytes)
	return nil
}

// read returns the records of the two files that q selects (and of uid
// only, when own), oldest first, at most api.MaxHistoryRecords of the
// newest. Lines that are no record (a torn one being written) are skipped.
func (h *history) read(q api.HistoryQuery, own bool, uid uint32) (api.History, error) {
	h.readMu.Lock()
	defer h.readMu.Unlock()
	h.fileMu.RLock()
	var files []*os.File
	for _, name := range []string{historyRotated, historyLive} {
		f, err := os.Open(filepath.Join(h.dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			h.fileMu.RUnlock()
			for _, f := range files {
				_ = f.Close()
			}
			return api.History{}, fmt.Errorf("mpsd: read history: %w", err)
		}
		files = append(files, f)
	}
	h.fileMu.RUnlock()
	newest := newestRecords{max: api.MaxHistoryRecords}
	var err error
	for _, f := range files {
		if err == nil {
			var only *uint32
			if own {
				only = &uid
			}
			err = readHistory(f, only, func(r api.HistoryRecord) {
				if (own && r.UID != uid) || !q.Matches(r) {
					return
				}
				newest.add(r)
			})
		}
		_ = f.Close()
	}
	if err != nil {
		return api.History{}, fmt.Errorf("mpsd: read history: %w", err)
	}
	return api.History{Records: newest.records(), Truncated: newest.truncated, OwnOnly: own}, nil
}

// newestRecords keeps the newest max records it is given: a ring whose
// next slot, once it is full, is the oldest's. Each record is copied
// once as it is added and once by records, so a query costs what it
// reads, however many records match.
type newestRecords struct {
	max       int
	recs      []api.HistoryRecord
	next      int
	truncated bool // an older record was left out
	copies    int  // records copied, for the test that keeps it linear
}

func (n *newestRecords) add(r api.HistoryRecord) {
	n.copies++
	if len(n.recs) < n.max {
		n.recs = append(n.recs, r)
		return
	}
	n.recs[n.next] = r
	n.next = (n.next + 1) % n.max
	n.truncated = true
}

// records are the kept ones, oldest first (never nil).
func (n *newestRecords) records() []api.HistoryRecord {
	out := make([]api.HistoryRecord, 0, len(n.recs))
	out = append(out, n.recs[n.next:]...)
	out = append(out, n.recs[:n.next]...)
	n.copies += len(out)
	return out
}

// readHistory calls each with every record of r (of uid *only when only
// is set: the others are not decoded), skipping lines that are none
// (longer than maxHistoryLine, torn, not JSON).
func readHistory(r io.Reader, only *uint32, each func(api.HistoryRecord)) error {
	br := bufio.NewReaderSize(r, maxHistoryLine)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Too long to be a record: skipped to its end.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err == nil {
				continue
			}
			line = nil
		}
		if errors.Is(err, io.EOF) {
			// A last line without its newline is being written (or was
			// torn): not a record yet.
			return nil
		}
		if err != nil {
			return err
		}
		if only != nil {
			if u, ok := recordUID(line); ok && u != *only {
				continue
			}
		}
		var rec api.HistoryRecord
		if json.Unmarshal(line, &rec) == nil && rec.Lease != "" {
			each(rec)
		}
	}
}

// historyLocked is l's record as it ends now, how and why. d.mu is held.
func (l *lease) historyLocked(how, why string, now time.Time) api.HistoryRecord {
	r := api.HistoryRecord{Lease: l.id, JobID: l.jobID, UID: l.uid, User: l.user, Group: l.group, GPUIndexes: []int{},
		SM: l.req.SM, MemBytes: uint64(max(l.req.Mem, 0)), Procs: l.req.Clients(), Start: l.created, End: now,
		Attempts: l.attempt, Ended: how, Reason: why, ExitStatus: l.exitStatus, Signal: l.exitSignal}
	waited := l.waited
	if l.grantedAt.IsZero() || l.queuedAt.After(l.grantedAt) {
		// It ends queued: this wait counts too.
		waited += now.Sub(l.queuedAt)
	}
	if !l.grantedAt.IsZero() {
		g := l.grantedAt
		r.Granted = &g
	}
	r.WaitMillis = max(waited.Milliseconds(), 0)
	if l.inst != nil {
		r.GPUIndexes = gpuIndexes(l.inst)
	} else {
		r.GPUIndexes = append(r.GPUIndexes, l.lastGPUs...)
	}
	if l.memPeak != nil {
		p := *l.memPeak
		r.PeakMemBytes = &p
	}
	return r
}

// recordEnded appends l, which has just ended how (an api.Ended*
// constant) and why (the words of its log line), to the history: every
// path on which a lease leaves d.leases calls it, under d.mu, once. Its
// end is reported (its log line, its launcher's answer or error event)
// only once the record is on disk: see endedLocked and awaitRecorded.
func (d *Daemon) recordEnded(l *lease, how, why string) {
	d.endedLocked(l, how, why, nil, "")
}

// endedLocked is recordEnded that also writes the end's log line (msg,
// with l's attributes and more) on log once the record is on disk; no
// line when log is nil. d.mu is held.
func (d *Daemon) endedLocked(l *lease, how, why string, log *slog.Logger, msg string, more ...any) {
	var after func()
	var attrs []any
	if log != nil {
		attrs = l.logAttrs(more...)
		after = func() { log.Info(msg, attrs...) }
	}
	if d.hist == nil {
		// No history (a daemon that never ran): the line at once.
		if log != nil {
			d.mu.logAfter(log, msg, attrs...)
		}
		return
	}
	done, dropped := d.hist.add(l.historyLocked(how, why, d.clock.Now()), after)
	l.recorded = done
	if dropped {
		// Not recorded: the line (and, at most once a period, the drop's)
		// once d.mu is let go.
		if log != nil {
			d.mu.logAfter(log, msg, attrs...)
		}
		if attrs, ok := d.hist.dropLine(d.clock.Now()); ok {
			d.mu.errorAfter(d.hist.log, "history: ended leases not recorded", attrs...)
		}
	}
}

// awaitRecorded waits until l's end is in the history (or ctx ends): its
// end is reported only then.
func (d *Daemon) awaitRecorded(ctx context.Context, l *lease) {
	d.mu.Lock()
	rec := l.recorded
	d.mu.Unlock()
	if rec == nil {
		return
	}
	select {
	case <-rec:
	case <-ctx.Done():
	}
}

// releaseCommandEnded is the why of a release its launcher asked for once
// the command ended (serveRelease); releaseEndedAway, of one whose
// command ended while its launcher was away (reapAdopted).
const (
	releaseCommandEnded = "its command ended"
	releaseEndedAway    = "command ended while its launcher was away"
)

// releasedHow is how a lease released for why ended.
func releasedHow(why string) string {
	if why == releaseCommandEnded || why == releaseEndedAway {
		return api.EndedReleased
	}
	return api.EndedLauncherGone
}

// gpuIndexes are in's GPUs' indexes.
func gpuIndexes(in *instance) []int {
	out := make([]int, len(in.gpus))
	for i, g := range in.gpus {
		out[i] = g.Index
	}
	return out
}

// endedByError is how a lease a revocation ended with err ended.
func endedByError(err *api.Error) string {
	switch err.Code {
	case api.CodeUnavailable:
		return api.EndedShutdown
	case api.CodeLimitExceeded:
		return api.EndedOverLimit
	case api.CodeCancelled:
		return api.EndedCancelled
	}
	return api.EndedRevoked
}

// serveHistory answers GET /v1/history: the ended leases the query
// selects, every uid's to an admin, the caller's own to anyone else.
func (d *Daemon) serveHistory(w http.ResponseWriter, r *http.Request) {
	_, c, ok := d.credentials(r)
	q, err := api.ParseHistoryQuery(r.URL.RawQuery)
	if err != nil {
		apihttp.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	d.mu.Lock()
	admin := ok && d.cfg.Access.Admin(c)
	d.mu.Unlock()
	uid := c.UID
	if !ok {
		uid = math.MaxUint32 // nobody's records
	}
	if d.hist == nil {
		apihttp.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "the history is not open")
		return
	}
	h, err := d.hist.read(q, !admin, uid)
	if err != nil {
		apihttp.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	writeJSON(w, h)
}

// historyCollector exports the history's counters.
type historyCollector Daemon

func (c *historyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHistoryWritten
	ch <- descHistoryDropped
	ch <- descHistoryBytes
	ch <- descHistoryWritable
}

func (c *historyCollector) Collect(ch chan<- prometheus.Metric) {
	h := (*Daemon)(c).hist
	if h == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descHistoryWritten, prometheus.CounterValue, float64(h.written.Load()))
	ch <- prometheus.MustNewConstMetric(descHistoryBytes, prometheus.GaugeValue, float64(h.size64.Load()))
	writable := 0.0
	if h.writable.Load() {
		writable = 1
	}
	ch <- prometheus.MustNewConstMetric(descHistoryWritable, prometheus.GaugeValue, writable)
	for _, d := range []struct {
		reason string
		n      *atomic.Uint64
	}{{historyDropPending, &h.dropPending}, {historyDropShare, &h.dropShare}, {historyDropWrite, &h.dropWrite}} {
		ch <- prometheus.MustNewConstMetric(descHistoryDropped, prometheus.CounterValue, float64(d.n.Load()), d.reason)
	}
}
