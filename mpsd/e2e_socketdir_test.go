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
	"time"

	"github.com/mpsd/mpsd/api/client"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// sockDirUID is the attacker of TestSocketDirOfATenantRefused: a real
// user, member of no group.
const sockDirUID = 64222

// The API socket's directory is checked as run_dir is. A tenant who may
// change it can unlink mpsd's socket and put its own in its place, and so
// receive every launcher's and mpsctl's requests and answer them as mpsd.
// Here the socket is configured under a sticky, world-writable directory
// (as /tmp/mpsd/mpsd.sock would be) and a real unprivileged user makes the
// socket's directory first, as anyone may there:
//
//   - made before mpsd starts: New refuses, with one line naming the
//     directory, its owner and the fix;
//   - made after New's check, before Run listens: Run refuses before it
//     binds anything there;
//   - under socket activation, a socket systemd made in the tenant's
//     directory is refused too, while one in root's directory is served.
//
// Should mpsd start anyway, the test plays the rest of the attack (the
// tenant replaces the socket and a request reaches it) and fails saying so.
func TestSocketDirOfATenantRefused(t *testing.T) {
	attacker := emutest.User(t, sockDirUID)
	// newSocketEnv: mpsd's socket at <dir>/pub/mpsd/mpsd.sock, where pub
	// is root's and mode 1777, and the socket's directory does not exist.
	newSocketEnv := func(t *testing.T) (e *testEnv, sockDir string) {
		e = newEnv(t, oneGroup, "")
		pub := mkOwned(t, filepath.Join(e.dir, "pub"), os.ModeSticky|0o777, 0)
		sockDir = filepath.Join(pub, "mpsd")
		e.socket = filepath.Join(sockDir, "mpsd.sock")
		e.writeConfig(oneGroup, "")
		return e, sockDir
	}
	// mkdirAsAttacker makes dir as the attacker, with its own umask's mode.
	mkdirAsAttacker := func(t *testing.T, dir string) {
		t.Helper()
		if r := run(t, asUID(exec.Command("mkdir", dir), sockDirUID)); r.code != 0 {
			t.Fatalf("mkdir %s as %s: exit %d: %s", dir, attacker, r.code, r.stderr)
		}
	}
	refusal := func(sock string) string {
		dir := filepath.Dir(sock)
		return fmt.Sprintf("socket: the directory of %s: %s is owned by uid %d, not root, who could change it; chown root:root %s", sock, dir, sockDirUID, dir)
	}
	// noSocketIn: mpsd bound nothing in the tenant's directory.
	noSocketIn := func(t *testing.T, dir string) {
		t.Helper()
		names, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) != 0 {
			t.Errorf("mpsd left %v in the tenant's directory %s", names, dir)
		}
	}

	t.Run("made before mpsd starts", func(t *testing.T) {
		e, sockDir := newSocketEnv(t)
		mkdirAsAttacker(t, sockDir)
		stop, err := startOrErr(t, e.opts)
		if stop != nil {
			defer stop()
			t.Fatalf("mpsd started with its socket in %s, which uid %d owns; %s", sockDir, sockDirUID, takeOver(t, e.socket))
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), refusal(e.socket)) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("mpsd: %v; want ErrConfig with the one line %q...", err, refusal(e.socket))
		}
		noSocketIn(t, sockDir)
	})

	t.Run("made between the check and listening", func(t *testing.T) {
		e, sockDir := newSocketEnv(t)
		ready := make(chan struct{})
		opts := e.opts
		opts.Ready = func() { close(ready) }
		d, err := New(opts)
		if err != nil {
			t.Fatalf("New, before the tenant made the directory: %v", err)
		}
		mkdirAsAttacker(t, sockDir)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		select {
		case err = <-done:
		case <-ready:
			defer func() { cancel(); <-done }()
			t.Fatalf("mpsd started with its socket in %s, which uid %d made after New's check; %s", sockDir, sockDirUID, takeOver(t, e.socket))
		case <-time.After(waitFor):
			t.Fatalf("mpsd neither started nor failed within %s", waitFor)
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), refusal(e.socket)) {
			t.Fatalf("Run = %v; want ErrConfig with %q...", err, refusal(e.socket))
		}
		noSocketIn(t, sockDir)
	})

	t.Run("socket activation", func(t *testing.T) {
		e := newEnv(t, oneGroup, "")
		// What systemd does for mpsd.socket: it makes the socket (as
		// root, listening) before mpsd starts, and passes it in.
		activated := func(t *testing.T, path string) net.Listener {
			t.Helper()
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			t.Cleanup(func() { _ = ln.Close() })
			return ln
		}

		// ListenStream= in a directory the tenant made.
		pub := mkOwned(t, filepath.Join(e.dir, "pub"), os.ModeSticky|0o777, 0)
		sockDir := filepath.Join(pub, "mpsd")
		mkdirAsAttacker(t, sockDir)
		sock := filepath.Join(sockDir, "mpsd.sock")
		opts := e.opts
		opts.Listener = activated(t, sock)
		stop, err := startOrErr(t, opts)
		if stop != nil {
			defer stop()
			t.Fatalf("mpsd served the socket systemd made in %s, which uid %d owns; %s", sockDir, sockDirUID, takeOver(t, sock))
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "the socket systemd passed") || !strings.Contains(err.Error(), refusal(sock)) {
			t.Fatalf("mpsd: %v; want ErrConfig naming the socket systemd passed, with %q...", err, refusal(sock))
		}

		// In root's directory (not the config's socket, which is
		// checked as without activation) it is served.
		good := filepath.Join(mkOwned(t, filepath.Join(e.dir, "act"), 0o755, 0), "mpsd.sock")
		opts.Listener = activated(t, good)
		stop, err = startOrErr(t, opts)
		if err != nil {
			t.Fatalf("mpsd on a socket systemd made in root's directory: %v", err)
		}
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		if _, _, err := client.New(good).Status(ctx); err != nil {
			t.Fatalf("status on the socket systemd passed: %v", err)
		}
		if _, err := os.Lstat(e.socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("mpsd made the config's socket %s though systemd passed one: %v", e.socket, err)
		}
	})
}

