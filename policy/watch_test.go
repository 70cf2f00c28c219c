package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// waitLimit bounds every wait for the watcher; it is a deadline for a
// failure, not a delay: tests proceed as soon as the event arrives.
const waitLimit = 10 * time.Second

// version returns a valid config told apart by its probe_failures.
func version(n int) string {
	return minimal + fmt.Sprintf("watchdog:\n  probe_failures: %d\n", n)
}

type watchHarness struct {
	w       *Watcher
	path    string
	reloads chan Reload
}

// startWatcher writes version(1) to dir/mpsd.yaml and runs a Watcher on
// it until the test ends.
func startWatcher(t *testing.T, dir string) *watchHarness {
	t.Helper()
	h := &watchHarness{path: writeFile(t, dir, "mpsd.yaml", version(1)), reloads: make(chan Reload, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := NewWatcher(h.path, Host{Users: testUsers}, WatchOptions{
		Debounce: 10 * time.Millisecond,
		OnReload: func(r Reload) {
			select {
			case h.reloads <- r:
			case <-ctx.Done():
			}
		},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h.w = w
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
	})
	return h
}

// waitVersion waits for the successful reload of version(n). Failed
// attempts on the way (a file caught half-written) are allowed; a success
// with any other content is not, since that would be a partial file
// applied.
func (h *watchHarness) waitVersion(t *testing.T, n int) Reload {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case r := <-h.reloads:
			if r.Err != nil {
				continue
			}
			got := r.Config.Watchdog.ProbeFailures
			if got != n {
				t.Fatalf("reloaded probe_failures %d, want %d", got, n)
			}
			if h.w.Config() != r.Config {
				t.Fatal("Config() is not the config just reloaded")
			}
			return r
		case <-deadline:
			t.Fatalf("no reload of version %d within %v; in force: %d", n, waitLimit, h.w.Config().Watchdog.ProbeFailures)
		}
	}
}

// waitError waits for a failed reload attempt.
func (h *watchHarness) waitError(t *testing.T) Reload {
	t.Helper()
	select {
	case r := <-h.reloads:
		if r.Err == nil {
			t.Fatalf("reload succeeded with probe_failures %d, want a failure", r.Config.Watchdog.ProbeFailures)
		}
		return r
	case <-time.After(waitLimit):
		t.Fatalf("no failed reload within %v", waitLimit)
	}
	return Reload{}
}

func TestWatcherReplacementPatterns(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace func(t *testing.T, dir, path, data string)
	}{
		{"write in place", func(t *testing.T, dir, path, data string) {
			must(t, os.WriteFile(path, []byte(data), 0o644))
		}},
		{"atomic rename over", func(t *testing.T, dir, path, data string) {
			tmp := writeFile(t, dir, ".mpsd.yaml.tmp123", data)
			must(t, os.Rename(tmp, path))
		}},
		{"truncate then write in pieces", func(t *testing.T, dir, path, data string) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			must(t, err)
			// The first piece alone is an invalid config (no groups).
			half := len("version: 1\n")
			_, err = f.Write([]byte(data[:half]))
			must(t, err)
			must(t, f.Sync())
			_, err = f.Write([]byte(data[half:]))
			must(t, err)
			must(t, f.Close())
		}},
		{"delete then recreate", func(t *testing.T, dir, path, data string) {
			must(t, os.Remove(path))
			must(t, os.WriteFile(path, []byte(data), 0o600))
		}},
		{"vim with backup and swap files", func(t *testing.T, dir, path, data string) {
			swp := writeFile(t, dir, ".mpsd.yaml.swp", "swap")
			probe := writeFile(t, dir, "4913", "")
			must(t, os.Remove(probe))
			must(t, os.Rename(path, path+"~"))
			must(t, os.WriteFile(path, []byte(data), 0o644))
			must(t, os.Remove(path+"~"))
			must(t, os.Remove(swp))
		}},
		{"emacs backup", func(t *testing.T, dir, path, data string) {
			lock := filepath.Join(dir, ".#mpsd.yaml")
			must(t, os.Symlink("user@host.1234", lock))
			must(t, os.Rename(path, path+"~"))
			must(t, os.WriteFile(path, []byte(data), 0o644))
			must(t, os.Remove(lock))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			h := startWatcher(t, dir)
			for n := 2; n <= 4; n++ {
				tc.replace(t, dir, h.path, version(n))
				r := h.waitVersion(t, n)
				if r.Previous.Watchdog.ProbeFailures != n-1 {
					t.Errorf("Previous has probe_failures %d, want %d", r.Previous.Watchdog.ProbeFailures, n-1)
				}
				if len(r.Changes.Global) != 1 || r.Changes.Global[0] != "watchdog.probe_failures" || len(r.Changes.Groups) != 0 {
					t.Errorf("Changes = %+v, want only watchdog.probe_failures", r.Changes)
				}
			}
		})
	}
}

