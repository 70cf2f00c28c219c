package mps

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

// logFollower follows control.log like `tail -F`: it notices truncation
// (copytruncate rotation) and replacement (rename rotation). The daemon keeps
// its log open and never reopens it, so after a rename it goes on writing to
// the renamed file; the follower keeps draining that previous file too.
type logFollower struct {
	path    string
	log     *slog.Logger
	onLine  func(line string, start int64)
	cur     *tailFile
	prev    *tailFile
	initOff int64
	// stop is run's: a follower behind a flood of lines (each may cost a
	// check through /proc) stops reading once it is closed, rather than
	// holding Close until the flood ends.
	stop <-chan struct{}
}

type tailFile struct {
	f       *os.File
	ino     uint64
	off     int64
	partial []byte
}

func newLogFollower(path string, startOff int64, log *slog.Logger, onLine func(line string, start int64)) *logFollower {
	return &logFollower{path: path, log: log, onLine: onLine, initOff: startOff}
}

// run watches the log's directory until stop is closed. Watching the
// directory, not the file, is what survives the file being replaced.
func (lf *logFollower) run(stop <-chan struct{}, ready chan<- error) {
	lf.stop = stop
	sub, err := dirWatches.subscribe(filepath.Dir(lf.path))
	if err != nil {
		ready <- err
		return
	}
	defer dirWatches.unsubscribe(sub)
	defer lf.closeFiles()
	lf.sync()
	close(ready)
	for {
		select {
		case <-stop:
			return
		case <-sub.changed:
			// Any change in the directory may concern our file under its
			// old or new name; a sync is a stat and a short read.
			lf.sync()
		case err := <-sub.errs:
			lf.log.Warn("mps: log follower", "path", lf.path, "err", err)
			lf.sync()
		}
	}
}

func (lf *logFollower) closeFiles() {
	for _, t := range []*tailFile{lf.prev, lf.cur} {
		if t != nil {
			t.f.Close()
		}
	}
	lf.prev, lf.cur = nil, nil
}

// sync reads whatever is new in the followed files.
func (lf *logFollower) sync() {
	if lf.prev != nil {
		lf.drain(lf.prev)
	}
	if lf.cur != nil {
		lf.drain(lf.cur)
	}
	fi, err := os.Stat(lf.path)
	if err != nil {
		return // removed or not yet created: keep draining the open file
	}
	ino := inode(fi)
	if lf.cur != nil && lf.cur.ino == ino {
		return
	}
	f, err := os.Open(lf.path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			lf.log.Warn("mps: log follower: open", "path", lf.path, "err", err)
		}
		return
	}
	off := int64(0)
	if lf.cur == nil && lf.prev == nil {
		// First open: skip what was there before the daemon of interest.
		off = min(lf.initOff, fi.Size())
	}
	if lf.prev != nil {
		lf.prev.f.Close()
	}
	lf.prev = lf.cur
	lf.cur = &tailFile{f: f, ino: ino, off: off}
	lf.drain(lf.cur)
}

func (lf *logFollower) drain(t *tailFile) {
	if fi, err := t.f.Stat(); err == nil && fi.Size() < t.off {
		t.off, t.partial = 0, nil // truncated in place
	}
	buf := make([]byte, 32<<10)
	for !lf.stopped() {
		n, err := t.f.ReadAt(buf, t.off)
		if n > 0 {
			t.off += int64(n)
			lf.emit(t, buf[:n])
		}
		if err != nil || n == 0 {
			if err != nil && !errors.Is(err, io.EOF) {
				lf.log.Warn("mps: log follower: read", "path", lf.path, "err", err)
			}
			return
		}
	}
}

func (lf *logFollower) emit(t *tailFile, data []byte) {
	// data was just read and ends at t.off: the pending partial line
	// starts before it.
	start := t.off - int64(len(data)) - int64(len(t.partial))
	t.partial = append(t.partial, data...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		// A writer without O_APPEND leaves NULs after a copytruncate.
		line := bytes.Trim(t.partial[:i], "\x00\r")
		t.partial = t.partial[i+1:]
		if len(line) > 0 && !lf.stopped() {
			lf.onLine(string(line), start)
		}
		start += int64(i) + 1
	}
	if len(t.partial) > 1<<20 {
		t.partial = nil // not a log line; don't grow without bound
	}
	t.partial = bytes.Clone(t.partial)
}

// stopped reports whether the follower was told to stop.
func (lf *logFollower) stopped() bool {
	select {
	case <-lf.stop:
		return true
	default:
		return false
	}
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
