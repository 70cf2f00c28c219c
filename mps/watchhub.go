package mps

import (
	"fmt"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// dirWatches shares one inotify instance among every log follower of the
// process. Each fsnotify.Watcher is an inotify instance, and the kernel
// allows a user 128 of them by default (fs.inotify.max_user_instances):
// a watcher per follower would put a host with 64 MPS instances (two logs
// each) past it. The hub's goroutine runs while anyone subscribes.
var dirWatches = &watchHub{subs: map[string]map[*dirSub]bool{}}

type watchHub struct {
	mu   sync.Mutex
	w    *fsnotify.Watcher
	done chan struct{} // closed when the hub's goroutine has exited
	subs map[string]map[*dirSub]bool
}

// dirSub is one subscription to a directory's changes.
type dirSub struct {
	dir string
	// changed gets a value (coalesced) after any event in the directory;
	// errs the watcher's errors, which concern every subscriber.
	changed chan struct{}
	errs    chan error
}

// subscribe starts watching dir for the caller.
func (h *watchHub) subscribe(dir string) (*dirSub, error) {
	dir = filepath.Clean(dir)
	h.mu.Lock()
	if h.w == nil {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			h.mu.Unlock()
			return nil, fmt.Errorf("mps: log follower: %w", err)
		}
		h.w, h.done = w, make(chan struct{})
		go h.run(w, h.done)
	}
	if len(h.subs[dir]) == 0 {
		if err := h.w.Add(dir); err != nil {
			w, done := h.idleLocked()
			h.mu.Unlock()
			stopWatcher(w, done)
			return nil, fmt.Errorf("mps: log follower: watch %s: %w", dir, err)
		}
		h.subs[dir] = map[*dirSub]bool{}
	}
	s := &dirSub{dir: dir, changed: make(chan struct{}, 1), errs: make(chan error, 1)}
	h.subs[dir][s] = true
	h.mu.Unlock()
	return s, nil
}

// unsubscribe ends s; the last subscriber of a directory stops watching it,
// the last of all stops the hub.
func (h *watchHub) unsubscribe(s *dirSub) {
	h.mu.Lock()
	subs := h.subs[s.dir]
	delete(subs, s)
	if len(subs) == 0 {
		delete(h.subs, s.dir)
		if h.w != nil {
			_ = h.w.Remove(s.dir)
		}
	}
	w, done := h.idleLocked()
	h.mu.Unlock()
	stopWatcher(w, done)
}

// idleLocked detaches the watcher when nobody subscribes any more; the
// caller stops it after unlocking (its goroutine takes the lock).
func (h *watchHub) idleLocked() (*fsnotify.Watcher, chan struct{}) {
	if len(h.subs) > 0 || h.w == nil {
		return nil, nil
	}
	w, done := h.w, h.done
	h.w, h.done = nil, nil
	return w, done
}

func stopWatcher(w *fsnotify.Watcher, done chan struct{}) {
	if w == nil {
		return
	}
	_ = w.Close()
	<-done
}

func (h *watchHub) run(w *fsnotify.Watcher, done chan struct{}) {
	defer close(done)
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			h.mu.Lock()
			for s := range h.subs[filepath.Dir(ev.Name)] {
				select {
				case s.changed <- struct{}{}:
				default:
				}
			}
			h.mu.Unlock()
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			h.mu.Lock()
			for _, subs := range h.subs {
				for s := range subs {
					select {
					case s.errs <- err:
					default:
					}
				}
			}
			h.mu.Unlock()
		}
	}
}
