package mpsd

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
)

// One mpsd per state and per socket, and what it leaves at its socket when
// it stops.
//
// Run's first act on its directories (after making the missing ones) is
// claim: it takes the state directory's lock and, when it listens itself,
// makes sure no mpsd answers on the API socket. Only then does it touch
// what another mpsd would be using: the instance id, the lease cgroups,
// the simulated GPUs' Xid socket, the state file's leftovers, the socket.
// A second mpsd started by mistake stops there and changes nothing.
//
// The lock is flock(2) on the state directory itself, held by an open
// descriptor (close-on-exec: no control daemon inherits it) until Run has
// done everything else, and let go by the kernel when mpsd dies however
// it does: a stale lock cannot keep the next mpsd out.
//
// The socket's api.LiveMarker says an mpsd serves the socket or is coming
// back to it (markLive, when serving begins); SIGTERM and crashes leave
// it with the socket, so launchers wait for the next mpsd; mpsctl
// shutdown removes both (withdrawSocket), so a launcher after it fails at
// once instead of waiting for an mpsd that is not coming.

// claim takes the state directory's lock and, unless systemd passed the
// socket (it holds it, and starts one mpsd), checks that nothing answers
// on socket. The lock is the caller's to close when Run is done.
func (d *Daemon) claim(socket string) (*os.File, error) {
	lock, err := lockStateDir(d.layout.StateDir)
	if err != nil {
		return nil, err
	}
	if d.opts.Listener == nil {
		if err := socketFree(socket); err != nil {
			_ = lock.Close()
			return nil, err
		}
	}
	return lock, nil
}

// lockStateDir takes the lock of the state directory dir (flock on the
// directory itself: nothing is made in it, so a full or odd state
// directory locks as well) without waiting: an mpsd holding it is
// ErrStateInUse, with its pid when the kernel shows it.
func lockStateDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("state_dir %s: open it to lock it: %w", dir, err)
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := flockHolder(f)
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: state_dir %s is locked by another mpsd%s; is another mpsd running? Stop it first, or give this one its own state_dir and socket", ErrStateInUse, dir, holder)
		}
		return nil, fmt.Errorf("state_dir %s: lock it: %w", dir, err)
	}
	return f, nil
}

func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if ferr = unix.Flock(int(fd), how); !errors.Is(ferr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}

// flockHolder is " (pid N)" for the process /proc/locks shows holding a
// flock on f's file, or "" when it shows none (a pid namespace, a lock
// let go meanwhile).
func flockHolder(f *os.File) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return ""
	}
	// "1: FLOCK  ADVISORY  WRITE 5030 fe:00:9986118 0 EOF"; a waiter's
	// line has "->" after the number.
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != id {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 {
			return fmt.Sprintf(" (pid %d)", pid)
		}
	}
	return ""
}

// socketFree reports ErrSocketInUse unless nothing can be listening on
// path: no file there, or one that refuses connections (a stopped mpsd's
// socket). A connect that fails otherwise (the backlog of a busy mpsd is
// full, no answer in time) is taken for an mpsd there: its socket is never
// replaced on a guess.
func socketFree(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	switch {
	case err == nil:
		_ = c.Close()
		return fmt.Errorf("%w: %s answers; is another mpsd running?", ErrSocketInUse, path)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
		return nil
	}
	return fmt.Errorf("%w: connecting to %s to see whether another mpsd serves it: %w; is another mpsd running?", ErrSocketInUse, path, err)
}

// markLive makes the socket's api.LiveMarker once mpsd serves a socket it
// listens on itself. Under socket activation there is none: one that an
// mpsd listening itself left before is removed.
func (d *Daemon) markLive() {
	if d.socket == "" {
		if ln := d.opts.Listener; ln != nil {
			marker := api.LiveMarker(ln.Addr().String())
			if err := os.Remove(marker); err == nil {
				d.log.Info("removed the live marker an mpsd that listened itself left; systemd holds the socket now", "marker", marker)
			} else if !errors.Is(err, fs.ErrNotExist) {
				d.log.Warn("cannot remove a stale live marker; a launcher finding the socket closed would wait for mpsd", "marker", marker, "err", err)
			}
		}
		return
	}
	marker := api.LiveMarker(d.socket)
	f, err := os.OpenFile(marker, os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		d.log.Warn("cannot make the live marker: while mpsd restarts, launchers will fail at once instead of waiting for it", "marker", marker, "err", err)
		return
	}
	_ = f.Close()
}

// withdrawSocket ends mpsd's presence at its socket for good (mpsctl
// shutdown): the marker first, so that a launcher finding the socket
// closed meanwhile fails at once too, then the socket file, if it is
// still the one listen made. New connections then find no socket; those
// open go on. Under socket activation the socket is systemd's: left.
func (d *Daemon) withdrawSocket() {
	if d.socket == "" {
		return
	}
	marker := api.LiveMarker(d.socket)
	if err := os.Remove(marker); err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.Warn("cannot remove the live marker: launchers will wait for an mpsd that is not coming", "marker", marker, "err", err)
	}
	fi, err := os.Lstat(d.socket)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return
	case err != nil:
		d.log.Warn("API socket not removed", "socket", d.socket, "err", err)
		return
	case d.sockFile == nil || !os.SameFile(fi, d.sockFile):
		d.log.Warn("API socket not removed: its path holds another file than the socket mpsd made", "socket", d.socket)
		return
	}
	if err := os.Remove(d.socket); err != nil {
		d.log.Warn("API socket not removed", "socket", d.socket, "err", err)
		return
	}
	d.log.Info("API socket removed: no mpsd is coming back to it", "socket", d.socket)
}
