package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/simhost"
)

// Start and stop hygiene, with the binaries: a second mpsd changes nothing
// of a running one's; mpsctl shutdown leaves no socket for launchers to
// wait on; a restarting mpsd is still waited for.

// startMpsd runs the mpsd binary with cfg under --simulate and waits until
// it serves both instances.
func (e *testEnv) startMpsd(cfg string) (*exec.Cmd, *proc) {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", cfg, "--simulate")
	cmd.Stderr = e.log
	p := startProc(e.t, cmd)
	e.waitStatus("mpsd serving both instances, up", func(st api.Status) bool { return instancesUp(st, 2) })
	return cmd, p
}

// fileID is what tells one file at a path from another made there later.
func fileID(t *testing.T, path string) [2]uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return [2]uint64{st.Dev, st.Ino}
}

// A second mpsd started on the state or the socket of a running one
// stops before it touches anything: the running one's simulated-GPU Xid
// socket (state_dir/sim-xid.sock, without which it cannot confirm a
// client's fault under --simulate), its API socket, its state file and
// its instance id stay as they were, and it goes on serving. Both the
// same config (socket and state) and a config with another socket but
// the same state_dir are refused, saying which.
func TestBinarySecondMpsdTouchesNothing(t *testing.T) {
	e := newEnv(t, oneGroup)
	_, first := e.startMpsd(e.cfgPath)
	state := filepath.Join(e.dir, "state")
	xid := simhost.XidSocket(state)
	kept := map[string][2]uint64{}
	for _, p := range []string{xid, e.socket, filepath.Join(state, "instance-id")} {
		kept[p] = fileID(t, p)
	}

	// Another socket, the same state_dir.
	b, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	otherSock := filepath.Join(e.dir, "other.sock")
	other := filepath.Join(e.dir, "other.yaml")
	if err := os.WriteFile(other, []byte(strings.Replace(string(b), "socket: "+e.socket, "socket: "+otherSock, 1)), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, cfg string
		want      []string
	}{
		{"same config", e.cfgPath, []string{"state directory in use", fmt.Sprintf("state_dir %s is locked by another mpsd (pid %d)", state, first.cmd.Process.Pid)}},
		{"same state, another socket", other, []string{"state directory in use", fmt.Sprintf("state_dir %s is locked by another mpsd (pid %d)", state, first.cmd.Process.Pid)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(e.bin, "mpsd"), "--config", tc.cfg, "--simulate")
			second := startProc(t, cmd)
			if code := second.wait(t); code != 1 {
				t.Errorf("second mpsd: exit %d, want 1; stderr %s", code, second.errb.String())
			}
			for _, w := range append(tc.want, "mpsd cannot start") {
				if !strings.Contains(second.errb.String(), w) {
					t.Errorf("second mpsd's stderr lacks %q:\n%s", w, second.errb.String())
				}
			}
			for p, id := range kept {
				if got := fileID(t, p); got != id {
					t.Errorf("%s was replaced by the second mpsd", p)
				}
			}
			if _, err := os.Lstat(otherSock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the second mpsd made %s: %v", otherSock, err)
			}
			// The first one still hears its emulated daemons' Xid reports.
			c, err := net.Dial("unix", xid)
			if err != nil {
				t.Errorf("the first mpsd's Xid socket %s: %v", xid, err)
			} else {
				_ = c.Close()
			}
			if st, err := apiStatus(e.socket); err != nil || !instancesUp(st, 2) {
				t.Errorf("the first mpsd after the second's try: %+v, %v", st, err)
			}
		})
	}
	select {
	case <-first.done:
		t.Fatalf("the first mpsd ended: %v", first.err)
	default:
	}
}

// mpsctl shutdown of an mpsd that listens itself removes its socket and
// the live marker before it answers; mps-launch then exits 125 at once,
// naming the socket, as it does for a socket nothing listens on without
// the marker, instead of waiting a minute and exiting 75 (which Slurm's
// RequeueExit=75 requeues, for ever).
func TestBinaryShutdownRemovesSocket(t *testing.T) {
	e := newEnv(t, oneGroup)
	_, p := e.startMpsd(e.cfgPath)
	marker := api.LiveMarker(e.socket)
	if _, err := os.Lstat(marker); err != nil {
		t.Errorf("no live marker beside the socket of a serving mpsd: %v", err)
	}
	if out, err := e.mpsctl("shutdown"); err != nil {
		t.Fatalf("mpsctl shutdown: %v: %s", err, out)
	}
	for _, f := range []string{marker, e.socket} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after mpsctl shutdown: %v; want it gone", f, err)
		}
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("mpsd exit %d after mpsctl shutdown, want 0", code)
	}

	launch := func(t *testing.T, want string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(e.bin, "mps-launch"), "--", "/bin/true")
		cmd.Env = append(os.Environ(), api.EnvSocket+"="+e.socket)
		start := time.Now()
		l := startProc(t, cmd)
		if code := l.wait(t); code != 125 {
			t.Errorf("mps-launch: exit %d, want 125; stderr %s", code, l.errb.String())
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("mps-launch gave up after %s; want at once", took)
		}
		if !strings.Contains(l.errb.String(), want) {
			t.Errorf("mps-launch's stderr %q; want it to say %q", l.errb.String(), want)
		}
	}
	t.Run("no socket", func(t *testing.T) {
		launch(t, "cannot reach mpsd at "+e.socket+": no such file or directory")
	})
	t.Run("socket left, no marker", func(t *testing.T) {
		// What an mpsd that removed neither (an older one) leaves.
		if err := os.Remove(e.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: e.socket}); err != nil {
			t.Fatal(err)
		}
		launch(t, "cannot reach mpsd at "+e.socket+": connection refused, and no mpsd is coming back to it")
	})
}

// An mpsd stopped by SIGTERM (a restart: the MPS service runs on) leaves
// its socket and the live marker, so a launcher started while it is down
// waits for the next mpsd and runs under it.
func TestBinaryRestartIsWaitedFor(t *testing.T) {
	e := newEnv(t, oneGroup)
	cmd, p := e.startMpsd(e.cfgPath)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("mpsd exit %d after SIGTERM, want 0", code)
	}
	for _, f := range []string{e.socket, api.LiveMarker(e.socket)} {
		if _, err := os.Lstat(f); err != nil {
			t.Errorf("%s after mpsd's SIGTERM: %v; want it left for the next mpsd", f, err)
		}
	}
	lc := exec.Command(filepath.Join(e.bin, "mps-launch"), "--mem", "1G", "--", "/bin/true")
	lc.Env = append(os.Environ(), api.EnvSocket+"="+e.socket)
	l := startProc(t, lc)
	// The launcher's first connect is refused while mpsd is down.
	e.waitLauncherAway(l)
	e.startMpsd(e.cfgPath)
	if code := l.wait(t); code != 0 {
		t.Errorf("mps-launch across mpsd's restart: exit %d, want its command's 0; stderr %s", code, l.errb.String())
	}
}

// waitLauncherAway waits until the launcher l is under way against a
// down mpsd: a refused connect shows nowhere, so its spare trampoline,
// which it starts after it began its first connect, stands for the try.
// l ending meanwhile (giving up at once) fails the test.
func (e *testEnv) waitLauncherAway(l *proc) {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		select {
		case <-l.done:
			e.t.Fatalf("mps-launch ended while mpsd was down: %v; stderr %s", l.err, l.errb.String())
		default:
		}
		lists, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", l.cmd.Process.Pid))
		for _, f := range lists {
			if kids, _ := os.ReadFile(f); len(strings.Fields(string(kids))) > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("mps-launch started no trampoline within %s", waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
