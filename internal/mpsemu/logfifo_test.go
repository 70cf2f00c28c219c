package mpsemu_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

// lockHolder is the pid holding control_lock (0: none), as a new -d
// finds it; 535 writes no pid file.
func (m *mps) lockHolder() int {
	m.t.Helper()
	f, err := os.OpenFile(filepath.Join(m.pipe, "control_lock"), os.O_RDWR, 0)
	if err != nil {
		m.t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil {
		m.t.Fatal(err)
	}
	if lk.Type == unix.F_UNLCK {
		return 0
	}
	return int(lk.Pid)
}

// poisonedHeader declares 0xffffffff bytes of text.
func poisonedHeader(first uint32) []byte {
	h := make([]byte, 48)
	for i, v := range []uint32{first, 4242, 2026, 1, 2, 0, 3, 4, 5, 6, 0xffffffff, 0} {
		binary.LittleEndian.PutUint32(h[4*i:], v)
	}
	return h
}

func (m *mps) writeFIFO(b []byte) {
	m.t.Helper()
	if n, err := mpslog.WriteRaw(filepath.Join(m.pipe, "log"), b); n != len(b) || err != nil {
		m.t.Fatalf("writing the log FIFO: %d of %d bytes, %v", n, len(b), err)
	}
}

// After one header declaring 0xffffffff bytes of text in its log FIFO
// (anyone may write there) the daemon logs nothing more; on quit it
// answers, closes its sockets and removes its pid file, but never exits:
// it keeps control_lock, so a second -d is refused, and its FIFO. The
// test kills it.
func TestPoisonedFIFODaemonNeverExits(t *testing.T) {
	for _, gen := range []string{"535", "550", "555", "580"} {
		t.Run(gen, func(t *testing.T) {
			m := newMPS(t, gen, "")
			m.startDaemon()
			before := m.waitLog("control.log", "To connect CUDA applications", 1)
			pid := m.lockHolder()
			m.writeFIFO(poisonedHeader(0xabcde003))
			if got := m.cmd("set_default_active_thread_percentage 50"); got != "50.0\n" {
				t.Errorf("a poisoned daemon answered %q", got)
			}
			if r := m.control("quit\n"); r.code != 0 || r.stdout != "" || r.stderr != "" {
				t.Fatalf("quit: %+v", r)
			}
			// The pid file goes before quit is answered; the daemon stays.
			if got := listDir(t, m.pipe); got != "control control_lock control_privileged log" {
				t.Errorf("pipe directory after quit: %s", got)
			}
			deadline := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(deadline) {
				if !emutest.Alive(pid) || m.lockHolder() != pid {
					t.Fatalf("daemon %d exited after quit (lock holder %d)", pid, m.lockHolder())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if r := m.control("", "-d"); r.code != 1 || r.stdout != "An instance of this daemon is already running\n" {
				t.Errorf("second -d: %+v", r)
			}
			if r := m.control("get_server_list\n"); r.code != 1 || r.stderr != "Cannot find MPS control daemon process\n" {
				t.Errorf("a client after quit: %+v", r)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			emutest.WaitGone(pid)
			// Its logger is gone with it: the logs are final.
			if b, _ := os.ReadFile(filepath.Join(m.logs, "control.log")); string(b) != before {
				t.Errorf("logged after the poisoned header:\n%s", strings.TrimPrefix(string(b), before))
			}
			if b, _ := os.ReadFile(filepath.Join(m.logs, "server.log")); len(b) != 0 {
				t.Errorf("server.log: %q (the second -d's announcement is swallowed too)", b)
			}
		})
	}
}

// The poisoned logger waits for its text until about 6 KiB of it has come
// in; then the daemon dies of SIGSEGV, as NVIDIA's does, leaving its files.
// The daemon's own records get there: about 25 control sessions.
func TestPoisonedFIFODaemonCrashes(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	m.waitLog("control.log", "To connect CUDA applications", 1)
	pid := m.daemonPID()
	m.writeFIFO(poisonedHeader(0xabcde003))
	calls := 0
	for ; calls < 40 && emutest.Alive(pid); calls++ {
		if r := m.control("get_server_list\n"); r.code != 0 {
			break
		}
	}
	emutest.WaitGone(pid)
	if emutest.Alive(pid) || calls < 24 {
		t.Fatalf("daemon alive=%v after %d sessions; want it dead after about 25", emutest.Alive(pid), calls)
	}
	if got := listDir(t, m.pipe); got != "control control_lock control_privileged log nvidia-cuda-mps-control.pid" {
		t.Errorf("pipe directory after the crash: %s", got)
	}

	// In the foreground its status shows: killed by SIGSEGV.
	fg := m.start(-1, emutest.ControlName, "-f")
	fg.line(t)
	fg.line(t)
	m.writeFIFO(append(poisonedHeader(0xabcde003), make([]byte, 8192)...))
	fg.wait(t)
	if ws, ok := fg.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
		t.Errorf("-f ended %v; want killed by SIGSEGV", fg.cmd.ProcessState)
	}
	if _, err := os.Stat(filepath.Join(m.dir, "core")); err == nil {
		t.Error("the crash left a core file")
	}
}
