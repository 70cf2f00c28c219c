package mps

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// followFile runs a follower on path, returning its lines and a stop func.
func followFile(t *testing.T, path string, off int64) (<-chan string, func()) {
	t.Helper()
	lines := make(chan string, 100)
	stop := make(chan struct{})
	done := make(chan struct{})
	ready := make(chan error, 1)
	lf := newLogFollower(path, off, slog.New(slog.DiscardHandler), func(l string, _ int64) { lines <- l })
	go func() { defer close(done); lf.run(stop, ready) }()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	var stopped bool
	stopFn := func() {
		if !stopped {
			stopped = true
			close(stop)
			<-done
		}
	}
	t.Cleanup(stopFn)
	return lines, stopFn
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func wantLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	select {
	case got := <-lines:
		if got != want {
			t.Fatalf("line %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no line %q within 10s", want)
	}
}

func TestLogFollower(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rotate func(t *testing.T, path string)
	}{
		{"truncate", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"rename and create", func(t *testing.T, path string) {
			if err := os.Rename(path, path+".1"); err != nil {
				t.Fatal(err)
			}
			appendFile(t, path, "")
		}},
		{"remove and create", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			appendFile(t, path, "")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), controlLog)
			appendFile(t, path, "before start\n")
			lines, _ := followFile(t, path, int64(len("before start\n")))
			appendFile(t, path, "one\npartial")
			wantLine(t, lines, "one")
			appendFile(t, path, " line\r\n")
			wantLine(t, lines, "partial line")
			tc.rotate(t, path)
			appendFile(t, path, "after\n")
			wantLine(t, lines, "after")
		})
	}
}

// The daemon keeps writing to its open (renamed) log: those lines still count.
func TestLogFollowerDrainsRenamedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), controlLog)
	appendFile(t, path, "")
	lines, _ := followFile(t, path, 0)
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, "new file\n")
	wantLine(t, lines, "new file")
	appendFile(t, path+".1", "old file\n")
	wantLine(t, lines, "old file")
}

func TestConfigValidation(t *testing.T) {
	bin := t.TempDir()
	ctl := filepath.Join(bin, DefaultControl)
	if err := os.WriteFile(ctl, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := Config{PipeDir: "/run/x/pipe", LogDir: "/var/log/x", Env: []string{"PATH=" + bin}}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"relative pipe", func(c *Config) { c.PipeDir = "pipe" }, false},
		{"no log dir", func(c *Config) { c.LogDir = "" }, false},
		{"percentage 101", func(c *Config) { c.DefaultThreadPercentage = 101 }, false},
		{"pinned under 1 MiB", func(c *Config) { c.DefaultPinnedMem = map[int]int64{0: 1000} }, false},
		{"pinned negative device", func(c *Config) { c.DefaultPinnedMem = map[int]int64{-1: 1 << 30} }, false},
		{"uuid with comma", func(c *Config) { c.VisibleDevices = []string{"GPU-a,GPU-b"} }, false},
		{"control not on PATH", func(c *Config) { c.ControlPath = "no-such-mps-control" }, false},
		{"control absolute", func(c *Config) { c.ControlPath = ctl }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mod(&c)
			got, err := c.withDefaults()
			if (err == nil) != tc.ok {
				t.Fatalf("withDefaults: %v, want ok=%v", err, tc.ok)
			}
			if err == nil && (got.ControlPath != ctl || got.QuitTimeout != 5*time.Second) {
				t.Fatalf("defaults not applied: %+v", got)
			}
			if err != nil && !isErr(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
		})
	}
}

// Each line is handed over with where it starts, also when it arrives in
// pieces, so its reader can say where a later follower should read on.
func TestLogFollowerOffsets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	appendFile(t, path, "skipped\n")
	type got struct {
		line  string
		start int64
	}
	lines := make(chan got, 10)
	stop := make(chan struct{})
	done := make(chan struct{})
	ready := make(chan error, 1)
	lf := newLogFollower(path, 8, slog.New(slog.DiscardHandler), func(l string, start int64) { lines <- got{l, start} })
	go func() { defer close(done); lf.run(stop, ready) }()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	want := func(line string, start int64) {
		t.Helper()
		select {
		case g := <-lines:
			if g.line != line || g.start != start {
				t.Fatalf("line %q at %d, want %q at %d", g.line, g.start, line, start)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no line %q within 10s", line)
		}
	}
	appendFile(t, path, "one\ntw")
	want("one", 8)
	appendFile(t, path, "o\nthree\n")
	want("two", 12)
	want("three", 16)
	close(stop)
	<-done
}

// A follower told to stop while lines are still unread (a flood written
// into the log FIFO, each line possibly a check through /proc) hands no
// more of them on and returns, instead of holding Close until it has
// read them all.
func TestLogFollowerStopsMidFlood(t *testing.T) {
	path := filepath.Join(t.TempDir(), controlLog)
	var flood []byte
	for i := range 1000 {
		flood = fmt.Appendf(flood, "[2026-12-02 06:00:00.000 Control %5d] NEW CLIENT %d from user 0: Server already exists\n", 100, i)
	}
	if err := os.WriteFile(path, flood, 0o644); err != nil {
		t.Fatal(err)
	}
	first, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	lf := newLogFollower(path, 0, slog.New(slog.DiscardHandler), func(string, int64) {
		if calls.Add(1) == 1 {
			close(first)
			<-release
		}
	})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); lf.run(stop, make(chan error, 1)) }()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no line handed on within 10s")
	}
	close(stop)
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not return within 10s of its stop")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d lines handed on, %d of them after the stop; want none after it", n, n-1)
	}
}
