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

	"github.com/NVIDIA/go-nvml/pkg/nvml"
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

func TestParseProcReport(t *testing.T) {
	r, err := ParseProcReport("procs GPU-ab 40 41=1024 42=0\n")
	if err != nil || r.UUID != "GPU-ab" || r.Server != 40 || r.Gone || len(r.Clients) != 2 || r.Clients[41] != 1024 || r.Clients[42] != 0 {
		t.Fatalf("ParseProcReport = %+v, %v", r, err)
	}
	if r, err := ParseProcReport("procs GPU-ab 40\n"); err != nil || len(r.Clients) != 0 || r.Clients == nil {
		t.Fatalf("a server without clients: %+v, %v", r, err)
	}
	if r, err := ParseProcReport("gone GPU-ab 40\n"); err != nil || !r.Gone || r.Server != 40 {
		t.Fatalf("gone: %+v, %v", r, err)
	}
	for _, bad := range []string{
		"procs GPU-ab 40", "procs ab 40\n", "procs GPU-ab 0\n", "procs GPU-ab -1\n", "procs GPU-ab 40 41\n",
		"procs GPU-ab 40 41=x\n", "procs GPU-ab 40 41=1 41=2\n", "procs GPU-ab 40 0=1\n", "gone GPU-ab 40 41=1\n",
		"gone GPU-ab\n", "xid GPU-ab 40\n", "procs GPU-ab 99999999999 1=1\n",
	} {
		if r, err := ParseProcReport(bad); err == nil {
			t.Errorf("ParseProcReport(%q) = %+v, want an error", bad, r)
		}
	}
}

func FuzzParseProcReport(f *testing.F) {
	for _, s := range []string{"procs GPU-ab 40 41=1024\n", "gone GPU-ab 40\n", "procs GPU- 1\n", "", "\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseProcReport(line)
		if err != nil {
			return
		}
		if !strings.HasPrefix(r.UUID, "GPU-") || r.Server <= 0 || (r.Gone != (r.Clients == nil)) {
			t.Fatalf("ParseProcReport(%q) accepted %+v", line, r)
		}
		for pid := range r.Clients {
			if pid <= 0 {
				t.Fatalf("ParseProcReport(%q) accepted client pid %d", line, pid)
			}
		}
	})
}

// The emulated daemons' process reports become what NVML lists: the
// server as a compute process holding its clients' memory, each client as
// an MPS client with its own; a gone report removes them, and a server
// that exited without one is dropped when NVML is asked.
func TestSimMPSProcesses(t *testing.T) {
	_, sim := newSimHost(t, SimSpec{GPUs: 1})
	dir := t.TempDir()
	sock := filepath.Join(dir, "xid.sock")
	stop, err := sim.ServeXidReports(sock, slog.New(slog.NewTextHandler(io.Discard, nil)))
	must(t, err)
	defer stop()
	report := func(line string) {
		t.Helper()
		c, err := net.Dial("unix", sock)
		must(t, err)
		_, err = io.WriteString(c, line)
		must(t, err)
		// The listener reads one line a connection, then hangs up.
		_, _ = io.ReadAll(c)
		_ = c.Close()
	}
	// The server must be a live process; this test's own pid stands in.
	server, client := os.Getpid(), os.Getppid()
	report(fmt.Sprintf("procs %s %d %d=%d\n", SimUUID(0), server, client, 3<<20))
	dev, ret := sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	compute, _ := dev.GetComputeRunningProcesses()
	clients, _ := dev.GetMPSComputeRunningProcesses()
	if len(compute) != 1 || int(compute[0].Pid) != server || compute[0].UsedGpuMemory != 3<<20 {
		t.Fatalf("compute processes %+v; want the server with its client's 3 MiB", compute)
	}
	if len(clients) != 1 || int(clients[0].Pid) != client || clients[0].UsedGpuMemory != 3<<20 {
		t.Fatalf("MPS client processes %+v; want the client with 3 MiB", clients)
	}
	report(fmt.Sprintf("gone %s %d\n", SimUUID(0), server))
	if compute, _ := dev.GetComputeRunningProcesses(); len(compute) != 0 {
		t.Fatalf("after gone: compute processes %+v", compute)
	}
	// A server that is no process any more is not listed.
	dead := exec.Command("true")
	must(t, dead.Run())
	must(t, sim.SetMPSServer(0, dead.Process.Pid, map[int]uint64{client: 1}))
	if compute, _ := dev.GetComputeRunningProcesses(); len(compute) != 0 {
		t.Fatalf("an exited server listed: %+v", compute)
	}
}

