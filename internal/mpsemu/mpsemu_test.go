package mpsemu_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/mpsemu/emuwire"
	"github.com/mpsd/mpsd/internal/testrun"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var logLine = regexp.MustCompile(`^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control +\d+\] `)

func listDir(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

func TestDaemonFilesPerGeneration(t *testing.T) {
	tests := []struct {
		gen          string
		running, end string
	}{
		{"535", "control control_lock control_privileged log", "control control_lock control_privileged"},
		{"550", "control control_lock control_privileged log nvidia-cuda-mps-control.pid", "control control_lock control_privileged"},
		{"555", "control control_lock control_privileged log nvidia-cuda-mps-control.pid", "control control_lock control_privileged"},
	}
	for _, tt := range tests {
		t.Run(tt.gen, func(t *testing.T) {
			m := newMPS(t, tt.gen, "")
			m.startDaemon()
			if got := listDir(t, m.pipe); got != tt.running {
				t.Errorf("pipe dir while running: %q; want %q", got, tt.running)
			}
			fi, err := os.Stat(m.pipe)
			if err != nil || fi.Mode().Perm() != 0o777 {
				t.Errorf("pipe dir mode %v, %v; want 0777 so every user's clients reach it", fi.Mode(), err)
			}
			if tt.gen != "535" {
				b, _ := os.ReadFile(filepath.Join(m.pipe, "nvidia-cuda-mps-control.pid"))
				if _, err := strconv.Atoi(string(b)); err != nil {
					t.Errorf("pid file %q: digits without newline expected", b)
				}
			}
			log := m.waitLog("control.log", "To connect CUDA applications", 1)
			for _, l := range strings.Split(strings.TrimSuffix(log, "\n"), "\n") {
				if !logLine.MatchString(l) {
					t.Errorf("control.log line %q not in MPS format", l)
				}
			}
			daemon := m.lockHolder()
			if daemon == 0 {
				t.Fatal("no process holds control_lock while the daemon runs")
			}
			if r := m.control("quit\n"); r.code != 0 || r.stdout != "" {
				t.Fatalf("quit: %+v", r)
			}
			// NVIDIA's daemon answers quit before it removes its FIFO
			// and exits: the files are final once it has gone.
			emutest.WaitGone(daemon)
			if emutest.Alive(daemon) {
				t.Fatalf("daemon %d still runs 5 s after quit", daemon)
			}
			if got := listDir(t, m.pipe); got != tt.end {
				t.Errorf("pipe dir after quit: %q; want %q", got, tt.end)
			}
			if got := listDir(t, m.logs); got != "control.log server.log" {
				t.Errorf("log dir %q", got)
			}
		})
	}
}

func TestArgvPerGeneration(t *testing.T) {
	help := "CUDA MPS Control for Linux/Unix.\n"
	tests := []struct {
		gen, arg  string
		code      int
		outPrefix string
		stderr    string
	}{
		{"535", "get_server_list", 1, "", "Cannot find MPS control daemon process\n"},
		{"550", "get_server_list", 1, "", "Cannot find MPS control daemon process\n"},
		{"555", "get_server_list", 1, help, ""},
		{"550", "-h", 0, help, ""},
		{"555", "--help", 0, help, ""},
	}
	for _, tt := range tests {
		t.Run(tt.gen+" "+tt.arg, func(t *testing.T) {
			m := newMPS(t, tt.gen, "")
			r := m.control("", tt.arg)
			if r.code != tt.code || !strings.HasPrefix(r.stdout, tt.outPrefix) || r.stderr != tt.stderr {
				t.Errorf("got %+v; want exit %d, stdout starting %q, stderr %q", r, tt.code, tt.outPrefix, tt.stderr)
			}
		})
	}
}

// Without MPSEMU_DRIVER, the driver a simulated GPU reports
// (MPSEMU_DRIVER_VERSION, set by mpsd --simulate) picks the generation:
// a 570 driver's daemon takes -multiuser-server, a 550 one runs
// `-d -multiuser-server` as a client, as NVIDIA's 550 does. MPSEMU_DRIVER
// still decides when set.
func TestDriverVersionPicksGeneration(t *testing.T) {
	for _, tt := range []struct {
		gen, version string
		daemon       bool
	}{
		{"", "570.172.08", true},
		{"", "580.159.04", true},
		{"", "550.163.01", false},
		{"550", "570.172.08", false},
		{"555", "550.163.01", true},
	} {
		t.Run(tt.gen+" "+tt.version, func(t *testing.T) {
			m := newMPS(t, tt.gen, "", "MPSEMU_DRIVER_VERSION="+tt.version)
			r := m.control("", "-d", "-multiuser-server")
			if !tt.daemon {
				if r.code != 1 || r.stderr != "Cannot find MPS control daemon process\n" {
					t.Fatalf("-d -multiuser-server: %+v; want the client's 'Cannot find MPS control daemon process'", r)
				}
				return
			}
			if r.code != 0 || r.stdout != "" {
				t.Fatalf("-d -multiuser-server: %+v; want a daemon", r)
			}
			if out := m.cmd("get_server_list"); out != "" {
				t.Errorf("get_server_list = %q", out)
			}
			m.cmd("quit")
		})
	}
}

func TestSecondDaemonSamePipe(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	r := m.control("", "-d")
	if r.code != 1 || r.stdout != "An instance of this daemon is already running\n" {
		t.Fatalf("second -d: %+v", r)
	}
	// Like NVIDIA's, the second instance announces itself through the
	// running daemon's log FIFO.
	m.waitLog("server.log", "] Using log directory: "+m.logs+"\n", 1)
	m.cmd("quit")
}

func TestForeground(t *testing.T) {
	m := newMPS(t, "550", "")
	fg := m.start(-1, emutest.ControlName, "-f")
	if l := fg.line(t); !strings.Contains(l, "Starting control daemon using socket "+m.pipe+"/control") {
		t.Fatalf("first line %q", l)
	}
	fg.line(t)
	if got := m.cmd("get_default_active_thread_percentage"); got != "100.0\n" {
		t.Errorf("got %q", got)
	}
	m.cmd("quit")
	if code := fg.wait(t); code != 0 {
		t.Errorf("-f exited %d", code)
	}
	if got := listDir(t, m.logs); got != "" {
		t.Errorf("-f wrote log files: %q", got)
	}
}

func TestStaleFilesAfterSIGKILL(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	pid := m.daemonPID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	emutest.WaitGone(pid)
	if got := listDir(t, m.pipe); !strings.Contains(got, "nvidia-cuda-mps-control.pid") || !strings.Contains(got, "log") {
		t.Errorf("SIGKILL should leave every file: %q", got)
	}
	if r := m.control("get_server_list\n"); r.code != 1 || r.stderr != "Cannot find MPS control daemon process\n" {
		t.Errorf("client of a dead daemon: %+v", r)
	}
	m.startDaemon()
	if m.daemonPID() == pid {
		t.Error("pid file not rewritten")
	}
	m.cmd("quit")
}

func TestSIGTERMOrphansServer(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	m.cmd("start_server -uid 0")
	m.waitLog("control.log", "NEW SERVER", 1)
	server := m.serverPID()
	daemon := m.daemonPID()
	if err := syscall.Kill(daemon, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	emutest.WaitGone(daemon)
	if !emutest.Alive(server) {
		t.Error("server died with its daemon; MPS servers are orphaned and keep running")
	}
	if b, _ := os.ReadFile(filepath.Join(m.logs, "control.log")); strings.Contains(string(b), "Exit with status") {
		t.Error("SIGTERM must kill the daemon without logging")
	}
}

// TestDataPath runs emulated CUDA clients through the emulated daemon and
// server: limits from the daemon's defaults, lowered by the client's env.
func TestDataPath(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	m.cmd("set_default_active_thread_percentage 50")
	m.cmd("set_default_device_pinned_mem_limit 0 8G")
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		line string
		err  string
	}{
		{"defaults", nil, nil, 0, "sm=50.0 devices=1 mem0=8192M", ""},
		{"env lowers", []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G"}, nil, 0, "sm=25.0 devices=1 mem0=4096M", ""},
		{"env cannot raise", []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=90", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16G"}, nil, 0, "sm=50.0 devices=1 mem0=8192M", ""},
		{"alloc within", nil, []string{"--alloc", "8G"}, 0, "sm=50.0", ""},
		{"alloc above pinned limit", nil, []string{"--alloc", "9G"}, 12, "sm=50.0", "CUDA error 2 cudaErrorMemoryAllocation"},
		{"bad flag", nil, []string{"--alloc", "lots"}, 2, "", "--alloc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := *m
			c.env = append(append([]string{}, m.env...), tt.env...)
			r := c.run(deadline, "", emutest.ClientName, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stdout, tt.line) || !strings.Contains(r.stderr, tt.err) {
				t.Errorf("got %+v; want exit %d, stdout with %q, stderr with %q", r, tt.code, tt.line, tt.err)
			}
		})
	}
	log := m.waitLog("control.log", "Server already exists", len(tests)-2)
	for _, want := range []string{"Server is not ready, push client to pending list", "NEW SERVER", "Starting new server"} {
		if !strings.Contains(log, want) {
			t.Errorf("control.log lacks %q", want)
		}
	}
	if got := m.cmd("get_server_status " + strconv.Itoa(m.serverPID())); got != "ACTIVE\n" {
		t.Errorf("status %q", got)
	}
}

