package mps

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// ServerState is what get_server_status reports (or what is inferred on
// daemons that lack it).
type ServerState int

// Server states, as MPS names them.
const (
	StateUnknown ServerState = iota
	StateInitializing
	StateActive
	StateFault
)

func (s ServerState) String() string {
	switch s {
	case StateInitializing:
		return "INITIALIZING"
	case StateActive:
		return "ACTIVE"
	case StateFault:
		return "FAULT"
	}
	return "UNKNOWN"
}

// outputLines splits a command's stdout into trimmed, non-empty lines; the
// real daemon ends lines with \n, the field has seen CRLF.
func outputLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// classifyOutput maps the daemon's known failure lines (printed on stdout with
// exit status 0, or on stderr with exit status 1) to sentinels. It returns nil
// when no line is a known failure.
func classifyOutput(stdout, stderr string) error {
	for _, l := range outputLines(stderr + "\n" + stdout) {
		switch {
		case strings.HasPrefix(l, "Cannot find MPS control daemon process"),
			strings.HasPrefix(l, "Cannot authenticate or connect to MPS control daemon"):
			return ErrNoDaemon
		case strings.HasPrefix(l, "Cannot send command to MPS control daemon"):
			return ErrDaemonQuitting
		case strings.HasPrefix(l, "Unknown command"):
			return ErrUnknownCommand
		case strings.HasPrefix(l, "Server ") && (strings.HasSuffix(l, " not found") || strings.HasSuffix(l, " not found!")),
			l == "Server not found":
			return ErrServerNotFound
		case strings.HasPrefix(l, "A server PID is required"),
			strings.HasPrefix(l, "A user id (UID) is required"):
			return ErrInvalidValue
		case strings.HasPrefix(l, "Insufficient privileges"),
			strings.HasPrefix(l, "Not enough privilege"),
			strings.HasPrefix(l, "Only root user may"):
			return ErrPermission
		}
	}
	return nil
}

