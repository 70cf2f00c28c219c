package control

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
	"github.com/mpsd/mpsd/internal/mpsemu/mpssched"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeUI records what the daemon sends to one control session.
type fakeUI struct {
	lines    []string
	statuses []uint32
	closed   bool
}

func (f *fakeUI) WriteLine(s string) error    { f.lines = append(f.lines, s); return nil }
func (f *fakeUI) WriteStatus(st uint32) error { f.statuses = append(f.statuses, st); return nil }
func (f *fakeUI) Close() error                { f.closed = true; return nil }

var _ uiConn = (*fakeUI)(nil)

// testDaemon is a daemon with no sockets and no processes: commands run
// directly, servers cannot start.
func testDaemon(t testing.TB, gen Generation) (*Daemon, *bytes.Buffer) {
	t.Helper()
	var log bytes.Buffer
	dir := t.TempDir()
	d := newDaemon(gen, dirs{pipe: dir, log: dir}, false, false, true, &bytes.Buffer{})
	d.log = mpslog.NewSink(&log, &log)
	d.pid, d.uid = 4242, 0
	d.start = func(*exec.Cmd) error { return errors.New("no processes in unit tests") }
	return d, &log
}

var logPrefix = regexp.MustCompile(`(?m)^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control  4242\] `)

// TestCommands replays command sequences whose outputs and log lines were
// recorded from NVIDIA's daemons (no server running).
func TestCommands(t *testing.T) {
	const settingsRefused = "Insufficient privileges for UID 65534. Control deamon settings can only be modified by the user started it or by the root user."
	tests := []struct {
		name  string
		gen   Generation
		uid   uint32
		lines []string
		out   string // what the caller prints
		log   string // control.log messages after each "Cmd:" line
	}{
		{"empty server list", Gen550, 0, []string{"get_server_list"}, "", "Cmd:get_server_list\n"},
		{"status needs a pid", Gen550, 0, []string{"get_server_status", "get_server_status abc"},
			"A server PID is required\nA server PID is required\n",
			"Cmd:get_server_status\nA server PID is required\nCmd:get_server_status abc\nA server PID is required\n"},
		{"pid parsing", Gen550, 0, []string{"get_server_status 12abc", "get_server_status 99999999999", "get_server_status -5", "get_server_status 0x10"},
			"Server 12 not found\nServer 1215752191 not found\nServer -5 not found\nServer 0 not found\n", ""},
		{"535 has no get_server_status", Gen535, 0, []string{"get_server_status 1"}, "Unknown command \"get_server_status\"\n", ""},
		{"missing pid is 0", Gen550, 0, []string{"get_client_list", "get_client_list x", "shutdown_server", "shutdown_server -f 12"},
			"Server 0 not found\nServer 0 not found\nServer 0 not found\nServer 0 not found\n", ""},
		{"terminate without server", Gen550, 0, []string{"terminate_client 1 2"}, "Server 1 not found\nServer 1 not found!\n1\n", ""},
		{"start_server argument errors", Gen550, 0, []string{"start_server", "start_server -uid", "start_server -uid x", "start_server 0", "start_server -uid0", "start_server x -uid 0"},
			strings.Repeat("A user id (UID) is required to start a new server\n", 6), ""},
		{"default percentage", Gen550, 0, []string{"get_default_active_thread_percentage", "set_default_active_thread_percentage 25", "set_default_active_thread_percentage 33.333", "get_default_active_thread_percentage"},
			"100.0\n25.0\n33.3\n33.3\n", ""},
		{"invalid percentage echoes old value", Gen550, 0, []string{"set_default_active_thread_percentage 30", "set_default_active_thread_percentage abc", "set_default_active_thread_percentage 0", "set_default_active_thread_percentage 100.1", "set_default_active_thread_percentage"},
			"30.0\n30.0\n30.0\n30.0\n30.0\n",
			"Cmd:set_default_active_thread_percentage 30\n30.0\nCmd:set_default_active_thread_percentage abc\nInvalid percentage, expected between (0.0, 100.0]\n30.0\n" +
				"Cmd:set_default_active_thread_percentage 0\nInvalid percentage, expected between (0.0, 100.0]\n30.0\n" +
				"Cmd:set_default_active_thread_percentage 100.1\nInvalid percentage, expected between (0.0, 100.0]\n30.0\n" +
				"Cmd:set_default_active_thread_percentage\nInvalid percentage, expected between (0.0, 100.0]\n30.0\n"},
		{"strtod quirks", Gen550, 0, []string{"set_default_active_thread_percentage 12abc", "set_default_active_thread_percentage 0x10", "set_default_active_thread_percentage 1e1", "set_default_active_thread_percentage 0.01"},
			"12.0\n16.0\n10.0\n0.0\n", ""},
		{"pinned memory", Gen550, 0, []string{"get_default_device_pinned_mem_limit 0", "set_default_device_pinned_mem_limit 0 2G", "get_default_device_pinned_mem_limit 0", "set_default_device_pinned_mem_limit 1 3T", "get_default_device_pinned_mem_limit 1", "set_default_device_pinned_mem_limit 1 1536M", "get_default_device_pinned_mem_limit 1"},
			"2G\n3M\n1G\n",
			"Cmd:get_default_device_pinned_mem_limit 0\nNo default pinned memory limit set for the device!\nCmd:set_default_device_pinned_mem_limit 0 2G\nCmd:get_default_device_pinned_mem_limit 0\n2G\n" +
				"Cmd:set_default_device_pinned_mem_limit 1 3T\nCmd:get_default_device_pinned_mem_limit 1\n3M\nCmd:set_default_device_pinned_mem_limit 1 1536M\nCmd:get_default_device_pinned_mem_limit 1\n1G\n"},
		{"pinned memory argument quirks", Gen550, 0, []string{"set_default_device_pinned_mem_limit 0 5G", "set_default_device_pinned_mem_limit x 2G", "get_default_device_pinned_mem_limit 0",
			"set_default_device_pinned_mem_limit 1 -5G", "get_default_device_pinned_mem_limit 1", "set_default_device_pinned_mem_limit 4294967296 6G", "get_default_device_pinned_mem_limit 0"},
			"17179869179G\n6G\n", ""},
		{"device ordinals 0..31", Gen550, 0, []string{"set_default_device_pinned_mem_limit 31 1G", "set_default_device_pinned_mem_limit 32 1G", "get_default_device_pinned_mem_limit -1"},
			"",
			"Cmd:set_default_device_pinned_mem_limit 31 1G\nCmd:set_default_device_pinned_mem_limit 32 1G\nInvalid device ordinal!\nCmd:get_default_device_pinned_mem_limit -1\nInvalid device ordinal!\n"},
		{"priority", Gen550, 0, []string{"set_default_client_priority 1", "get_default_client_priority", "set_default_client_priority 2", "set_default_client_priority x", "get_default_client_priority"},
			"1\nInvalid priority value - must be 0 or 1!\n0\n", ""},
		{"unknown commands", Gen550, 0, []string{"foo bar", "", "   ", "GET_SERVER_LIST", "get_server_list2"},
			"Unknown command \"foo\"\nUnknown command \"\"\nUnknown command \"\"\nUnknown command \"GET_SERVER_LIST\"\nUnknown command \"get_server_list2\"\n", ""},
		{"carriage return and spaces", Gen550, 0, []string{"get_default_active_thread_percentage\r", "  get_default_client_priority"}, "100.0\n0\n",
			"Cmd:get_default_active_thread_percentage\r\n100.0\nCmd:  get_default_client_priority\n0\n"},
		{"non-root may not change defaults (550)", Gen550, 65534, []string{"set_default_active_thread_percentage 50", "set_default_client_priority 1", "get_default_active_thread_percentage"},
			settingsRefused + "\n" + settingsRefused + "\n100.0\n", ""},
		{"non-root may change defaults (535)", Gen535, 65534, []string{"set_default_active_thread_percentage 50"}, "50.0\n", ""},
		{"non-root start for another user", Gen555, 65534, []string{"start_server -uid 0"},
			"Insufficient privileges for UID 65534. Only the root user may start server for another user.\n", ""},
		{"non-root start for another user (535)", Gen535, 65534, []string{"start_server -uid 0"}, "Insufficient privileges for UID 65534\n", ""},
		{"non-root quit", Gen550, 65534, []string{"quit"}, "Not enough privilege to execute quit command\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, log := testDaemon(t, tt.gen)
			ui := &fakeUI{}
			for _, l := range tt.lines {
				d.execLocked(ui, tt.uid, l)
			}
			out := strings.Join(ui.lines, "\n")
			if len(ui.lines) > 0 {
				out += "\n"
			}
			if out != tt.out {
				t.Errorf("output:\n%q\nwant:\n%q", out, tt.out)
			}
			got := logPrefix.ReplaceAllString(log.String(), "")
			if tt.log != "" && got != tt.log {
				t.Errorf("log:\n%q\nwant:\n%q", got, tt.log)
			}
		})
	}
}