func TestNoServerNoDaemon(t *testing.T) {
	m := newMPS(t, "550", "")
	r := m.run(deadline, "", emutest.ClientName)
	if r.code != 85 || !strings.Contains(r.stderr, "CUDA error 805 cudaErrorMpsConnectionFailed") {
		t.Errorf("got %+v; want exit 85 and error 805", r)
	}
}

// TestFaultContainmentProcesses: three client processes, one faults; all
// three fail with the fault and the server recovers once they are gone
// and its devices are reset (MPSEMU_FAULT_RESET): FAULT until then.
func TestFaultContainmentProcesses(t *testing.T) {
	m := newMPS(t, "550", "", "MPSEMU_FAULT_RESET=2s")
	m.startDaemon()
	a := m.start(-1, emutest.ClientName, "--duration", "1m")
	a.line(t)
	b := m.start(-1, emutest.ClientName, "--duration", "1m")
	b.line(t)
	c := m.start(-1, emutest.ClientName, "--duration", "1m", "--fault-after", "1ms")
	c.line(t)
	for i, p := range []*proc{a, b, c} {
		if code := p.wait(t); code != 70 || !strings.Contains(p.stderr.String(), "CUDA error 700 cudaErrorIllegalAddress") {
			t.Errorf("client %d: exit %d, stderr %q; want 70 and error 700", i, code, p.stderr.String())
		}
	}
	server := strconv.Itoa(m.serverPID())
	if got := m.cmd("get_server_status " + server); got != "FAULT\n" {
		t.Errorf("right after all affected clients left: %q; want FAULT while the devices reset", got)
	}
	until := time.Now().Add(deadline)
	for {
		got := m.cmd("get_server_status " + server)
		if got == "ACTIVE\n" {
			break
		}
		if got != "FAULT\n" || time.Now().After(until) {
			t.Fatalf("after the reset: %q; want ACTIVE within %v", got, deadline)
		}
		time.Sleep(20 * time.Millisecond) // a command-line interface: nothing to wait on
	}
}

