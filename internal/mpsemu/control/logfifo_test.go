package control

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

// fifoDaemon is a daemon with its log FIFO and log files (in one temporary
// directory) and no sockets or processes; its logger runs.
func fifoDaemon(t *testing.T, gen Generation) *Daemon {
	t.Helper()
	dir := t.TempDir()
	d := newDaemon(gen, dirs{pipe: dir, log: dir}, false, false, true, &bytes.Buffer{})
	d.pid, d.uid = 4242, 0
	d.start = func(*exec.Cmd) error { return errors.New("no processes in unit tests") }
	d.crash = func() { t.Error("the logger overran") }
	d.openLogs()
	if d.logW == nil {
		t.Fatal("no log FIFO")
	}
	return d
}

// controlLog waits (at most 5 s) until control.log holds want, and
// returns it.
func controlLog(t *testing.T, d *Daemon, want string) string {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		b, _ := os.ReadFile(filepath.Join(d.dirs.log, "control.log"))
		if strings.Contains(string(b), want) || time.Now().After(deadline) {
			return string(b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// poison writes a header declaring 0xffffffff bytes of text into the FIFO.
func poison(t *testing.T, d *Daemon, first uint32) {
	t.Helper()
	h := make([]byte, 48)
	for i, v := range []uint32{first, 4242, 2026, 1, 2, 0, 3, 4, 5, 6, 0xffffffff, 0} {
		binary.LittleEndian.PutUint32(h[4*i:], v)
	}
	if n, err := mpslog.WriteRaw(d.path(fifoName), h); n != len(h) || err != nil {
		t.Fatalf("writing the FIFO: %d bytes, %v", n, err)
	}
}

// chanUI is a quit caller whose answer the test waits for.
type chanUI struct {
	status chan uint32
	closed chan struct{}
}

func newChanUI() *chanUI { return &chanUI{status: make(chan uint32, 1), closed: make(chan struct{})} }

func (c *chanUI) WriteLine(string) error      { return nil }
func (c *chanUI) WriteStatus(st uint32) error { c.status <- st; return nil }
func (c *chanUI) Close() error                { close(c.closed); return nil }
func (c *chanUI) answered(t *testing.T) uint32 {
	t.Helper()
	select {
	case <-c.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("quit caller not answered")
	}
	select {
	case st := <-c.status:
		return st
	default:
		t.Fatal("quit caller closed without a status")
	}
	return 0
}

// The daemon's own lines go through its FIFO; on quit it ends the log,
// waits for its logger, removes the FIFO and exits.
func TestOwnRecordsThroughFIFO(t *testing.T) {
	d := fifoDaemon(t, Gen550)
	d.logf("first line")
	if got := controlLog(t, d, "first line\n"); !strings.Contains(got, "Control  4242] first line\n") {
		t.Fatalf("control.log %q", got)
	}
	ui := newChanUI()
	go d.execLocked(ui, 0, "quit")
	if st := ui.answered(t); st != 0 {
		t.Errorf("quit status %d", st)
	}
	if st := <-d.done; st != 0 {
		t.Errorf("exit status %d", st)
	}
	got := logPrefix.ReplaceAllString(controlLog(t, d, "Exit with status 0\n"), "")
	if want := "first line\nCmd:quit\nExit with status 0\n"; got != want {
		t.Errorf("control.log %q; want %q", got, want)
	}
	if _, err := os.Lstat(d.path(fifoName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the FIFO after quit: %v", err)
	}
}

// A header declaring 0xffffffff bytes swallows the daemon's own records;
// quit answers its caller, removes the pid file, and then waits for the
// logger for ever: the daemon does not exit and its FIFO stays.
func TestPoisonedLogQuitNeverEnds(t *testing.T) {
	for _, gen := range []Generation{Gen535, Gen550, Gen555, Gen580} {
		t.Run(strconv.Itoa(int(gen)), func(t *testing.T) {
			d := fifoDaemon(t, gen)
			if gen.HasPIDFile() {
				if err := os.WriteFile(d.path(pidFileName), []byte("4242"), 0o666); err != nil {
					t.Fatal(err)
				}
			}
			d.logf("before")
			controlLog(t, d, "before\n")
			poison(t, d, 0xabcde003)
			ui := &fakeUI{}
			for _, l := range []string{"get_server_list", "set_default_active_thread_percentage 50", "get_default_active_thread_percentage"} {
				d.execLocked(ui, 0, l)
			}
			if got := strings.Join(ui.lines, ","); got != "50.0,50.0" {
				t.Errorf("a poisoned daemon answers %q; want its answers as ever", got)
			}
			quit := newChanUI()
			go d.execLocked(quit, 0, "quit")
			if st := quit.answered(t); st != 0 {
				t.Errorf("quit status %d", st)
			}
			select {
			case st := <-d.done:
				t.Fatalf("the daemon exited (%d) with its logger inside a 4 GiB record", st)
			case <-time.After(200 * time.Millisecond):
			}
			if _, err := os.Stat(d.path(pidFileName)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pid file after quit: %v", err)
			}
			if _, err := os.Lstat(d.path(fifoName)); err != nil {
				t.Errorf("the FIFO after quit: %v; NVIDIA's stays while the daemon waits", err)
			}
			// Only a test can end the wait: the FIFO's reading end closed
			// under the logger.
			d.fifo.Close()
			<-d.done
			got, _ := os.ReadFile(filepath.Join(d.dirs.log, "control.log"))
			if strings.Contains(string(got), "Cmd:") || strings.Contains(string(got), "Exit with status") {
				t.Errorf("records after the poisoned header were logged:\n%s", got)
			}
		})
	}
}

// Once more text than the logger's room has come, the daemon crashes:
// here, its own records do it (about 25 control sessions' worth).
func TestPoisonedLogOverrunCrashes(t *testing.T) {
	d := fifoDaemon(t, Gen550)
	crashed := make(chan struct{})
	d.crash = func() { close(crashed) }
	poison(t, d, 0xabcde003)
	sent := 0
	for sent <= d.gen.LogRoom().Read {
		select {
		case <-crashed:
			t.Fatalf("crashed after %d bytes of text; room %+v", sent, d.gen.LogRoom())
		default:
		}
		r := mpslog.Record{Kind: mpslog.Control, PID: d.pid, Time: time.Now(), Msg: "Cmd:get_server_list\n"}
		d.record(r)
		sent += len(r.Encode())
	}
	select {
	case <-crashed:
	case <-time.After(5 * time.Second):
		t.Fatalf("no crash after %d bytes of text; room %+v", sent, d.gen.LogRoom())
	}
	d.logW.Close()
	d.fifo.Close()
	if got, _ := os.ReadFile(filepath.Join(d.dirs.log, "control.log")); len(got) != 0 {
		t.Errorf("logged %q", got)
	}
}

// A bad header stops the logger for good: nothing more is logged, and quit
// ends the daemon as usual (its end of log finds no logger to wait for).
func TestBadRecordStopsLogger(t *testing.T) {
	d := fifoDaemon(t, Gen555)
	poison(t, d, 0x12345678)
	d.logf("lost")
	ui := newChanUI()
	go d.execLocked(ui, 0, "quit")
	ui.answered(t)
	if st := <-d.done; st != 0 {
		t.Errorf("exit status %d", st)
	}
	if got, _ := os.ReadFile(filepath.Join(d.dirs.log, "control.log")); len(got) != 0 {
		t.Errorf("logged %q after a bad header", got)
	}
	if _, err := os.Lstat(d.path(fifoName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the FIFO after quit: %v", err)
	}
}