func TestQuitWithoutServers(t *testing.T) {
	d, log := testDaemon(t, Gen550)
	ui := &fakeUI{}
	d.execLocked(ui, 0, "quit -t 5")
	if st := <-d.done; st != 0 {
		t.Errorf("exit status %d", st)
	}
	if len(ui.statuses) != 1 || ui.statuses[0] != 0 || !ui.closed {
		t.Errorf("quit caller got statuses %v closed=%v; want [0] and closed", ui.statuses, ui.closed)
	}
	want := "Cmd:quit -t 5\nquit command issued with timeout of 5\nExit with status 0\n"
	if got := logPrefix.ReplaceAllString(log.String(), ""); got != want {
		t.Errorf("log %q; want %q", got, want)
	}
}

func TestQueuedStartsDroppedOnQuit(t *testing.T) {
	d, log := testDaemon(t, Gen550)
	// A server of uid 0 "starts" without a process (it never becomes
	// ready); the starts of uids 5 and 6 stay queued behind it.
	d.sched = mpssched.New(&noProcessStart{schedHost: schedHost{d}, pid: 76}, false, 0)
	ui := &fakeUI{}
	for _, l := range []string{"start_server -uid 0", "start_server -uid 5", "start_server -uid 5", "start_server -uid 6", "get_server_list"} {
		d.execLocked(ui, 0, l)
	}
	d.execLocked(ui, 0, "quit")
	if sv := d.sched.Servers(); len(sv) != 1 || !d.sched.Exited(sv[0]) {
		t.Fatalf("servers %v at quit; want the one of uid 0, and the daemon to end with it", sv)
	}
	d.finishLocked()
	<-d.done
	got := logPrefix.ReplaceAllString(log.String(), "")
	if n := strings.Count(got, "Removed Shm file at \n"); n != 2 {
		t.Errorf("%d queued starts dropped; want 2 (uids 5 and 6):\n%s", n, got)
	}
	if strings.Join(ui.lines, ",") != "77" {
		t.Errorf("output %q", ui.lines)
	}
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		gen       Generation
		args      []string
		mode      mode
		multiuser bool
		exit      int
	}{
		{Gen550, nil, modeClient, false, 0},
		{Gen550, []string{"-d"}, modeDaemon, false, 0},
		{Gen550, []string{"-f"}, modeForeground, false, 0},
		{Gen550, []string{"-h"}, modeHelp, false, 0},
		{Gen550, []string{"--help"}, modeHelp, false, 0},
		{Gen550, []string{"get_server_list"}, modeClient, false, 0},
		{Gen550, []string{"-d", "-multiuser-server"}, modeClient, false, 0},
		{Gen535, []string{"-d", "-h"}, modeClient, false, 0},
		{Gen555, []string{"get_server_list"}, modeHelp, false, 1},
		{Gen555, []string{""}, modeHelp, false, 1},
		{Gen555, []string{"-h", "-x"}, modeHelp, false, 1},
		{Gen555, []string{"-d", "-multiuser-server"}, modeDaemon, true, 0},
		{Gen555, []string{"-multiuser-server"}, modeClient, true, 0},
		{Gen555, []string{"-d", "-f"}, modeForeground, false, 0},
		{Gen555, []string{"-f", "-d"}, modeDaemon, false, 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d %q", tt.gen, tt.args), func(t *testing.T) {
			m, multi, exit := tt.gen.parseArgs(tt.args)
			if m != tt.mode || multi != tt.multiuser || exit != tt.exit {
				t.Errorf("%d %q = %v %v %d; want %v %v %d", tt.gen, tt.args, m, multi, exit, tt.mode, tt.multiuser, tt.exit)
			}
		})
	}
}