// parsePIDList parses get_server_list / get_client_list output: one pid per
// line, nothing when empty.
func parsePIDList(out string) ([]int, error) {
	lines := outputLines(out)
	pids := make([]int, 0, len(lines))
	for _, l := range lines {
		pid, err := strconv.Atoi(l)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%w: pid line %q", ErrUnexpectedOutput, l)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// parseServerState parses get_server_status output.
func parseServerState(out string) (ServerState, error) {
	lines := outputLines(out)
	if len(lines) != 1 {
		return StateUnknown, fmt.Errorf("%w: server status %q", ErrUnexpectedOutput, out)
	}
	switch lines[0] {
	case "INITIALIZING":
		return StateInitializing, nil
	case "ACTIVE":
		return StateActive, nil
	case "FAULT":
		return StateFault, nil
	}
	return StateUnknown, fmt.Errorf("%w: server status %q", ErrUnexpectedOutput, lines[0])
}

// SamePercent reports whether a thread percentage the daemon printed
// (as %.1f) is the one asked for: within half a tenth, and float noise.
// A NaN is no percentage and the same as nothing.
func SamePercent(printed, asked float64) bool {
	return !math.IsNaN(printed) && !math.IsNaN(asked) && math.Abs(printed-asked) <= 0.05+1e-9
}

// parsePercent parses a thread percentage the daemon prints as %.1f.
func parsePercent(out string) (float64, error) {
	lines := outputLines(out)
	if len(lines) != 1 {
		return 0, fmt.Errorf("%w: percentage %q", ErrUnexpectedOutput, out)
	}
	p, err := strconv.ParseFloat(lines[0], 64)
	if err != nil || math.IsNaN(p) || math.IsInf(p, 0) || p < 0 || p > 100 {
		return 0, fmt.Errorf("%w: percentage %q", ErrUnexpectedOutput, lines[0])
	}
	return p, nil
}

// parseMemLimit parses a pinned memory limit as the daemon prints it: <n>G
// (whole GiB, floored) or <n>M; empty means no limit set (ok false).
func parseMemLimit(out string) (bytes int64, ok bool, err error) {
	lines := outputLines(out)
	if len(lines) == 0 {
		return 0, false, nil
	}
	if len(lines) != 1 || len(lines[0]) < 2 {
		return 0, false, fmt.Errorf("%w: memory limit %q", ErrUnexpectedOutput, out)
	}
	l := lines[0]
	var shift uint
	switch l[len(l)-1] {
	case 'G':
		shift = 30
	case 'M':
		shift = 20
	default:
		return 0, false, fmt.Errorf("%w: memory limit %q", ErrUnexpectedOutput, l)
	}
	n, err := strconv.ParseInt(l[:len(l)-1], 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, false, fmt.Errorf("%w: memory limit %q", ErrUnexpectedOutput, l)
	}
	return n << shift, true, nil
}

// parseInt parses a single-integer answer (client priority, CUDA result code).
func parseInt(out string) (int, error) {
	lines := outputLines(out)
	if len(lines) != 1 {
		return 0, fmt.Errorf("%w: integer %q", ErrUnexpectedOutput, out)
	}
	n, err := strconv.Atoi(lines[0])
	if err != nil {
		return 0, fmt.Errorf("%w: integer %q", ErrUnexpectedOutput, lines[0])
	}
	return n, nil
}

// LogLine is one parsed control.log / server.log line:
// "[YYYY-MM-DD HH:MM:SS.mmm Control %5d] message".
type LogLine struct {
	Time    time.Time // local time as the daemon wrote it
	Source  string    // "Control" or "Server"
	PID     int       // the writing process (for "Starting new server" the new server)
	Message string
}

const logTimeLayout = "2006-01-02 15:04:05.000"

// ParseLogLine parses one MPS log line; ok is false for anything else.
func ParseLogLine(line string) (LogLine, bool) {
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
	// Two fields, kind and pid, split as strings.Fields would, without
	// its slice: this runs for every record anyone writes.
	rest := strings.TrimSpace(head[len(logTimeLayout):])
	sp := strings.IndexFunc(rest, unicode.IsSpace)
	if sp < 0 {
		return LogLine{}, false
	}
	source, pidField := rest[:sp], strings.TrimLeftFunc(rest[sp:], unicode.IsSpace)
	if strings.IndexFunc(pidField, unicode.IsSpace) >= 0 {
		return LogLine{}, false
	}
	pid, err := strconv.Atoi(pidField)
	if err != nil || pid <= 0 {
		return LogLine{}, false
	}
	return LogLine{Time: ts, Source: source, PID: pid, Message: strings.TrimSpace(line[end+1:])}, true
}

// logEvent maps a control.log line to an event; ok is false for lines that
// are no lifecycle event. Daemon exit is not taken from the log ("Exit with
// status" is written before the process is gone); pidfd reports it.
func logEvent(l LogLine) (Event, bool) {
	m := l.Message
	ev := Event{Time: l.Time, UID: -1, ExitStatus: -1, Source: SourceLog}
	var a, b int
	switch {
	case scan2(m, "Starting new server %d for user %d", &a, &b):
		ev.Kind, ev.PID, ev.UID = ServerStarted, a, b
	case scan1(m, "NEW SERVER %d: Ready", &a):
		ev.Kind, ev.PID = ServerReady, a
	case strings.HasPrefix(m, "NEW CLIENT ") && strings.Contains(m, ":") && scan2(m[:strings.IndexByte(m, ':')], "NEW CLIENT %d from user %d", &a, &b):
		ev.Kind, ev.PID, ev.UID = ClientConnected, a, b
	case scan2(m, "Server %d exited with status %d", &a, &b):
		ev.Kind, ev.PID, ev.ExitStatus = ServerExited, a, b
	case strings.HasPrefix(m, "Server encountered a fatal exception"):
		ev.Kind, ev.PID, ev.Message = FatalException, l.PID, m
	case strings.HasPrefix(m, "Failed to start server using uid "):
		rest := strings.TrimPrefix(m, "Failed to start server using uid ")
		uidStr, msg, _ := strings.Cut(rest, ",")
		uid, err := strconv.Atoi(strings.TrimSpace(uidStr))
		if err != nil {
			return Event{}, false
		}
		ev.Kind, ev.UID, ev.Message = ServerStartFailed, uid, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(msg), "error:"))
	default:
		return Event{}, false
	}
	if ev.PID < 0 || ev.UID < -1 {
		return Event{}, false
	}
	return ev, true
}