// --fault-on-usr1 faults the client when the test says, not before: it
// stays connected until SIGUSR1, then it and its server's other clients
// get the sticky error.
func TestFaultOnSignal(t *testing.T) {
	m := newMPS(t, "550", "", "MPSEMU_FAULT_RESET=0")
	m.startDaemon()
	a := m.start(-1, emutest.ClientName, "--duration", "1m")
	a.line(t)
	c := m.start(-1, emutest.ClientName, "--duration", "1m", "--fault-on-usr1")
	c.line(t)
	if got := m.cmd("get_server_status " + strconv.Itoa(m.serverPID())); got != "ACTIVE\n" {
		t.Fatalf("before the signal: %q; want ACTIVE", got)
	}
	if err := c.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for i, p := range []*proc{a, c} {
		if code := p.wait(t); code != 70 || !strings.Contains(p.stderr.String(), "CUDA error 700 cudaErrorIllegalAddress") {
			t.Errorf("client %d: exit %d, stderr %q; want 70 and error 700", i, code, p.stderr.String())
		}
	}
}

// --hold-on-fault: a client that catches the sticky error and hangs on
// keeps its server in FAULT, refusing new clients, until it has gone.
func TestHoldOnFault(t *testing.T) {
	m := newMPS(t, "550", "", "MPSEMU_FAULT_RESET=0")
	m.startDaemon()
	a := m.start(-1, emutest.ClientName, "--duration", "1m", "--hold-on-fault")
	a.line(t)
	c := m.start(-1, emutest.ClientName, "--duration", "1m", "--fault-on-usr1")
	c.line(t)
	server := strconv.Itoa(m.serverPID())
	if err := c.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if code := c.wait(t); code != 70 {
		t.Errorf("the faulting client: exit %d, stderr %q; want 70", code, c.stderr.String())
	}
	if got := m.cmd("get_server_status " + server); got != "FAULT\n" {
		t.Errorf("with a client of the fault holding on: %q; want FAULT", got)
	}
	d := m.start(-1, emutest.ClientName, "--duration", "1ms")
	if code := d.wait(t); code == 0 {
		t.Errorf("a new client of a server in FAULT: exit 0; want it refused")
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.wait(t)
	until := time.Now().Add(deadline)
	for m.cmd("get_server_status "+server) != "ACTIVE\n" {
		if time.Now().After(until) {
			t.Fatalf("the server is not ACTIVE %v after its last client of the fault has gone", deadline)
		}
		time.Sleep(20 * time.Millisecond) // a command-line interface: nothing to wait on
	}
	e := m.start(-1, emutest.ClientName, "--duration", "1ms")
	if code := e.wait(t); code != 0 {
		t.Errorf("a new client once the FAULT is over: exit %d, stderr %q", code, e.stderr.String())
	}
}

func TestMaxClientsProcesses(t *testing.T) {
	m := newMPS(t, "550", "", "MPSEMU_MAX_CLIENTS=2")
	m.startDaemon()
	for range 2 {
		m.start(-1, emutest.ClientName, "--duration", "1m").line(t)
	}
	r := m.run(deadline, "", emutest.ClientName)
	if r.code != 88 || !strings.Contains(r.stderr, "CUDA error 808 cudaErrorMpsMaxClientsReached") {
		t.Errorf("third client: %+v; want exit 88", r)
	}
}

func TestTerminateClient(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	p := m.start(-1, emutest.ClientName, "--duration", "1m")
	p.line(t)
	server := strconv.Itoa(m.serverPID())
	if got := m.cmd("get_client_list " + server); got != strconv.Itoa(p.cmd.Process.Pid)+"\n" {
		t.Errorf("client list %q", got)
	}
	if got := m.cmd("terminate_client " + server + " " + strconv.Itoa(p.cmd.Process.Pid)); got != "0\n" {
		t.Errorf("terminate_client printed %q; want 0", got)
	}
	if code := p.wait(t); code != 90 {
		t.Errorf("terminated client exited %d; want 90 (error 810)", code)
	}
}

// TestClaimedPid: a client that reports another pid (--claim-pid) is
// listed by MPS under that pid, as NVIDIA's server lists what its clients
// tell it: a client list names no process for certain.
func TestClaimedPid(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	const claimed = 1
	p := m.start(-1, emutest.ClientName, "--duration", "1m", "--claim-pid", strconv.Itoa(claimed))
	p.line(t)
	server := strconv.Itoa(m.serverPID())
	if got := m.cmd("get_client_list " + server); got != strconv.Itoa(claimed)+"\n" {
		t.Errorf("client list %q; want the claimed pid %d", got, claimed)
	}
	if got := m.cmd("terminate_client " + server + " " + strconv.Itoa(claimed)); got != "0\n" {
		t.Errorf("terminate_client printed %q; want 0", got)
	}
	if code := p.wait(t); code != 90 {
		t.Errorf("terminated client exited %d; want 90 (error 810)", code)
	}
}

// TestSIGKILLedServer: clients fail at once, the daemon logs status 0.
func TestSIGKILLedServer(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	p := m.start(-1, emutest.ClientName, "--duration", "1m")
	p.line(t)
	server := m.serverPID()
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 86 {
		t.Errorf("client of a killed server exited %d; want 86 (error 806)", code)
	}
	m.waitLog("control.log", "Server "+strconv.Itoa(server)+" exited with status 0\n", 1)
	if got := m.cmd("get_server_list"); got != "" {
		t.Errorf("servers after kill: %q", got)
	}
}

// TestQuitWithServerIgnoringSIGINT: quit -t sends SIGINT and nothing more,
// so a server that ignores it (and has a client, so it cannot leave on its
// own) keeps quit waiting until the caller gives up.
func TestQuitWithServerIgnoringSIGINT(t *testing.T) {
	m := newMPS(t, "550", "", "MPSEMU_SERVER_IGNORE_SIGINT=1")
	m.startDaemon()
	m.start(-1, emutest.ClientName, "--duration", "1m").line(t)
	server := m.serverPID()
	r := m.run(2*time.Second, "quit -t 0\n", emutest.ControlName)
	if !r.timedOut {
		t.Fatalf("quit returned %+v; it must hang on a server that ignores SIGINT", r)
	}
	m.waitLog("control.log", "Force shutting down server "+strconv.Itoa(server), 1)
	if !emutest.Alive(server) {
		t.Error("server gone: quit escalated beyond SIGINT")
	}
}

// TestShutdownServerWaitsForClients: shutdown_server without -f lets the
// server finish its clients; a client arriving meanwhile waits, and gets a
// new server as soon as the old one has gone.
func TestShutdownServerWaitsForClients(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	first := m.start(-1, emutest.ClientName, "--duration", "1m")
	first.line(t)
	server := strconv.Itoa(m.serverPID())
	m.cmd("shutdown_server " + server)
	if got := m.cmd("get_client_list " + server); got != strconv.Itoa(first.cmd.Process.Pid)+"\n" {
		t.Fatalf("server with a client must stay: client list %q", got)
	}
	second := m.start(-1, emutest.ClientName)
	m.waitLog("control.log", "Server is not ready, push client to pending list", 2)
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	if code := first.wait(t); code != 143 {
		t.Errorf("client exit on SIGTERM: %d; want 143", code)
	}
	l := second.line(t)
	if !strings.HasPrefix(l, "mpsemu-client: pid=") || strings.Contains(l, " server="+server+" ") {
		t.Errorf("waiting client: %q; want it served by a new server", l)
	}
	log := m.waitLog("control.log", "Starting new server", 2)
	if strings.Index(log, "Server "+server+" exited with status 0") > strings.LastIndex(log, "Starting new server") {
		t.Errorf("new server started before the old one exited:\n%s", log)
	}
}

// TestUIDSerialisation: one server uid at a time. A client of a second uid
// waits until the first uid's server, asked to leave once idle, is gone.
func TestUIDSerialisation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: clients and servers run as uids 65534 and 65533")
	}
	// Every directory on the way must be reachable by those uids, which
	// t.TempDir's 0700 parents are not; the binaries are copied for the
	// same reason.
	dir, err := testrun.MkdirTemp("", "mpsemu-uid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := newMPS(t, "550", dir)
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{emutest.ControlName, emutest.ServerName, emutest.ClientName} {
		b, err := os.ReadFile(filepath.Join(m.bin, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bin, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m.bin = bin
	for i, kv := range m.env {
		if strings.HasPrefix(kv, "PATH=") {
			m.env[i] = "PATH=" + bin + ":/usr/sbin:/usr/bin:/sbin:/bin"
		}
	}
	m.startDaemon()

	first := m.start(65534, emutest.ClientName, "--duration", "1m")
	first.line(t)
	second := m.start(65533, emutest.ClientName)
	m.waitLog("control.log", "from user 65533: Server is not ready, push client to pending list", 1)
	if uid := procUID(t, m.serverPID()); uid != "65534" {
		t.Fatalf("the running server has uid %s; want 65534 while uid 65533 waits", uid)
	}
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	first.wait(t)
	m.waitLog("control.log", "for user 65533\n", 1)
	if l := second.line(t); !strings.HasPrefix(l, "mpsemu-client: pid=") {
		t.Errorf("second client: %q", l)
	}
	if uid := procUID(t, m.serverPID()); uid != "65533" {
		t.Errorf("second server runs as uid %s; want 65533", uid)
	}
	if code := second.wait(t); code != 0 {
		t.Errorf("second client exited %d: %s", code, second.stderr.String())
	}
}

// procUID is the real uid of a process.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return ""
}

// TestAgainstNVIDIADaemon: NVIDIA's daemon spawns the emulated server
// (which it reports INITIALIZING) and emulated clients use it directly;
// the emulator's client mode drives NVIDIA's daemon.
func TestAgainstNVIDIADaemon(t *testing.T) {
	real := emutest.RealControl(t, "550")
	m := newMPS(t, "550", "")
	nv := *m
	nv.bin = filepath.Dir(real)
	if r := nv.run(deadline, "", filepath.Base(real), "-d"); r.code != 0 {
		t.Fatalf("NVIDIA daemon: %+v", r)
	}
	m.cmd("start_server -uid 0")
	m.waitLog("control.log", "Starting new server", 1)
	server := strconv.Itoa(m.serverPID())
	if got := m.cmd("get_server_status " + server); got != "INITIALIZING\n" {
		t.Errorf("NVIDIA's daemon says %q about the emulated server", got)
	}
	// NVIDIA's daemon logs the server's start when it forks it; the
	// server listens a moment later.
	waitListening(t, emuwire.AnyServerSocket(m.pipe))
	r := m.run(deadline, "", emutest.ClientName)
	if r.code != 0 || !strings.Contains(r.stdout, "server="+server+" ") {
		t.Errorf("client via NVIDIA's daemon's server: %+v", r)
	}
	if r := m.control("quit -t 0\n"); r.code != 0 {
		t.Errorf("quit: %+v", r)
	}
}

// logMessages returns the messages of a log's lines whose bracket names
// kind ("Control", "Server", "Other"); "" takes every line.
func logMessages(log, kind string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		head, msg, ok := strings.Cut(l, "] ")
		if !ok {
			continue
		}
		if f := strings.Fields(head); kind == "" || (len(f) == 4 && f[2] == kind) {
			out = append(out, msg)
		}
	}
	return out
}

// wantInOrder fails unless want occurs in got as a subsequence.
func wantInOrder(t *testing.T, name string, got, want []string) {
	t.Helper()
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Errorf("%s: line %q (and those after it) missing or out of order; want in order:\n  %s\ngot:\n  %s",
			name, want[i], strings.Join(want, "\n  "), strings.Join(got, "\n  "))
	}
}