func TestParseGeneration(t *testing.T) {
	for in, want := range map[string]Generation{"": Gen550, "535": Gen535, "550": Gen550, "555": Gen555} {
		if g, err := ParseGeneration(in); err != nil || g != want {
			t.Errorf("ParseGeneration(%q) = %v, %v", in, g, err)
		}
	}
	if _, err := ParseGeneration("560"); !errors.Is(err, ErrGeneration) {
		t.Errorf("ParseGeneration(560) = %v; want ErrGeneration", err)
	}
}

// FuzzCommand runs arbitrary command lines through the daemon of each
// generation: it must not panic, every line it prints must also be logged,
// and it must never start a process on its own (d.start refuses).
func FuzzCommand(f *testing.F) {
	seeds := []string{
		"get_server_list", "get_server_status 12abc", "start_server -uid 0", "shutdown_server 1 -f",
		"set_default_active_thread_percentage 0x1p3", "set_default_device_pinned_mem_limit 31 -5G",
		"get_default_device_pinned_mem_limit 99999999999", "terminate_client x y", "quit -t -5",
		"set_device_pinned_mem_limit 1 2 3", "get_device_client_list", "\r", "foo\tbar", "",
	}
	for i, s := range seeds {
		f.Add(uint8(i), s)
	}
	gens := []Generation{Gen535, Gen550, Gen555}
	f.Fuzz(func(t *testing.T, g uint8, line string) {
		d, log := testDaemon(t, gens[int(g)%len(gens)])
		ui := &fakeUI{}
		uid := uint32(0)
		if g&0x80 != 0 {
			uid = 65534
		}
		d.execLocked(ui, uid, line)
		d.execLocked(ui, uid, line) // a second time, from the new state
		for _, l := range ui.lines {
			if !strings.Contains(log.String(), "] "+l+"\n") {
				t.Fatalf("printed %q but did not log it:\n%s", l, log.String())
			}
		}
		if d.finished && len(d.sched.Servers()) != 0 {
			t.Fatal("finished with servers left")
		}
	})
}