func TestWatcherKeepsLastGoodConfig(t *testing.T) {
	dir := t.TempDir()
	h := startWatcher(t, dir)
	good := h.w.Config()

	// Replaced by rename, so the watcher can only ever read the whole bad
	// file: a truncate-then-write could show it an empty file first, whose
	// different failure the checks below would take for this one.
	replaceFile(t, h.path, version(2)+"bogus: 1\n")
	r := h.waitError(t)
	if !errors.Is(r.Err, ErrInvalidConfig) {
		t.Errorf("reload error %v does not match ErrInvalidConfig", r.Err)
	}
	var ce *ConfigError
	if !errors.As(r.Err, &ce) || ce.Path != h.path || ce.Problems[0].Key != "bogus" {
		t.Errorf("reload error %v should name the file and the key", r.Err)
	}
	if h.w.Config() != good || r.Config != good || r.Previous != good || !r.Changes.Empty() {
		t.Error("a bad edit replaced the config in force")
	}

	must(t, os.Remove(h.path))
	r = h.waitError(t)
	if !errors.Is(r.Err, os.ErrNotExist) || h.w.Config() != good {
		t.Errorf("deleted file: error %v, config replaced %v", r.Err, h.w.Config() != good)
	}

	// The good content coming back is a successful reload (the metric
	// must recover), although it equals the config in force.
	must(t, os.WriteFile(h.path, []byte(version(1)), 0o644))
	if r := h.waitVersion(t, 1); !r.Changes.Empty() {
		t.Errorf("Changes = %+v, want none", r.Changes)
	}
	must(t, os.WriteFile(h.path, []byte(version(5)), 0o644))
	h.waitVersion(t, 5)
}

