package mps

import (
	"log/slog"
	"os"
	"path/filepath"
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