func TestGenerationForDriver(t *testing.T) {
	for in, want := range map[string]Generation{
		"535.261.03": Gen535, "545.29.06": Gen535, "550.163.01": Gen550, "550": Gen550,
		"555.58.02": Gen555, "570.172.08": Gen555, "580.159.04": Gen580, "590.1": Gen580,
	} {
		if g, err := GenerationForDriver(in); err != nil || g != want {
			t.Errorf("GenerationForDriver(%q) = %v, %v; want %v", in, g, err, want)
		}
	}
	for _, in := range []string{"", "530.30.02", "x.1", "+570.1", "0570.1", " 570", "-555"} {
		if g, err := GenerationForDriver(in); !errors.Is(err, ErrGeneration) {
			t.Errorf("GenerationForDriver(%q) = %v, %v; want ErrGeneration", in, g, err)
		}
	}
}

// MPSEMU_DRIVER names the generation outright; without it the simulated
// GPUs' driver version picks it; without either, the default.
func TestSelectGeneration(t *testing.T) {
	for _, tt := range []struct {
		gen, version string
		want         Generation
		bad          bool
	}{
		{"", "", DefaultGeneration, false},
		{"", "570.172.08", Gen555, false},
		{"", "580.159.04", Gen580, false},
		{"580", "", Gen580, false},
		{"", "550.163.01", Gen550, false},
		{"550", "570.172.08", Gen550, false},
		{"535", "", Gen535, false},
		{"", "470.1", 0, true},
		{"560", "570.172.08", 0, true},
	} {
		env := map[string]string{"MPSEMU_DRIVER": tt.gen, "MPSEMU_DRIVER_VERSION": tt.version}
		g, err := selectGeneration(func(k string) string { return env[k] })
		if tt.bad != errors.Is(err, ErrGeneration) || g != tt.want {
			t.Errorf("MPSEMU_DRIVER=%q MPSEMU_DRIVER_VERSION=%q: %v, %v; want %v (error %v)", tt.gen, tt.version, g, err, tt.want, tt.bad)
		}
	}
}

// FuzzGenerationForDriver: any version string gives a known generation,
// not newer than its major, or ErrGeneration.
func FuzzGenerationForDriver(f *testing.F) {
	for _, s := range []string{"570.172.08", "550", "535.1", "", "9999999999999999999999.1", "555.", ".555"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		g, err := GenerationForDriver(v)
		if err != nil {
			if !errors.Is(err, ErrGeneration) || g != 0 {
				t.Fatalf("%q: %v, %v", v, g, err)
			}
			return
		}
		major, _, _ := strings.Cut(v, ".")
		if n, _ := strconv.Atoi(major); g != Gen535 && g != Gen550 && g != Gen555 && g != Gen580 || n < int(g) {
			t.Fatalf("%q: generation %v", v, g)
		}
	})
}

// noProcessStart "starts" a server without a process: the next pid.
type noProcessStart struct {
	schedHost
	pid int
}

func (h *noProcessStart) StartServer(uid int32) *mpssched.Server {
	h.pid++
	return &mpssched.Server{PID: h.pid, UID: uid}
}
