package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a Watcher waits after the last event on the
// config before reading it: long enough for an editor's or a deployment
// tool's burst of writes, renames and deletes to end.
const DefaultDebounce = 100 * time.Millisecond

// Reload is the outcome of one reload attempt, as given to
// WatchOptions.OnReload.
type Reload struct {
	// Config is in force after the attempt: the new config, or the
	// previous one when the attempt failed.
	Config *Config
	// Previous was in force before the attempt.
	Previous *Config
	// Changes from Previous to Config; empty on failure.
	Changes Changes
	// Err says why the attempt failed (a *ConfigError, or the file could
	// not be read), or is nil.
	Err error
}

// WatchOptions tune a Watcher.
type WatchOptions struct {
	// Debounce is the quiet time after the last event before a reload;
	// zero means DefaultDebounce.
	Debounce time.Duration
	// OnReload, if set, is called after each reload attempt from the
	// goroutine running Run, so a slow callback delays the next reload.
	// It is not called when the file's content did not change.
	OnReload func(Reload)
}

// Watcher keeps the config in force and replaces it when its file changes
// and the new content is valid. It watches the file's directory, not the
// file, so it follows every way of replacing a file: rename over it,
// truncate and write, delete and recreate, editors' backup-and-swap
// dances; and Kubernetes ConfigMap updates, which swap a "..data" link.
// Events on other names (vim's 4913 and .swp, "~" backups, temporaries)
// are ignored. Every reload parses into a fresh viper and validates
// against the same Host before the atomic swap, so a half-written or bad
// file is never applied; the last good config stays and the error is
// reported.
type Watcher struct {
	path, dir, name string
	host            Host
	debounce        time.Duration
	onReload        func(Reload)

	cur     atomic.Pointer[Config]
	running atomic.Bool

	// Owned by the goroutine running Run: the bytes of the last attempt,
	// so unchanged content (touch, identical rewrite) costs nothing.
	last     []byte
	haveLast bool
}

// NewWatcher loads the config at path, which must be valid (see
// LoadFile); Run then keeps it current.
func NewWatcher(path string, h Host, opts WatchOptions) (*Watcher, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("policy: config path %s: %w", path, err)
	}
	data, err := readFile(abs)
	if err != nil {
		return nil, err
	}
	cfg, err := parseBytes(data, h)
	if err != nil {
		return nil, withPath(err, abs)
	}
	w := &Watcher{
		path:     abs,
		dir:      filepath.Dir(abs),
		name:     filepath.Base(abs),
		host:     h,
		debounce: opts.Debounce,
		onReload: opts.OnReload,
		last:     data,
		haveLast: true,
	}
	if w.debounce <= 0 {
		w.debounce = DefaultDebounce
	}
	w.cur.Store(cfg)
	return w, nil
}

// Config returns the config in force. It is safe to call from any
// goroutine; the result must not be modified.
func (w *Watcher) Config() *Config { return w.cur.Load() }

// Run watches the config until ctx is done, then returns nil. It returns
// an error if the directory cannot be watched, or one wrapping
// ErrWatchStopped if it is removed or renamed (edits could no longer be
// seen). The config in force stays either way. Run may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("policy: Watcher.Run called twice")
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policy: watch config: %w", err)
	}
	defer fw.Close()
	if err := fw.Add(w.dir); err != nil {
		return fmt.Errorf("policy: watch config directory %s: %w", w.dir, err)
	}
	// The file may have changed between NewWatcher and Add.
	w.reload()

	timer := time.NewTimer(w.debounce)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return fmt.Errorf("%w: event stream of %s closed", ErrWatchStopped, w.dir)
			}
			if filepath.Clean(ev.Name) == w.dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				return fmt.Errorf("%w: config directory %s was removed or renamed", ErrWatchStopped, w.dir)
			}
			if filepath.Dir(ev.Name) == w.dir && relevantName(filepath.Base(ev.Name), w.name) {
				timer.Reset(w.debounce)
			}
		case _, ok := <-fw.Errors:
			if !ok {
				return fmt.Errorf("%w: error stream of %s closed", ErrWatchStopped, w.dir)
			}
			// Most likely an event queue overflow, which loses events:
			// look at the file in case one was ours.
			timer.Reset(w.debounce)
		case <-timer.C:
			w.reload()
		}
	}
}

// relevantName says whether an event on a directory entry may have
// changed the config file called config.
func relevantName(entry, config string) bool {
	// A Kubernetes ConfigMap volume replaces all files at once by
	// swapping the ..data link that config links through.
	return entry == config || entry == "..data"
}

// reload reads the file and swaps in its config if it changed and is
// valid, reporting the outcome.
func (w *Watcher) reload() {
	prev := w.cur.Load()
	data, err := readFile(w.path)
	if err != nil {
		// Forget the content, so the file coming back unchanged is
		// reported as a successful reload.
		w.last, w.haveLast = nil, false
		w.report(Reload{Config: prev, Previous: prev, Err: err})
		return
	}
	if w.haveLast && bytes.Equal(data, w.last) {
		return
	}
	w.last, w.haveLast = data, true
	cfg, err := parseBytes(data, w.host)
	if err != nil {
		w.report(Reload{Config: prev, Previous: prev, Err: withPath(err, w.path)})
		return
	}
	w.cur.Store(cfg)
	w.report(Reload{Config: cfg, Previous: prev, Changes: Diff(prev, cfg)})
}

func (w *Watcher) report(r Reload) {
	if w.onReload != nil {
		w.onReload(r)
	}
}