// TestLogsAsOnGPU: the lines only a GPU shows (clients, a ready server, its
// server.log) follow what a real server and daemon wrote on an H200
// (docs/gpu-probe/control.log and server.log).
func TestLogsAsOnGPU(t *testing.T) {
	m := newMPS(t, "550", "")
	m.startDaemon()
	m.cmd("set_default_active_thread_percentage 50")
	m.cmd("set_default_device_pinned_mem_limit 0 4096M")
	clientPID := func(r result) string {
		t.Helper()
		f := strings.Fields(r.stdout)
		if r.code != 0 || len(f) < 2 || !strings.HasPrefix(f[1], "pid=") {
			t.Fatalf("client: %+v", r)
		}
		return strings.TrimPrefix(f[1], "pid=")
	}
	first := clientPID(m.run(deadline, "", emutest.ClientName))
	server := strconv.Itoa(m.serverPID())
	second := clientPID(m.run(deadline, "", emutest.ClientName))
	m.waitLog("server.log", "Client process "+second+" disconnected", 1)
	m.cmd("shutdown_server " + server)
	control := m.waitLog("control.log", "Server "+server+" exited with status 0", 1)
	serverLog := m.waitLog("server.log", "] Exiting\n", 1)

	wantInOrder(t, "control.log", logMessages(control, "Control"), []string{
		"Accepting connection...",
		"User did not send valid credentials",
		"Accepting connection...",
		"NEW CLIENT " + first + " from user 0: Server is not ready, push client to pending list",
		"Starting new server " + server + " for user 0",
		"NEW SERVER " + server + ": Ready",
		"NEW CLIENT " + first + " from user 0: Server already exists",
		"User did not send valid credentials",
		"NEW CLIENT " + second + " from user 0: Server already exists",
		"NEW CLIENT " + second + " from user 0: Server already exists",
		"Cmd:shutdown_server " + server,
		"Try shutting down server " + server + ", backoff is disabled",
		"Server " + server + " exited with status 0",
	})
	if n := strings.Count(control, "NEW CLIENT "+first+" "); n != 2 {
		t.Errorf("control.log has %d NEW CLIENT lines for %s; want 2 (one per context)", n, first)
	}
	wantInOrder(t, "server.log (Other)", logMessages(serverLog, "Other"), []string{
		"Startup",
		"Connecting to control daemon on socket: " + filepath.Join(m.pipe, "control"),
		"Initializing server process",
	})
	clientLines := func(pid string) []string {
		return []string{
			"Client {PID: " + pid + ", Context ID: 0} connected",
			"Creating worker thread for client {PID: " + pid + ", Context ID: 0}",
			"Received new client request for {PID: " + pid + ", Context ID: 0}",
			"Client {PID: " + pid + ", Context ID: 1} connected",
			"Creating worker thread for client {PID: " + pid + ", Context ID: 1}",
			"Status of client {PID: " + pid + ", Context ID: 1} is ACTIVE",
			"Server failed to recevie command with status 806, assuming client {PID: " + pid + ", Context ID: 1} exit",
			"Client {PID: " + pid + ", Context ID: 1} exiting. Number of active client contexts is 0.",
			"Client process " + pid + " disconnected",
		}
	}
	want := []string{
		"Creating server context on device 0 (" + server0Name + ")",
		"Active Threads Percentage set to 50.0",
		"Device pinned memory limit for device 0 set to 0x100000000 bytes",
		"Server Priority set to 0",
		"Server has started",
	}
	want = append(append(append(want, clientLines(first)...), clientLines(second)...),
		"Server has been notified to shutdown", "Exiting")
	wantInOrder(t, "server.log (Server)", logMessages(serverLog, "Server"), want)
}