// Host.Processes reads both lists: an MPS server as a compute process with
// its clients' memory, each client as an MPS client, and says the GPU has
// an MPS client list.
func TestHostProcesses(t *testing.T) {
	h, sim := newSimHost(t, SimSpec{GPUs: 1})
	server, client := os.Getpid(), os.Getppid()
	must(t, sim.SetMPSServer(0, server, map[int]uint64{client: 5 << 20}))
	procs, mpsList, err := h.Processes(0)
	must(t, err)
	if !mpsList || len(procs) != 2 {
		t.Fatalf("Processes = %+v, mpsList %v; want the server and its client", procs, mpsList)
	}
	for _, p := range procs {
		want := ProcessCompute
		if p.PID == client {
			want = ProcessMPSClient
		}
		if p.Kind != want || p.UsedBytes == nil || *p.UsedBytes != 5<<20 {
			t.Errorf("process %d: kind %v, used %v; want %v with 5 MiB", p.PID, p.Kind, p.UsedBytes, want)
		}
	}
	if _, _, err := h.Processes(7); err == nil {
		t.Error("Processes of a GPU the host does not have: no error")
	}
}

// The MPS process table outlives the Sim that heard it, as a driver's
// outlives mpsd: a new Sim keeping the same file lists the live server's
// clients again, and forgets a server that has exited since (reaped or
// not).
func TestKeepMPSProcs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sim-procs.json")
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	live, gone := sleeper.Process.Pid, dead.Process.Pid
	// A server that has exited and not been reaped yet (a zombie) is gone
	// too, as the driver sees it.
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zombie.Wait() })

	s1, err := NewSim(SimSpec{GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if ret := s1.NVML().Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer s1.NVML().Shutdown()
	if err := s1.KeepMPSProcs(file); err != nil {
		t.Fatal(err)
	}
	// The table is written by ServeXidReports's writer, and the reports
	// it has heard are written by the time stop returns.
	stop, err := s1.ServeXidReports(filepath.Join(t.TempDir(), "xid.sock"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	uuid := SimUUID(0)
	s1.procReport(fmt.Sprintf("procs %s %d %d=%d\n", uuid, live, 4242, 1<<20), slog.New(slog.DiscardHandler))
	s1.procReport(fmt.Sprintf("procs %s %d %d=%d\n", uuid, gone, 4343, 1<<20), slog.New(slog.DiscardHandler))
	for deadline := time.Now().Add(10 * time.Second); ; { // until true has exited: a zombie
		if _, running := runningSince(zombie.Process.Pid); !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("true did not exit within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	s1.procReport(fmt.Sprintf("procs %s %d %d=%d\n", uuid, zombie.Process.Pid, 4444, 1<<20), slog.New(slog.DiscardHandler))
	stop()

	s2, err := NewSim(SimSpec{GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.KeepMPSProcs(file); err != nil {
		t.Fatal(err)
	}
	if ret := s2.NVML().Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer s2.NVML().Shutdown()
	clients, ret := s2.devs[0].GetMPSComputeRunningProcesses()
	if ret != nvml.SUCCESS || len(clients) != 1 || clients[0].Pid != 4242 || clients[0].UsedGpuMemory != 1<<20 {
		t.Fatalf("after a new Sim read the table: MPS clients %+v (%v); want only the live server's client 4242 with 1 MiB", clients, ret)
	}
	if err := s2.KeepMPSProcs(filepath.Join(t.TempDir(), "none.json")); err != nil {
		t.Fatalf("a table not written yet: %v", err)
	}
}
