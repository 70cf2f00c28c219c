package mpsd

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The API socket outlives mpsd: a launcher connecting while mpsd restarts
// is refused (and retries) instead of finding no socket (and giving up as
// if no mpsd were installed); the next mpsd replaces the stale file, and
// refuses a socket another mpsd still answers on.
func TestListenSocketOutlivesDaemon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "mpsd.sock")
	ln, err := listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o666 {
		t.Fatalf("socket %v, %v: want mode 0666", st, err)
	}
	if _, err := listen(path); !errors.Is(err, ErrSocketInUse) {
		t.Errorf("listen on a live socket: %v, want ErrSocketInUse", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("socket file removed when mpsd stopped: %v", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		_ = c.Close()
		t.Fatal("a stopped mpsd's socket still answers")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial a stopped mpsd's socket: %v, want connection refused", err)
	}
	ln, err = listen(path)
	if err != nil {
		t.Fatalf("listen over the stale socket: %v", err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the new socket: %v", err)
	}
	_ = c.Close()
}

// listen checks the socket's directory once it exists, before it removes
// or binds anything there: one someone else made since start-up's check
// (here uid 64222's) is refused and left as it was.
func TestListenRefusesForeignSocketDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a directory owned by another uid")
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := mkOwned(t, filepath.Join(base, "run"), 0o755, 64222)
	stale := filepath.Join(dir, "mpsd.sock")
	if err := os.WriteFile(stale, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := listen(stale)
	if err == nil {
		_ = ln.Close()
		t.Fatalf("listen in %s, owned by uid 64222: no error", dir)
	}
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), dir+" is owned by uid 64222") {
		t.Fatalf("listen = %v; want ErrConfig naming %s", err, dir)
	}
	if b, err := os.ReadFile(stale); err != nil || string(b) != "x" {
		t.Errorf("the file at the socket's path was touched: %q, %v", b, err)
	}
}