// server0Name is the emulated GPUs' name in server.log.
const server0Name = "MPS Emulated GPU"

// waitListening waits until an abstract unix socket addr ("@name") is
// listening, as /proc/net/unix lists it.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		b, err := os.ReadFile("/proc/net/unix")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 8 && f[len(f)-1] == addr {
				return
			}
		}
		if time.Now().After(end) {
			t.Fatalf("nothing listens on %s", addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The 580 generation writes what the H200's 580.159.04 wrote
// (docs/gpu-probe): the control daemon's binary version line after its
// start lines, the pinned-default command echoed with a period, and the
// server's shared memory, binary version and driver lines before the
// limits it echoes. 555, otherwise the same, writes none of them.
func TestGeneration580Lines(t *testing.T) {
	for _, gen := range []string{"580", "555"} {
		t.Run(gen, func(t *testing.T) {
			m := newMPS(t, gen, "")
			m.startDaemon()
			m.cmd("set_default_active_thread_percentage 50")
			m.cmd("set_default_device_pinned_mem_limit 0 4096M")
			m.cmd("start_server -uid 0")
			m.waitLog("control.log", "NEW SERVER", 1)
			server := m.serverPID()
			slog := m.waitLog("server.log", "Server has started", 1)
			clog := m.waitLog("control.log", "NEW SERVER", 1)
			want580 := gen == "580"
			start := "] To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=" + m.pipe + "\n"
			i := strings.Index(clog, start)
			if i < 0 {
				t.Fatalf("control.log has no start lines:\n%s", clog)
			}
			next, _, _ := strings.Cut(clog[i+len(start):], "\n")
			if got := strings.HasSuffix(next, "] CUDA MPS Control binary version: 13000"); got != want580 {
				t.Errorf("line after the start lines %q: version line %v, want %v", next, got, want580)
			}
			echo := "] Cmd:set_default_device_pinned_mem_limit 0 4096M\n"
			j := strings.Index(clog, echo)
			if j < 0 {
				t.Fatalf("control.log lacks the command:\n%s", clog)
			}
			next, _, _ = strings.Cut(clog[j+len(echo):], "\n")
			if got := strings.HasSuffix(next, "] set_default_device_pinned_mem_limit 0 4096M."); got != want580 {
				t.Errorf("line after the pinned default %q: echo %v, want %v", next, got, want580)
			}
			var lines []string
			for _, l := range strings.Split(slog, "\n") {
				if _, msg, ok := strings.Cut(l, fmt.Sprintf("Server %5d] ", server)); ok {
					lines = append(lines, msg)
				}
			}
			got := strings.Join(lines, "\n")
			want := "Creating server context on device 0 (MPS Emulated GPU)\n"
			if want580 {
				want += fmt.Sprintf("Created anonymous shared memory region mps.shm.0.%d\n", server) +
					"CUDA MPS Server for Linux/Unix. Binary version: 13000\nDisplay Driver version: 580\n"
			}
			want += "Active Threads Percentage set to 50.0\nDevice pinned memory limit for device 0 set to 0x100000000 bytes\nServer Priority set to 0\nServer has started"
			if !strings.HasPrefix(got, want) {
				t.Errorf("server.log's server lines:\n%s\nwant them to start with\n%s", got, want)
			}
			m.cmd("quit -t 0")
		})
	}
}