func TestWatcherConfigMapSwap(t *testing.T) {
	// A Kubernetes ConfigMap volume: mpsd.yaml -> ..data/mpsd.yaml, and
	// ..data -> ..<timestamp> swapped by rename on update.
	dir := t.TempDir()
	publish := func(n int) {
		ts := fmt.Sprintf("..ts_%d", n)
		must(t, os.Mkdir(filepath.Join(dir, ts), 0o755))
		writeFile(t, filepath.Join(dir, ts), "mpsd.yaml", version(n))
		must(t, os.Symlink(ts, filepath.Join(dir, "..data_tmp")))
		must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	}
	publish(1)
	path := filepath.Join(dir, "mpsd.yaml")
	must(t, os.Symlink("..data/mpsd.yaml", path))

	reloads := make(chan Reload, 16)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := NewWatcher(path, Host{Users: testUsers}, WatchOptions{Debounce: 10 * time.Millisecond, OnReload: func(r Reload) {
		select {
		case reloads <- r:
		case <-ctx.Done():
		}
	}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	publish(2)
	deadline := time.After(waitLimit)
	for w.Config().Watchdog.ProbeFailures != 2 {
		select {
		case r := <-reloads:
			if r.Err != nil {
				t.Logf("transient reload failure: %v", r.Err)
			}
		case <-deadline:
			t.Fatal("ConfigMap update not picked up")
		}
	}
}

func TestWatcherSkipsUnchangedContent(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "mpsd.yaml", version(1))
	var calls int
	w, err := NewWatcher(path, Host{Users: testUsers}, WatchOptions{OnReload: func(Reload) { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	// reload is what Run calls when the debounce timer fires.
	must(t, os.WriteFile(path, []byte(version(1)), 0o644))
	w.reload()
	if calls != 0 {
		t.Errorf("an identical rewrite was reported %d times", calls)
	}
	must(t, os.WriteFile(path, []byte(version(2)), 0o644))
	w.reload()
	w.reload()
	if calls != 1 || w.Config().Watchdog.ProbeFailures != 2 {
		t.Errorf("one change: %d reports, probe_failures %d", calls, w.Config().Watchdog.ProbeFailures)
	}
}

func TestRelevantName(t *testing.T) {
	for _, tc := range []struct {
		entry string
		want  bool
	}{
		{"mpsd.yaml", true},
		{"..data", true},
		{"4913", false},
		{".mpsd.yaml.swp", false},
		{".mpsd.yaml.swx", false},
		{"mpsd.yaml~", false},
		{".#mpsd.yaml", false},
		{"#mpsd.yaml#", false},
		{".mpsd.yaml.tmp123", false},
		{"mpsd.yaml.dpkg-new", false},
		{"other.yaml", false},
	} {
		if got := relevantName(tc.entry, "mpsd.yaml"); got != tc.want {
			t.Errorf("relevantName(%q) = %v, want %v", tc.entry, got, tc.want)
		}
	}
}

func TestWatcherDirectoryRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc")
	must(t, os.Mkdir(dir, 0o755))
	path := writeFile(t, dir, "mpsd.yaml", version(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applied := make(chan struct{})
	var once sync.Once
	w, err := NewWatcher(path, Host{Users: testUsers}, WatchOptions{Debounce: 10 * time.Millisecond, OnReload: func(r Reload) {
		if r.Err == nil && r.Config.Watchdog.ProbeFailures == 2 {
			once.Do(func() { close(applied) })
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	// Applying version 2 proves Run is watching: it reads the file only
	// after adding the watch. Any failed attempt on the way does not count,
	// since the config in force checked below would then still be version 1.
	replaceFile(t, path, version(2))
	select {
	case <-applied:
	case <-time.After(waitLimit):
		t.Fatal("version 2 was not applied")
	}
	must(t, os.RemoveAll(dir))
	select {
	case err := <-done:
		if !errors.Is(err, ErrWatchStopped) {
			t.Errorf("Run = %v, want ErrWatchStopped", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not notice its directory going away")
	}
	if w.Config().Watchdog.ProbeFailures != 2 {
		t.Error("the config in force was lost")
	}
}

func TestWatcherErrors(t *testing.T) {
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.yaml", "version: 1\n")
	if _, err := NewWatcher(bad, Host{Users: testUsers}, WatchOptions{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewWatcher(invalid) = %v, want ErrInvalidConfig", err)
	}
	if _, err := NewWatcher(filepath.Join(dir, "missing.yaml"), Host{}, WatchOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("NewWatcher(missing) = %v, want not-exist", err)
	}

	w, err := NewWatcher(writeFile(t, dir, "good.yaml", version(1)), Host{Users: testUsers}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Run(ctx); err != nil {
		t.Errorf("Run(cancelled) = %v", err)
	}
	if err := w.Run(context.Background()); err == nil {
		t.Error("a second Run was allowed")
	}
}

// replaceFile puts data at path atomically: written to a temporary file in
// the same directory, then renamed over path.
func replaceFile(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.CreateTemp(filepath.Dir(path), ".replace-*")
	must(t, err)
	_, err = f.WriteString(data)
	must(t, errors.Join(err, f.Close()))
	must(t, os.Rename(f.Name(), path))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
