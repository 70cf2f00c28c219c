package mps

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestClassifyOutput(t *testing.T) {
	for _, tc := range []struct {
		name, stdout, stderr string
		want                 error
	}{
		{"ok list", "123\n", "", nil},
		{"empty", "", "", nil},
		{"no daemon", "", "Cannot find MPS control daemon process\n", ErrNoDaemon},
		{"quitting", "", "Cannot send command to MPS control daemon process\n", ErrDaemonQuitting},
		{"unknown", "Unknown command \"get_server_status 5\"\n", "", ErrUnknownCommand},
		{"not found", "Server 17 not found\n", "", ErrServerNotFound},
		{"not found bang", "Server 17 not found!\n", "", ErrServerNotFound},
		{"pid required", "A server PID is required\n", "", ErrInvalidValue},
		{"uid required", "A user id (UID) is required to start a new server\n", "", ErrInvalidValue},
		{"privilege", "Insufficient privileges for UID 5. Only the root user may start server for another user.\n", "", ErrPermission},
		{"crlf", "Server 1 not found\r\n", "", ErrServerNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := classifyOutput(tc.stdout, tc.stderr); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
				t.Fatalf("classifyOutput = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParsers(t *testing.T) {
	t.Run("pid list", func(t *testing.T) {
		for _, tc := range []struct {
			in   string
			want []int
			ok   bool
		}{
			{"", []int{}, true}, {"12\n34\n", []int{12, 34}, true}, {"12\r\n", []int{12}, true},
			{"x\n", nil, false}, {"0\n", nil, false}, {"-3\n", nil, false},
		} {
			got, err := parsePIDList(tc.in)
			if (err == nil) != tc.ok || (tc.ok && !slices.Equal(got, tc.want)) {
				t.Errorf("parsePIDList(%q) = %v, %v", tc.in, got, err)
			}
		}
	})
	t.Run("state", func(t *testing.T) {
		for in, want := range map[string]ServerState{"INITIALIZING\n": StateInitializing, "ACTIVE\n": StateActive, "FAULT": StateFault} {
			if got, err := parseServerState(in); err != nil || got != want {
				t.Errorf("parseServerState(%q) = %v, %v", in, got, err)
			}
		}
		if _, err := parseServerState("BUSY"); !errors.Is(err, ErrUnexpectedOutput) {
			t.Errorf("parseServerState(BUSY) = %v", err)
		}
	})
	t.Run("percent", func(t *testing.T) {
		for _, tc := range []struct {
			in   string
			want float64
			ok   bool
		}{{"25.0\n", 25, true}, {"100.0", 100, true}, {"", 0, false}, {"NaN", 0, false}, {"101.0", 0, false}, {"a\nb", 0, false}} {
			got, err := parsePercent(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("parsePercent(%q) = %v, %v", tc.in, got, err)
			}
		}
	})
	t.Run("mem limit", func(t *testing.T) {
		for _, tc := range []struct {
			in      string
			want    int64
			set, ok bool
		}{
			{"8G\n", 8 << 30, true, true}, {"512M", 512 << 20, true, true}, {"", 0, false, true},
			{"3T", 0, false, false}, {"G", 0, false, false}, {"-1M", 0, false, false}, {"99999999999999999G", 0, false, false},
		} {
			got, set, err := parseMemLimit(tc.in)
			if (err == nil) != tc.ok || got != tc.want || set != tc.set {
				t.Errorf("parseMemLimit(%q) = %v, %v, %v", tc.in, got, set, err)
			}
		}
	})
}

func TestParseLogLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		ok   bool
		want LogLine
	}{
		{"control", "[2026-11-29 19:34:29.400 Control  8004] Starting new server 8004 for user 0", true,
			LogLine{Time: time.Date(2026, 11, 29, 19, 34, 29, 400e6, time.Local), Source: "Control", PID: 8004, Message: "Starting new server 8004 for user 0"}},
		{"wide pid", "[2026-11-29 19:55:59.317 Control 23813] Cmd:quit -t 1", true,
			LogLine{Time: time.Date(2026, 11, 29, 19, 55, 59, 317e6, time.Local), Source: "Control", PID: 23813, Message: "Cmd:quit -t 1"}},
		{"crlf", "[2026-11-29 19:55:59.317 Server 7] x\r\n", true,
			LogLine{Time: time.Date(2026, 11, 29, 19, 55, 59, 317e6, time.Local), Source: "Server", PID: 7, Message: "x"}},
		{"empty", "", false, LogLine{}},
		{"no bracket", "2026-11-29 19:55:59.317 Control 1] x", false, LogLine{}},
		{"bad time", "[2026-13-29 19:55:59.317 Control 1] x", false, LogLine{}},
		{"no pid", "[2026-11-29 19:55:59.317 Control] x", false, LogLine{}},
		{"zero pid", "[2026-11-29 19:55:59.317 Control 0] x", false, LogLine{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseLogLine(tc.line)
			if ok != tc.ok || !got.Time.Equal(tc.want.Time) || got.Source != tc.want.Source || got.PID != tc.want.PID || got.Message != tc.want.Message {
				t.Fatalf("ParseLogLine = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestLogEvent(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		ok   bool
		want Event
	}{
		{"Starting new server 8004 for user 1000", true, Event{Kind: ServerStarted, PID: 8004, UID: 1000, ExitStatus: -1}},
		{"NEW SERVER 8004: Ready", true, Event{Kind: ServerReady, PID: 8004, UID: -1, ExitStatus: -1}},
		{"NEW CLIENT 99 from user 1000: Server already exists", true, Event{Kind: ClientConnected, PID: 99, UID: 1000, ExitStatus: -1}},
		{"NEW CLIENT 99 from user 1000: Server is not ready, push client to pending list", true, Event{Kind: ClientConnected, PID: 99, UID: 1000, ExitStatus: -1}},
		{"Server 8004 exited with status 1", true, Event{Kind: ServerExited, PID: 8004, UID: -1, ExitStatus: 1}},
		{"Server encountered a fatal exception. Shutting down", true, Event{Kind: FatalException, PID: 5, UID: -1, ExitStatus: -1, Message: "Server encountered a fatal exception. Shutting down"}},
		{"Failed to start server using uid 1000, error: bad things", true, Event{Kind: ServerStartFailed, UID: 1000, ExitStatus: -1, Message: "bad things"}},
		{"Server 8004 exited with status 1 extra", false, Event{}},
		{"Starting new server +8004 for user 0", false, Event{}},
		{"Server 8004 is <busy>", false, Event{}},
		{"Cmd:get_server_list", false, Event{}},
		{"Failed to start server using uid x, error: y", false, Event{}},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			got, ok := logEvent(LogLine{PID: 5, Source: "Control", Message: tc.msg})
			got.Time, got.Source = time.Time{}, 0
			if ok != tc.ok || got != tc.want {
				t.Fatalf("logEvent = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestServerLogEvent(t *testing.T) {
	for _, tc := range []struct {
		l      LogLine
		want   EventKind // 0: no event
		client int
	}{
		{LogLine{PID: 77, Source: "Server", Message: "Server is handling a fatal GPU error."}, ServerFault, 0},
		{LogLine{PID: 77, Source: "Control", Message: "Server is handling a fatal GPU error."}, 0, 0},
		{LogLine{PID: 0, Source: "Server", Message: "Server is handling a fatal GPU error."}, 0, 0},
		{LogLine{PID: 77, Source: "Server", Message: "Client {PID: 5, Context: 1} encountered a fatal GPU error."}, FaultCulprit, 5},
		{LogLine{PID: 77, Source: "Server", Message: "Client {PID: 5, Context: 0} encountered a fatal GPU error."}, FaultCulprit, 5},
		{LogLine{PID: 77, Source: "Control", Message: "Client {PID: 5, Context: 1} encountered a fatal GPU error."}, 0, 0},
		{LogLine{PID: 77, Source: "Server", Message: "Client {PID: 0, Context: 1} encountered a fatal GPU error."}, 0, 0},
		{LogLine{PID: 77, Source: "Server", Message: "Client {PID: -5, Context: 1} encountered a fatal GPU error."}, 0, 0},
		{LogLine{PID: 77, Source: "Server", Message: "Client {PID: 05, Context: 1} encountered a fatal GPU error."}, 0, 0},
		{LogLine{PID: 77, Source: "Server", Message: "Client {PID: 5, Context: 1} encountered a fatal GPU error. and more"}, 0, 0},
		{LogLine{PID: 77, Source: "Server", Message: "Client {PID: 5, Context: -1} encountered a fatal GPU error."}, 0, 0},
	} {
		ev, ok := serverLogEvent(tc.l)
		if ok != (tc.want != 0) || ok && (ev.Kind != tc.want || ev.PID != tc.l.PID || ev.Client != tc.client) {
			t.Errorf("serverLogEvent(%+v) = %v, %v; want %v (client %d)", tc.l, ev, ok, tc.want, tc.client)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	rest := strings.Repeat(" 0", 47)
	for _, tc := range []struct {
		name, in string
		ok       bool
		want     procStat
	}{
		{"zombie killed", "42 (nvidia-cuda-mps) Z 1" + rest + " 9", true, procStat{comm: "nvidia-cuda-mps", state: 'Z', ppid: 1, exitCode: 9, hasStart: true}},
		{"comm with parens", "42 (a) b (c)) S 7", true, procStat{comm: "a) b (c)", state: 'S', ppid: 7, exitCode: -1}},
		{"short", "42 (x)", false, procStat{}},
		{"no comm", "42 x S 1", false, procStat{}},
		// A real line (Linux 6.x, 52 fields): starttime is field 22.
		{"start time", "4242 (nvidia-cuda-mps) S 4200 4200 4200 0 -1 4194624 139 0 0 0 0 0 0 0 20 0 2 0 987654321 12345678 900 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0",
			true, procStat{comm: "nvidia-cuda-mps", state: 'S', ppid: 4200, exitCode: -1, startTime: 987654321, hasStart: true}},
		// A comm that fakes fields: counting starts after the last ')'.
		{"start time after fake comm", "7 (x) S 1 1 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 5 ) S 9" + strings.Repeat(" 0", 17) + " 777",
			true, procStat{comm: "x) S 1 1 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 5 ", state: 'S', ppid: 9, exitCode: -1, startTime: 777, hasStart: true}},
		{"start time too big", "1 (x) S 1" + strings.Repeat(" 0", 17) + " 18446744073709551616", false, procStat{}},
		{"start time negative", "1 (x) S 1" + strings.Repeat(" 0", 17) + " -5", false, procStat{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("parseProcStat = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestProcStatStartTimeOfSelf: the start time read for this process is
// the one the kernel reports, stable, and earlier than a child's.
func TestProcStatStartTimeOfSelf(t *testing.T) {
	me, err := readProcStat("/proc", os.Getpid())
	if err != nil || !me.hasStart || me.startTime == 0 {
		t.Fatalf("own stat: %+v, %v", me, err)
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	child, err := readProcStat("/proc", cmd.Process.Pid)
	if err != nil || child.startTime < me.startTime || child.ppid != os.Getpid() {
		t.Fatalf("child stat %+v, %v; own start %d", child, err, me.startTime)
	}
}

func FuzzParseProcStat(f *testing.F) {
	for _, s := range []string{
		"4242 (nvidia-cuda-mps) S 4200 4200 4200 0 -1 4194624 139 0 0 0 0 0 0 0 20 0 2 0 987654321 12345678 900",
		"42 (a) b (c)) S 7", "1 ()) Z 0", "(", ")", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		st, err := parseProcStat(s)
		if err != nil {
			return
		}
		if strings.LastIndexByte(s, ')') < 0 || st.state == ' ' {
			t.Fatalf("parseProcStat(%q) = %+v", s, st)
		}
		if !st.hasStart && st.startTime != 0 {
			t.Fatalf("parseProcStat(%q): start time %d without a field", s, st.startTime)
		}
	})
}

func FuzzParseLogLine(f *testing.F) {
	for _, s := range []string{
		"[2026-11-29 19:34:29.400 Control  8004] Starting new server 8004 for user 0",
		"[2026-11-29 19:34:29.400 Control  8004] NEW CLIENT 1 from user 2: Server already exists",
		"[2026-11-29 19:34:29.400 Control  8004] Server 8004 exited with status 0",
		"[2026-11-29 19:34:29.400 Control  8004] Failed to start server using uid 5, error: x",
		"[2026-11-29 19:34:29.400 Server 1] Server encountered a fatal exception. Shutting down",
		"[2026-11-29 19:34:29.400 Server 1] Client {PID: 42, Context: 1} encountered a fatal GPU error.",
		"[2026-11-29 19:34:29.400 Server 1] Server is handling a fatal GPU error.",
		"[", "]", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		l, ok := ParseLogLine(line)
		if !ok {
			return
		}
		if l.PID <= 0 || strings.ContainsAny(l.Source, " \t") {
			t.Fatalf("ParseLogLine(%q) = %+v", line, l)
		}
		if ev, ok := logEvent(l); ok && (ev.PID < 0 || ev.UID < -1 || ev.Kind < DaemonExited || ev.Kind > ClientConnected || ev.KnownServer) {
			t.Fatalf("logEvent(%+v) = %+v", l, ev)
		}
		if ev, ok := serverLogEvent(l); ok && (ev.PID != l.PID || l.Source != "Server" || ev.KnownServer ||
			(ev.Kind == FaultCulprit) != (ev.Client > 0) || ev.Kind != ServerFault && ev.Kind != FaultCulprit) {
			t.Fatalf("serverLogEvent(%+v) = %+v", l, ev)
		}
	})
}

func FuzzOutputParsers(f *testing.F) {
	for _, s := range []string{"", "123\n456\n", "25.0\n", "8G\n", "512M", "ACTIVE\n", "Server 1 not found\n", "Unknown command \"x\"", "0\n", "18446744073709551615G"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, out string) {
		_ = classifyOutput(out, out)
		if pids, err := parsePIDList(out); err == nil {
			for _, p := range pids {
				if p <= 0 {
					t.Fatalf("parsePIDList(%q) gave pid %d", out, p)
				}
			}
		}
		if p, err := parsePercent(out); err == nil && (p < 0 || p > 100) {
			t.Fatalf("parsePercent(%q) = %v", out, p)
		}
		if b, ok, err := parseMemLimit(out); err == nil && (b < 0 || (!ok && b != 0)) {
			t.Fatalf("parseMemLimit(%q) = %v, %v", out, b, ok)
		}
		if st, err := parseServerState(out); err == nil && st == StateUnknown {
			t.Fatalf("parseServerState(%q) accepted as unknown", out)
		}
		_, _ = parseInt(out)
		_, _ = parseProcStat(out)
	})
}

// TestSamePercent: the daemon prints percentages with one decimal, so a
// value within half a tenth is the one asked for, and no more; a NaN is
// never the same.
func TestSamePercent(t *testing.T) {
	for _, tc := range []struct {
		printed, asked float64
		want           bool
	}{
		{30, 30, true},
		{33.3, 100.0 / 3, true},
		{66.7, 200.0 / 3, true},
		{30.1, 30.05, true},
		{30.1, 30, false},
		{29.9, 30, false},
		{100, 99.9, false},
		{math.NaN(), 30, false},
		{30, math.NaN(), false},
	} {
		if got := SamePercent(tc.printed, tc.asked); got != tc.want {
			t.Errorf("SamePercent(%v, %v) = %v, want %v", tc.printed, tc.asked, got, tc.want)
		}
	}
}
