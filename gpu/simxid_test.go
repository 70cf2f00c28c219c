package gpu

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseXidReport(t *testing.T) {
	for _, tc := range []struct {
		line string
		uuid string
		xid  uint64
		ok   bool
	}{
		{"GPU-1234 31\n", "GPU-1234", 31, true},
		{"GPU-1234 31", "", 0, false}, // cut short
		{"GPU-1234\n", "", 0, false},
		{"nvidia0 31\n", "", 0, false},
		{"GPU-1234 0\n", "", 0, false},
		{"GPU-1234 -5\n", "", 0, false},
		{"GPU-1234 31 7\n", "", 0, false},
		{"GPU-1234 99999999999\n", "", 0, false},
	} {
		uuid, xid, err := ParseXidReport(tc.line)
		if (err == nil) != tc.ok || uuid != tc.uuid || xid != tc.xid {
			t.Errorf("ParseXidReport(%q) = %q, %d, %v; want %q, %d, ok %v", tc.line, uuid, xid, err, tc.uuid, tc.xid, tc.ok)
		}
	}
}

func FuzzParseXidReport(f *testing.F) {
	for _, s := range []string{"GPU-1234 31\n", "GPU- 1\n", "", "\n", "GPU-x 4294967296\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		uuid, xid, err := ParseXidReport(line)
		if err != nil {
			return
		}
		if !strings.HasPrefix(uuid, "GPU-") || xid == 0 || xid > 1<<32-1 {
			t.Fatalf("ParseXidReport(%q) accepted %q, %d", line, uuid, xid)
		}
		if again := fmt.Sprintf("%s %d\n", uuid, xid); strings.Join(strings.Fields(again), " ") != strings.Join(strings.Fields(line), " ") {
			t.Fatalf("ParseXidReport(%q) = %q %d, which does not read back", line, uuid, xid)
		}
	})
}

// The emulated daemons' reports become Xids on the simulated GPU they
// name, with no pid; a report from another uid (a tenant: the emulated
// servers and clients run as the tenants) raises nothing.
func TestServeXidReports(t *testing.T) {
	h, sim := newSimHost(t, SimSpec{GPUs: 2})
	w := startWatcher(t, h)
	waitClosed(t, sim.XidWatched(), "the Xid watcher to wait for events")
	// Not t.TempDir: the stranger must reach it.
	dir, err := os.MkdirTemp("", "gpuxid")
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "xid.sock")
	var stop func()
	stop, err = sim.ServeXidReports(sock, slog.New(slog.NewTextHandler(io.Discard, nil)))
	must(t, err)
	defer stop()
	report := func(line string) {
		t.Helper()
		c, err := net.Dial("unix", sock)
		must(t, err)
		_, err = io.WriteString(c, line)
		must(t, err)
		_ = c.Close()
	}

	if os.Geteuid() == 0 {
		// A stranger first: uid 64310 connects (the socket's directory is
		// opened up for it) and reports; nothing may come of it.
		must(t, os.Chmod(dir, 0o755))
		must(t, os.Chmod(sock, 0o777))
		// The test binary itself, as that uid (copied where it may run it).
		self := filepath.Join(dir, "gpu.test")
		b, err := os.ReadFile(os.Args[0])
		must(t, err)
		must(t, os.WriteFile(self, b, 0o755))
		cmd := exec.Command(self, "-test.run=^TestXidReportHelper$")
		cmd.Env = append(os.Environ(), "GPU_TEST_XID_SOCK="+sock, "GPU_TEST_XID_LINE="+SimUUID(1)+" 79\n")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 64310, Gid: 64310, Groups: []uint32{}}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the stranger's report: %v\n%s", err, out)
		}
	}
	report("GPU-not-here 31\n")
	report("garbage\n")
	report(SimUUID(1) + " 31\n")
	ev := w.next(t)
	if ev.GPU != 1 || ev.Xid != 31 || ev.PID != 0 || ev.Level != LevelApplication {
		t.Fatalf("event %+v; want Xid 31 on GPU 1 with no pid (and nothing from the stranger or the bad reports before it)", ev)
	}
	select {
	case ev := <-w.events:
		t.Fatalf("unexpected second event %+v", ev)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestXidReportHelper is TestServeXidReports's stranger when run as its
// child; it does nothing otherwise.
func TestXidReportHelper(t *testing.T) {
	sock := os.Getenv("GPU_TEST_XID_SOCK")
	if sock == "" {
		return
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The listener may hang up on a stranger before the line is written
	// (EPIPE): the attempt is what counts, not whether it was read.
	_, _ = io.WriteString(c, os.Getenv("GPU_TEST_XID_LINE"))
}
