package mps

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func inotifyInstances(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// Log followers of many daemons share one inotify instance, so a host with
// many MPS instances stays far below fs.inotify.max_user_instances; each
// subscriber still hears only its own directory, and the last one to leave
// stops the watcher.
func TestWatchHubSharesOneInotify(t *testing.T) {
	h := &watchHub{subs: map[string]map[*dirSub]bool{}}
	before := inotifyInstances(t)
	var subs []*dirSub
	var dirs []string
	for range 10 {
		dir := t.TempDir()
		dirs = append(dirs, dir)
		for range 2 { // control.log's and server.log's followers
			s, err := h.subscribe(dir)
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, s)
		}
	}
	if got := inotifyInstances(t) - before; got != 1 {
		t.Errorf("20 subscriptions use %d inotify instances, want 1", got)
	}
	if err := os.WriteFile(filepath.Join(dirs[3], "control.log"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		select {
		case <-s.changed:
			if i/2 != 3 {
				t.Errorf("subscriber of %s woken by a write in %s", s.dir, dirs[3])
			}
		case <-time.After(func() time.Duration {
			if i/2 == 3 {
				return 5 * time.Second
			}
			return 50 * time.Millisecond
		}()):
			if i/2 == 3 {
				t.Errorf("subscriber of %s not woken by a write there", s.dir)
			}
		}
	}
	for _, s := range subs {
		h.unsubscribe(s)
	}
	if got := inotifyInstances(t) - before; got != 0 {
		t.Errorf("%d inotify instances left after every subscriber left", got)
	}
	if h.w != nil {
		t.Error("hub still holds a watcher")
	}
}
