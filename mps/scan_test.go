package mps

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The formats control.log records are matched against, by their number
// of %d verbs.
var scanFormats = map[string]int{
	binaryVersionFormat:                  1,
	"Exit with status %d":                1,
	"NEW SERVER %d: Ready":               1,
	"Starting new server %d for user %d": 2,
	"NEW CLIENT %d from user %d":         2,
	"Server %d exited with status %d":    2,
}

// sscanInts is what scanInts replaced, kept as its reference: fmt.Sscanf,
// and the round trip through fmt.Sprintf that rejects what Sscanf alone
// lets through.
func sscanInts(m, format string, n int) ([2]int, bool) {
	var v [2]int
	switch n {
	case 1:
		k, err := fmt.Sscanf(m, format, &v[0])
		return v, err == nil && k == 1 && fmt.Sprintf(format, v[0]) == m
	case 2:
		k, err := fmt.Sscanf(m, format, &v[0], &v[1])
		return v, err == nil && k == 2 && fmt.Sprintf(format, v[0], v[1]) == m
	}
	return v, false
}

func TestScanInts(t *testing.T) {
	for _, tc := range []struct {
		m, format string
		want      [2]int
		ok        bool
	}{
		{"NEW CLIENT 4242 from user 0", "NEW CLIENT %d from user %d", [2]int{4242, 0}, true},
		{"NEW CLIENT 4242 from user -1", "NEW CLIENT %d from user %d", [2]int{4242, -1}, true},
		{"Server 7 exited with status 0", "Server %d exited with status %d", [2]int{7, 0}, true},
		{"NEW SERVER 31: Ready", "NEW SERVER %d: Ready", [2]int{31}, true},
		{"NEW SERVER 31: Ready ", "NEW SERVER %d: Ready", [2]int{}, false},
		{"NEW SERVER  31: Ready", "NEW SERVER %d: Ready", [2]int{}, false},
		{"NEW SERVER +31: Ready", "NEW SERVER %d: Ready", [2]int{}, false},
		{"NEW SERVER 031: Ready", "NEW SERVER %d: Ready", [2]int{}, false},
		{"NEW SERVER -0: Ready", "NEW SERVER %d: Ready", [2]int{}, false},
		{"NEW SERVER -: Ready", "NEW SERVER %d: Ready", [2]int{}, false},
		{"NEW SERVER 99999999999999999999: Ready", "NEW SERVER %d: Ready", [2]int{}, false},
		{"NEW SERVER 1", "NEW SERVER %d: Ready", [2]int{}, false},
		{"Exit with status 3", "Exit with status %d", [2]int{3}, true},
		{"", "Exit with status %d", [2]int{}, false},
	} {
		n := strings.Count(tc.format, "%d")
		got, ok := scanInts(tc.m, tc.format, n)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("scanInts(%q, %q) = %v, %v; want %v, %v", tc.m, tc.format, got, ok, tc.want, tc.ok)
		}
		if ref, refOK := sscanInts(tc.m, tc.format, n); refOK != ok || (ok && ref != got) {
			t.Errorf("scanInts(%q, %q) = %v, %v; fmt says %v, %v", tc.m, tc.format, got, ok, ref, refOK)
		}
	}
}

// A record matches a format with scanInts exactly when it does with
// fmt.Sscanf and the round trip, with the same numbers; a message that
// is the format's with numbers put in is matched too.
func FuzzScanInts(f *testing.F) {
	f.Add("NEW CLIENT 4242 from user 0: Server already exists", 4242, -1)
	f.Add("Server 7 exited with status 0", 7, 0)
	f.Add("CUDA MPS Control binary version: 13000", 13000, 0)
	f.Add("NEW SERVER 00: Ready", 0, 0)
	f.Fuzz(func(t *testing.T, m string, a, b int) {
		for format, n := range scanFormats {
			got, ok := scanInts(m, format, n)
			ref, refOK := sscanInts(m, format, n)
			if ok != refOK || (ok && got != ref) {
				t.Fatalf("scanInts(%q, %q) = %v, %v; fmt says %v, %v", m, format, got, ok, ref, refOK)
			}
			var printed string
			if n == 1 {
				printed = fmt.Sprintf(format, a)
			} else {
				printed = fmt.Sprintf(format, a, b)
			}
			if got, ok := scanInts(printed, format, n); !ok || got[0] != a || (n == 2 && got[1] != b) {
				t.Fatalf("scanInts(%q, %q) = %v, %v; want %d, %d", printed, format, got, ok, a, b)
			}
		}
	})
}

// parseLogLineRef is ParseLogLine as it split the kind and pid with
// strings.Fields: the reference of the split that allocates nothing.
func parseLogLineRef(line string) (LogLine, bool) {
	line = strings.TrimRight(line, "\r\n")
	if len(line) < len(logTimeLayout)+4 || line[0] != '[' {
		return LogLine{}, false
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return LogLine{}, false
	}
	head := line[1:end]
	if len(head) < len(logTimeLayout)+1 {
		return LogLine{}, false
	}
	ts, err := time.ParseInLocation(logTimeLayout, head[:len(logTimeLayout)], time.Local)
	if err != nil {
		return LogLine{}, false
	}
	fields := strings.Fields(head[len(logTimeLayout):])
	if len(fields) != 2 {
		return LogLine{}, false
	}
	pid, err := strconv.Atoi(fields[1])
	if err != nil || pid <= 0 {
		return LogLine{}, false
	}
	return LogLine{Time: ts, Source: fields[0], PID: pid, Message: strings.TrimSpace(line[end+1:])}, true
}

// ParseLogLine splits a record's head into kind and pid as
// strings.Fields does (exactly two fields, whatever the white space), and
// parses the rest as before.
func FuzzParseLogLineSplit(f *testing.F) {
	for _, s := range []string{
		"[2026-11-29 19:34:29.400 Control  8004] NEW CLIENT 1 from user 2: Server already exists",
		"[2026-11-29 19:34:29.400 Control\t8004\u00a0] x",
		"[2026-11-29 19:34:29.400  Server 1 2] x",
		"[2026-11-29 19:34:29.400 Server\u20281] x",
		"[2026-11-29 19:34:29.400 Control \xff 8] x",
		"[2026-11-29 19:34:29.400 Control] x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		got, ok := ParseLogLine(line)
		want, wantOK := parseLogLineRef(line)
		if ok != wantOK || !got.Time.Equal(want.Time) || got.Source != want.Source || got.PID != want.PID || got.Message != want.Message {
			t.Fatalf("ParseLogLine(%q) = %+v, %v; strings.Fields' split gives %+v, %v", line, got, ok, want, wantOK)
		}
	})
}

// BenchmarkNewClientRecord is what one forged NEW CLIENT record costs the
// log follower (a member can write 90,000 a second): parsed, matched and
// folded into the NEW CLIENT event already waiting.
func BenchmarkNewClientRecord(b *testing.B) {
	log := slog.New(slog.DiscardHandler)
	d := &Daemon{pid: 4242, log: log, events: newEventQueue(log), ready: map[int]bool{}}
	line := "[2026-11-29 19:34:29.400 Control  4242] NEW CLIENT 1234 from user 1000: Server already exists\n"
	b.ReportAllocs()
	for b.Loop() {
		d.onLogLine(line, 0)
	}
}