// serverLogEvent maps a server.log line to an event. A server that
// contains a fatal GPU error (Volta and newer) logs "Server is handling a
// fatal GPU error." before it tears down every client's contexts; that
// line alone is enough to act on, and comes before the clients exit. Just
// before it, the server names the client whose error it is ("Client {PID:
// C, Context: N} encountered a fatal GPU error."): a FaultCulprit, a hint
// of whose fault it was.
func serverLogEvent(l LogLine) (Event, bool) {
	if l.Source != "Server" || l.PID <= 0 {
		return Event{}, false
	}
	if l.Message == "Server is handling a fatal GPU error." {
		return Event{Kind: ServerFault, Time: l.Time, PID: l.PID, UID: -1, ExitStatus: -1, Source: SourceLog, Message: l.Message}, true
	}
	var client, ctx int
	if strings.HasPrefix(l.Message, "Client {PID: ") && scan2(l.Message, culpritFormat, &client, &ctx) && client > 0 && ctx >= 0 {
		return Event{Kind: FaultCulprit, Time: l.Time, PID: l.PID, Client: client, UID: -1, ExitStatus: -1, Source: SourceLog, Message: l.Message}, true
	}
	return Event{}, false
}

// culpritFormat is the record a server writes naming the client whose
// fatal GPU error it handles next.
const culpritFormat = "Client {PID: %d, Context: %d} encountered a fatal GPU error."

// scan1 and scan2 match a whole message against a format whose only verbs
// are %d (scanInts).
func scan1(m, format string, a *int) bool {
	v, ok := scanInts(m, format, 1)
	*a = v[0]
	return ok
}

func scan2(m, format string, a, b *int) bool {
	v, ok := scanInts(m, format, 2)
	*a, *b = v[0], v[1]
	return ok
}

// scanInts matches the whole of m against format, which has n %d verbs
// (n at most 2) and no other verb: its text exactly, each %d an int as %d
// prints it (an optional '-', then digits without a leading zero, "0"
// alone), so that only what fmt.Sprintf(format, ...) could have written
// matches (no "+5", "05", loose spacing or trailing text). It allocates
// nothing and gives up at the first byte that differs: every control.log
// record, which any member may write as fast as the daemon takes them, is
// matched against several formats.
func scanInts(m, format string, n int) (v [2]int, ok bool) {
	for i := 0; ; i++ {
		verb := strings.IndexByte(format, '%')
		if verb < 0 {
			return v, i == n && m == format
		}
		if i == n || i == len(v) || !strings.HasPrefix(m, format[:verb]) || !strings.HasPrefix(format[verb:], "%d") {
			return v, false
		}
		m, format = m[verb:], format[verb+2:]
		sign := 0
		if m != "" && m[0] == '-' {
			sign = 1
		}
		end := sign
		for end < len(m) && '0' <= m[end] && m[end] <= '9' {
			end++
		}
		digits := m[sign:end]
		if digits == "" || (digits[0] == '0' && (len(digits) > 1 || sign == 1)) {
			return v, false
		}
		x, err := strconv.Atoi(m[:end])
		if err != nil {
			return v, false // out of range
		}
		v[i], m = x, m[end:]
	}
}
