package mpsd

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The state file is written on every grant and release (batched, see
// store), and every write encodes every lease: with encoding/json's
// reflection that was most of a write's cost, and the state write most of
// a grant's (make bench, Admission). appendJSON encodes a savedState by
// hand into a reused buffer, byte for byte what json.Marshal makes of it
// (TestStateEncodingIsJSONs and FuzzStateEncoding hold it to that), so the
// file's format, and load's strict decoding of it, do not change. A field
// added to savedState or savedLease must be added here too: the tests
// fail until it is.

// appendJSON appends the JSON encoding of st to b.
func (st *savedState) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"version":`...)
	b = strconv.AppendInt(b, int64(st.Version), 10)
	b = append(b, `,"leases":`...)
	if st.Leases == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range st.Leases {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = st.Leases[i].appendJSON(b); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	if len(st.Quarantined) > 0 {
		b = append(b, `,"quarantined":`...)
		b = appendJSONStrings(b, st.Quarantined)
	}
	if len(st.QuarantineReasons) > 0 {
		b = append(b, `,"quarantine_reasons":{`...)
		for i, k := range sortedKeys(st.QuarantineReasons) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, st.QuarantineReasons[k])
		}
		b = append(b, '}')
	}
	if len(st.Drained) > 0 {
		b = append(b, `,"drained":`...)
		b = appendJSONStrings(b, st.Drained)
	}
	if len(st.Drains) > 0 {
		b = append(b, `,"drains":{`...)
		for i, k := range sortedKeys(st.Drains) {
			if i > 0 {
				b = append(b, ',')
			}
			dr := st.Drains[k]
			b = appendJSONString(b, k)
			b = append(b, `:{"reason":`...)
			b = appendJSONString(b, dr.Reason)
			b = append(b, `,"by":`...)
			b = appendJSONString(b, dr.By)
			b = append(b, `,"at":`...)
			var err error
			if b, err = appendJSONTime(b, dr.At); err != nil {
				return nil, err
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	if len(st.ServerLogs) > 0 {
		b = append(b, `,"server_logs":{`...)
		for i, k := range sortedKeys(st.ServerLogs) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = strconv.AppendInt(b, st.ServerLogs[k], 10)
		}
		b = append(b, '}')
	}
	if len(st.Servers) > 0 {
		b = append(b, `,"servers":{`...)
		for i, k := range sortedKeys(st.Servers) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendIntMap(b, st.Servers[k])
		}
		b = append(b, '}')
	}
	if len(st.Daemons) > 0 {
		b = append(b, `,"daemons":{`...)
		for i, k := range sortedKeys(st.Daemons) {
			if i > 0 {
				b = append(b, ',')
			}
			d := st.Daemons[k]
			b = appendJSONString(b, k)
			b = append(b, `:{"pid":`...)
			b = strconv.AppendInt(b, int64(d.PID), 10)
			b = append(b, `,"start_time":`...)
			b = strconv.AppendUint(b, d.StartTime, 10)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	if len(st.Barred) > 0 {
		b = append(b, `,"barred":{`...)
		for i, k := range sortedKeys(st.Barred) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			if st.Barred[k] == nil {
				b = append(b, "null"...)
				continue
			}
			b = append(b, '[')
			for j, bar := range st.Barred[k] {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, `{"uid":`...)
				b = strconv.AppendUint(b, uint64(bar.UID), 10)
				b = append(b, `,"until":`...)
				var err error
				if b, err = appendJSONTime(b, bar.Until); err != nil {
					return nil, err
				}
				b = append(b, `,"reason":`...)
				b = appendJSONString(b, bar.Reason)
				b = append(b, '}')
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendJSON appends the JSON encoding of l to b.
func (l *savedLease) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, l.ID)
	b = append(b, `,"group":`...)
	b = appendJSONString(b, l.Group)
	b = append(b, `,"instance":`...)
	b = appendJSONString(b, l.Instance)
	b = append(b, `,"uid":`...)
	b = strconv.AppendUint(b, uint64(l.UID), 10)
	b = append(b, `,"sm":`...)
	b = strconv.AppendInt(b, int64(l.SM), 10)
	b = append(b, `,"mem_bytes":`...)
	b = strconv.AppendInt(b, l.MemBytes, 10)
	b = append(b, `,"gpus":`...)
	b = strconv.AppendInt(b, int64(l.GPUs), 10)
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, int64(l.Priority), 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, l.Seq, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(l.Attempt), 10)
	b = append(b, `,"requeue":`...)
	b = strconv.AppendInt(b, int64(l.Requeue), 10)
	if l.Spared != 0 {
		b = append(b, `,"spared":`...)
		b = strconv.AppendInt(b, int64(l.Spared), 10)
	}
	if len(l.Command) > 0 {
		b = append(b, `,"command":`...)
		b = appendJSONStrings(b, l.Command)
	}
	var err error
	b = append(b, `,"created":`...)
	if b, err = appendJSONTime(b, l.Created); err != nil {
		return nil, err
	}
	if len(l.Only) > 0 {
		b = append(b, `,"only":[`...)
		for i, v := range l.Only {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(v), 10)
		}
		b = append(b, ']')
	}
	if l.JobID != "" {
		b = append(b, `,"job_id":`...)
		b = appendJSONString(b, l.JobID)
	}
	if l.RevokedFor != "" {
		b = append(b, `,"revoked_for":`...)
		b = appendJSONString(b, l.RevokedFor)
	}
	if !l.AwaySince.IsZero() {
		b = append(b, `,"away_since":`...)
		if b, err = appendJSONTime(b, l.AwaySince); err != nil {
			return nil, err
		}
	}
	if l.Ran != 0 {
		b = append(b, `,"ran":`...)
		b = strconv.AppendInt(b, int64(l.Ran), 10)
	}
	if !l.Granted.IsZero() {
		b = append(b, `,"granted":`...)
		if b, err = appendJSONTime(b, l.Granted); err != nil {
			return nil, err
		}
	}
	if l.Revoking {
		b = append(b, `,"revoking":true`...)
	}
	if l.Spare {
		b = append(b, `,"spare":true`...)
	}
	if l.EndCode != "" {
		b = append(b, `,"end_code":`...)
		b = appendJSONString(b, string(l.EndCode))
	}
	if l.EndMessage != "" {
		b = append(b, `,"end_message":`...)
		b = appendJSONString(b, l.EndMessage)
	}
	if l.Queued {
		b = append(b, `,"queued":true`...)
	}
	if l.Adopted {
		b = append(b, `,"adopted":true`...)
	}
	if l.Procs != 0 {
		b = append(b, `,"procs":`...)
		b = strconv.AppendInt(b, int64(l.Procs), 10)
	}
	return append(b, '}'), nil
}

// appendJSONTime appends t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds, quoted); a time it cannot encode is its error, as it is
// json.Marshal's.
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	if _, off := t.Zone(); t.Year() < 0 || t.Year() > 9999 || off%60 != 0 {
		m, err := t.MarshalJSON()
		if err != nil {
			return nil, err
		}
		return append(b, m...), nil
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

func appendJSONStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// appendIntMap appends m as encoding/json does: its keys as strings,
// sorted as strings.
func appendIntMap(b []byte, m map[int]int) []byte {
	type kv struct {
		k string
		v int
	}
	s := make([]kv, 0, len(m))
	for k, v := range m {
		s = append(s, kv{strconv.Itoa(k), v})
	}
	slices.SortFunc(s, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	b = append(b, '{')
	for i, e := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, e.k...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, int64(e.v), 10)
	}
	return append(b, '}')
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json quotes a string: ",
// \ and control characters escaped, <, > and & as \u escapes (its HTML
// safety), invalid UTF-8 as U+FFFD, U+2028 and U+2029 escaped. s is often
// a tenant's (a command line, a job id).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// maxKeptCommand bounds the command mpsd keeps of a lease request for
// display (status and the state file): the bytes of its JSON
// encoding as the state file spells it, brackets, quotes, commas and
// escapes included. A request's command may be api.MaxCommandBytes,
// which JSON may spell six times over ('<' is \u003c), and every queued
// request is in every state write: kept whole, 62 of them made each
// write 6 MiB.
const maxKeptCommand = 512

// keptMarkerRoom is what keptCommand leaves for its marker: a comma and
// the quoted "…(+N-more-arguments)" for any N a request can hold.
const keptMarkerRoom = 32

// keptCommand is argv as mpsd keeps it for display: whole while its
// encoding fits maxKeptCommand (the same slice); else its first
// arguments that fit, then a marker saying how many more the command
// had, as mps-launch marks a command it cut ("…(+3-more-arguments)"); a
// first argument too long on its own is cut at a character with an
// ellipsis. The command runs whole: mpsd never runs it.
func keptCommand(argv []string) []string {
	n := 2 // brackets
	for i, a := range argv {
		if i > 0 {
			n++
		}
		if n += jsonStringLenUpTo(a, maxKeptCommand-n); n > maxKeptCommand {
			break
		}
	}
	if n <= maxKeptCommand {
		return argv
	}
	room := maxKeptCommand - 2 - keptMarkerRoom
	kept := make([]string, 0, 8)
	used := 0
	for _, a := range argv {
		comma := 0
		if len(kept) > 0 {
			comma = 1
		}
		cost := comma + jsonStringLenUpTo(a, room-used-comma)
		if used+cost > room {
			break
		}
		kept = append(kept, a)
		used += cost
	}
	if len(kept) == 0 {
		// Its quotes and the ellipsis (three bytes) besides.
		kept = append(kept, cutJSON(argv[0], room-2-len("…"))+"…")
	}
	switch more := len(argv) - len(kept); more {
	case 0:
	case 1:
		kept = append(kept, "…(+1-more-argument)")
	default:
		kept = append(kept, "…(+"+strconv.Itoa(more)+"-more-arguments)")
	}
	return kept
}

// jsonStringLen is len(appendJSONString(nil, s)), without the encoding.
func jsonStringLen(s string) int { return jsonStringLenUpTo(s, math.MaxInt-6) }

// jsonStringLenUpTo is jsonStringLen(s) while that is at most limit, and
// some length over limit (found without reading all of s) otherwise.
func jsonStringLenUpTo(s string, limit int) int {
	n := 2
	for i := 0; i < len(s) && n <= limit; {
		enc, size := jsonCharLen(s, i)
		n += enc
		i += size
	}
	return n
}

// cutJSON is the longest prefix of s, cut before a character, that
// appendJSONString spells in at most room bytes (its quotes aside).
func cutJSON(s string, room int) string {
	n := 0
	for i := 0; i < len(s); {
		enc, size := jsonCharLen(s, i)
		if n+enc > room {
			return s[:i]
		}
		n += enc
		i += size
	}
	return s
}

// jsonCharLen is how many bytes appendJSONString spells the character at
// s[i] in, and how many bytes of s it is: an invalid byte is one
// character (\ufffd).
func jsonCharLen(s string, i int) (enc, size int) {
	if c := s[i]; c < utf8.RuneSelf {
		switch {
		case c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&':
			return 1, 1
		case c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t':
			return 2, 1
		}
		return 6, 1 // \u00XX
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	switch {
	case r == utf8.RuneError && size == 1:
		return 6, 1 // \ufffd
	case r == '\u2028' || r == '\u2029':
		return 6, size
	}
	return size, size
}