// startOrErr runs New and Run with opts until mpsd is ready (it returns
// a function that stops it) or stops (it returns why).
func startOrErr(t *testing.T, opts Options) (stop func(), err error) {
	t.Helper()
	ready := make(chan struct{})
	opts.Ready = func() { close(ready) }
	d, err := New(opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case err := <-done:
		cancel()
		return nil, err
	case <-ready:
		return func() { cancel(); <-done }, nil
	case <-time.After(waitFor):
		cancel()
		<-done
		t.Fatalf("mpsd neither started nor failed within %s", waitFor)
		return nil, nil
	}
}

// takeOver plays the rest of the attack on an mpsd serving sock from a
// directory the attacker owns, and says what came of it: the attacker
// (sockDirUID) renames its own socket over mpsd's, which its directory
// allows whoever made the socket, and a request for mpsd (mpsctl status)
// reaches it instead of mpsd. The attacker's listener is the test's:
// which process answers on it is not the point.
func takeOver(t *testing.T, sock string) string {
	t.Helper()
	thief := filepath.Join(filepath.Dir(sock), "thief.sock")
	ln, err := net.Listen("unix", thief)
	if err != nil {
		return fmt.Sprintf("(its socket could not be taken over: %v)", err)
	}
	defer func() { _ = ln.Close() }()
	if r := run(t, asUID(exec.Command("mv", "-f", thief, sock), sockDirUID)); r.code != 0 {
		return fmt.Sprintf("(uid %d could not replace the socket: %s)", sockDirUID, r.stderr)
	}
	accepted := make(chan struct{})
	go func() {
		if c, err := ln.Accept(); err == nil {
			close(accepted)
			_ = c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _, _ = client.New(sock).Status(ctx)
	select {
	case <-accepted:
		return fmt.Sprintf("uid %d replaced mpsd's socket with its own and an mpsctl status request went to it", sockDirUID)
	case <-time.After(2 * time.Second):
		return fmt.Sprintf("uid %d replaced mpsd's socket with its own", sockDirUID)
	}
}
