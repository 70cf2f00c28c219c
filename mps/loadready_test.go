package mps

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// loadReady reads a control log as long as the daemon's life, which anyone
// can lengthen through the world-writable log FIFO: a line of 64 MiB among
// junk lines costs it neither its size in memory (it never holds more than
// a line) nor the servers it must learn (one ready, one that exited, one
// of an earlier daemon).
func TestLoadReadyFloodedLog(t *testing.T) {
	const daemon = 4242
	path := filepath.Join(t.TempDir(), controlLog)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	line := func(pid int, msg string) { fmt.Fprintf(w, "[2026-12-01 10:00:00.000 Control %d] %s\n", pid, msg) }
	line(17, "Starting control daemon")
	line(17, "NEW SERVER 30: Ready") // an earlier daemon's
	line(daemon, "Starting control daemon")
	line(daemon, "CUDA MPS Control binary version: 13000")
	line(daemon, "Starting new server 31 for user 0")
	w.WriteString("[2026-12-01 10:00:00.000 Control 4242] NEW SERVER 99: Ready")
	w.Write(bytes.Repeat([]byte("x"), 64<<20)) // one line, no log line
	w.WriteString("\n")
	for i := range 2000 {
		line(daemon, fmt.Sprintf("Accepting connection... junk %d", i))
	}
	line(daemon, "NEW SERVER 31: Ready")
	line(daemon, "Starting new server 32 for user 0")
	line(daemon, "NEW SERVER 32: Ready")
	line(daemon, "Server 32 exited with status 0")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	d := &Daemon{pid: daemon, ready: map[int]bool{}, log: slog.New(slog.DiscardHandler)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d.loadReady(path, daemon, fileSize(t, path))
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Errorf("loadReady allocated %d MiB for a %d MiB log; want it streamed", got>>20, fileSize(t, path)>>20)
	}
	if !d.ready[31] || d.ready[32] || d.ready[30] || d.ready[99] || len(d.ready) != 1 {
		t.Errorf("ready servers %v, want only 31", d.ready)
	}
	if d.binaryVersion != 13000 {
		t.Errorf("binary version %d, want 13000", d.binaryVersion)
	}
	// Only up to the offset the log follower starts at: what comes after
	// is the follower's.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d = &Daemon{pid: daemon, ready: map[int]bool{}, log: slog.New(slog.DiscardHandler)}
	d.loadReady(path, daemon, int64(bytes.Index(b, []byte("NEW SERVER 31: Ready"))))
	if len(d.ready) != 0 {
		t.Errorf("ready servers %v read past the end it was given, want none", d.ready)
	}
}

// The budget holds however the log is made: spent, the read stops (here
// before a 64 MiB line without a newline), having learned nothing more.
func TestLoadReadyBudget(t *testing.T) {
	path := filepath.Join(t.TempDir(), controlLog)
	line := "[2026-12-01 10:00:00.000 Control 4242] Starting control daemon\n" + strings.Repeat("y", 64<<20)
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	old := loadReadyBudget
	loadReadyBudget = 0
	defer func() { loadReadyBudget = old }()
	d := &Daemon{pid: 4242, ready: map[int]bool{}, log: slog.New(slog.DiscardHandler)}
	r := &deadlineReader{r: strings.NewReader("x"), deadline: time.Now().Add(-time.Second)}
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, errReadBudget) {
		t.Fatalf("a spent budget reads on: %v", err)
	}
	d.loadReady(path, 4242, fileSize(t, path))
	if len(d.ready) != 0 || d.binaryVersion != 0 {
		t.Errorf("learned %v, version %d with no budget", d.ready, d.binaryVersion)
	}
}

func fileSize(t *testing.T, path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestReadBoundedLine(t *testing.T) {
	long := strings.Repeat("y", 100)
	in := "a\r\n\x00b\x00\n" + long + "\n" + "c\n" + "partial"
	r := bufio.NewReaderSize(strings.NewReader(in), 16)
	var got []string
	for {
		l, err := readBoundedLine(r, 40)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	want := []string{"a", "b", "", "c"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q, want %q", got, want)
	}
}

// FuzzReadBoundedLine: every line of the input within the limit comes out
// as it is (less its CR and NULs at either end), every longer one as "",
// and a last line without its newline not at all, whatever the buffer.
func FuzzReadBoundedLine(f *testing.F) {
	f.Add([]byte("a\nbb\n"), 3, 16)
	f.Add([]byte(strings.Repeat("z", 70)+"\nq\n"), 20, 16)
	f.Add([]byte("\x00\r\n\n"), 1, 16)
	f.Fuzz(func(t *testing.T, data []byte, limit, size int) {
		limit, size = 1+abs(limit)%200, 16+abs(size)%64
		r := bufio.NewReaderSize(bytes.NewReader(data), size)
		var got []string
		for {
			l, err := readBoundedLine(r, limit)
			if err != nil {
				break
			}
			got = append(got, l)
		}
		var want []string
		rest := data
		for {
			i := bytes.IndexByte(rest, '\n')
			if i < 0 {
				break
			}
			l := rest[:i]
			rest = rest[i+1:]
			if len(l) > limit {
				want = append(want, "")
				continue
			}
			want = append(want, string(bytes.Trim(l, "\x00\r")))
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") || len(got) != len(want) {
			t.Errorf("limit %d: got %q, want %q", limit, got, want)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// AnswerTimeout bounds how long Adopt waits for a daemon that does not
// answer (stopped here), whatever is left of its context; a daemon that
// answers is adopted under the same limit.
func TestAdoptAnswerTimeout(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := newConfig(t, b)
		in := start(t, cfg)
		acfg := cfg
		acfg.AnswerTimeout = 5 * time.Second
		d, err := Adopt(testCtx(t, 30*time.Second), acfg)
		if err != nil {
			t.Fatalf("Adopt of a daemon that answers: %v", err)
		}
		d.Close()
		if err := unix.Kill(in.d.PID(), unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, in.d.PID())
		acfg.AnswerTimeout = 300 * time.Millisecond
		ctx := testCtx(t, 10*time.Minute)
		done := make(chan error, 1)
		go func() {
			d, err := Adopt(ctx, acfg)
			if err == nil {
				d.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			wantErr(t, err, ErrTimeout)
		case <-time.After(time.Minute):
			t.Fatal("Adopt of a stopped daemon still waits after a minute: AnswerTimeout not applied")
		}
		_ = unix.Kill(in.d.PID(), unix.SIGCONT)
	})
}
