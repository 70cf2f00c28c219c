package mpsd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// The state directory's lock keeps a second mpsd out, names the holder's
// pid, makes nothing in the directory, and is free again once its holder
// let it go (a closed descriptor, as the kernel closes a dead mpsd's).
func TestStateDirLock(t *testing.T) {
	dir := t.TempDir()
	first, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockStateDir(dir)
	want := fmt.Sprintf("state_dir %s is locked by another mpsd (pid %d)", dir, os.Getpid())
	if !errors.Is(err, ErrStateInUse) || !strings.Contains(err.Error(), want) {
		t.Errorf("second lock = %v; want ErrStateInUse with %q", err, want)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("the state directory after its lock was taken: %v, %v; want nothing made in it", ents, err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock after its holder let it go: %v", err)
	}
	_ = again.Close()
}

// socketFree: an answering socket is another mpsd's; a missing one, or
// one that refuses (a stopped mpsd's), is free.
func TestSocketFree(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := socketFree(live); !errors.Is(err, ErrSocketInUse) {
		t.Errorf("socketFree(answering socket) = %v; want ErrSocketInUse", err)
	}
	_ = ln.Close()
	if err := socketFree(live); err != nil {
		t.Errorf("socketFree(socket nothing listens on) = %v; want nil", err)
	}
	if err := socketFree(filepath.Join(dir, "none.sock")); err != nil {
		t.Errorf("socketFree(no socket) = %v; want nil", err)
	}
}

// Under socket activation systemd owns the socket: mpsctl shutdown leaves
// it (the next connection starts mpsd again, as systemd's mpsd.socket
// promises), and mpsd makes no live marker beside it (a connect waits in
// systemd's backlog; no launcher needs one), removing a stale one an mpsd
// that listened itself left.
func TestShutdownUnderActivationKeepsSocket(t *testing.T) {
	e := newEnv(t, oneGroup, "")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: e.socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	t.Cleanup(func() { _ = ln.Close() })
	// systemd keeps its own descriptor of the socket, listening after
	// mpsd closed the one it was given.
	held, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Close() })
	marker := api.LiveMarker(e.socket)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e.opts.Listener = ln
	e.start()
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("live marker under socket activation: %v; want the stale one removed", err)
	}
	r := run(t, exec.Command(filepath.Join(e.bin, "mpsctl"), "--socket", e.socket, "shutdown"))
	if r.code != 0 {
		t.Fatalf("mpsctl shutdown: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitRunReturned()
	if fi, err := os.Lstat(e.socket); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("systemd's socket after mpsctl shutdown: %v, %v; want it left", fi, err)
	}
	// systemd's listener still takes connections for the next mpsd.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", e.socket)
	if err != nil {
		t.Fatalf("connect to systemd's socket after the shutdown: %v", err)
	}
	_ = c.Close()
}
