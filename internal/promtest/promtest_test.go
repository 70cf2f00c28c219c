package promtest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fakeTB records how a lookup ended: Skipf and Fatalf stop the goroutine, as
// the real ones do.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// lookup runs fn(fake) on its own goroutine and returns what it returned.
func lookup(t *testing.T, fn func(testing.TB) string) (path string, f *fakeTB) {
	t.Helper()
	f = &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		path = fn(f)
	}()
	<-done
	return path, f
}

// fakeCache makes a cache directory holding the named programs.
func fakeCache(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "usr", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("2.42.0+ds-5"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCacheDir(t *testing.T) {
	t.Setenv(CacheEnv, "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if got, want := CacheDir(), "/xdg/mpsd/prometheus"; got != want {
		t.Errorf("CacheDir() with XDG_CACHE_HOME = %q, want %q", got, want)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if got, want := CacheDir(), "/home/u/.cache/mpsd/prometheus"; got != want {
		t.Errorf("CacheDir() with HOME = %q, want %q", got, want)
	}
	t.Setenv(CacheEnv, "/elsewhere")
	if got, want := CacheDir(), "/elsewhere"; got != want {
		t.Errorf("CacheDir() with %s = %q, want %q", CacheEnv, got, want)
	}
}

func TestPathsFound(t *testing.T) {
	dir := fakeCache(t, PromtoolName, PrometheusName)
	t.Setenv(CacheEnv, dir)
	t.Setenv(RequireEnv, "1")
	for name, fn := range map[string]func(testing.TB) string{PromtoolName: PromtoolPath, PrometheusName: PrometheusPath} {
		path, f := lookup(t, fn)
		if f.skipped != "" || f.failed != "" {
			t.Errorf("%s: skipped %q, failed %q; want found", name, f.skipped, f.failed)
		}
		if want := filepath.Join(dir, "usr", "bin", name); path != want {
			t.Errorf("%s: path %q, want %q", name, path, want)
		}
	}
	if got := Version(); got != "2.42.0+ds-5" {
		t.Errorf("Version() = %q", got)
	}
}

func TestMissingSkipsOrFails(t *testing.T) {
	dir := fakeCache(t, PrometheusName) // no promtool
	// Not executable: as good as missing.
	if err := os.Chmod(filepath.Join(dir, "usr", "bin", PrometheusName), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(CacheEnv, dir)
	for name, fn := range map[string]func(testing.TB) string{PromtoolName: PromtoolPath, PrometheusName: PrometheusPath} {
		t.Setenv(RequireEnv, "")
		_, f := lookup(t, fn)
		if f.failed != "" || !strings.Contains(f.skipped, name+" not available") || !strings.Contains(f.skipped, "make fetch-prometheus") {
			t.Errorf("%s without %s: skipped %q, failed %q; want a skip naming the program and the make target", name, RequireEnv, f.skipped, f.failed)
		}
		t.Setenv(RequireEnv, "1")
		_, f = lookup(t, fn)
		if f.skipped != "" || !strings.Contains(f.failed, RequireEnv+"=1") || !strings.Contains(f.failed, dir) {
			t.Errorf("%s with %s=1: skipped %q, failed %q; want a failure naming the variable and the path", name, RequireEnv, f.skipped, f.failed)
		}
	}
}
