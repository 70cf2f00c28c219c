package api

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"time"
	"unicode"
)

// PathHistory answers GET with the History of ended leases a
// HistoryQuery (its URL query) selects. Admins see every uid's; anyone
// else their own.
const PathHistory = "/v1/history"

// MaxHistoryRecords bounds the records one History answer carries: the
// newest that match, with Truncated set when older ones were left out.
const MaxHistoryRecords = 5000

// How a lease ended (HistoryRecord.Ended).
const (
	// EndedReleased: its command ended and its launcher released it;
	// ExitStatus says how the command ended, where the launcher told.
	EndedReleased = "released"
	// EndedLauncherGone: its launcher went away while it ran (its stream
	// closed, or it did not come back within the reconnect grace, or it
	// left while the lease was being revoked by anything but a cancel or
	// a shutdown, whose ends it keeps); its processes were killed.
	EndedLauncherGone = "launcher_gone"
	// EndedWithdrawn: it left the queue without running again: its
	// launcher left, its --wait ran out, --no-wait found no room, or its
	// uid is no longer a member of its group.
	EndedWithdrawn = "withdrawn"
	// EndedRefused: queued, then refused: its group changed and it can no
	// longer fit, or the config no longer lets its uid use the group.
	EndedRefused = "refused"
	// EndedGroupRemoved: queued in a group the config no longer has (a
	// reload removed it, or it left the config while mpsd was down).
	EndedGroupRemoved = "group_removed"
	// EndedExhausted: revoked (a fault charged to it) with no requeue
	// attempts left.
	EndedExhausted = "exhausted"
	// EndedOverLimit: revoked for good for passing its limits (its
	// device memory).
	EndedOverLimit = "over_limit"
	// EndedShutdown: ended by mpsctl shutdown, queued or running.
	EndedShutdown = "shutdown"
	// EndedCancelled: ended by mpsctl cancel.
	EndedCancelled = "cancelled"
	// EndedRevoked: revoked for good for any other reason, such as its
	// instance leaving the config while mpsd was down.
	EndedRevoked = "revoked"
)

// HistoryRecord is one ended lease, one line of mpsd's history file
// (state_dir/history.jsonl) as it is of the History answer.
type HistoryRecord struct {
	Lease string `json:"lease"`
	JobID string `json:"job,omitempty"`
	UID   uint32 `json:"uid"`
	// User is the uid's name on mpsd's host when the lease ended, ""
	// when unknown.
	User  string `json:"user,omitempty"`
	Group string `json:"group"`
	// GPUIndexes are the GPUs of its last run; empty if it never ran.
	GPUIndexes []int  `json:"gpus"`
	SM         int    `json:"sm"`
	MemBytes   uint64 `json:"mem_bytes"`
	Procs      int    `json:"procs"`
	// Start is when it was requested, Granted when its last run was
	// granted (absent if it never ran), End when it ended.
	Start   time.Time  `json:"start"`
	Granted *time.Time `json:"granted,omitempty"`
	End     time.Time  `json:"end"`
	// WaitMillis is the time it spent queued, every attempt's together.
	WaitMillis int64 `json:"wait_ms"`
	// Attempts is how many times it was granted (0: never).
	Attempts int `json:"attempts"`
	// Ended is how it ended (one of the Ended constants), Reason the
	// words of mpsd's log for it.
	Ended  string `json:"ended"`
	Reason string `json:"reason,omitempty"`
	// ExitStatus is its command's status as mps-launch reported it
	// (128+N when signal N, named by Signal, killed it); absent when
	// unknown (a launcher that did not say, or one that went away).
	ExitStatus *int   `json:"exit_status,omitempty"`
	Signal     string `json:"signal,omitempty"`
	// PeakMemBytes is the most device memory its processes held on one
	// of its GPUs at any reconciliation; absent if none read any.
	PeakMemBytes *uint64 `json:"peak_mem_bytes,omitempty"`
}

// History is the answer to GET PathHistory.
type History struct {
	// Records are the matching ended leases, oldest first.
	Records []HistoryRecord `json:"records"`
	// Truncated: older matching records were left out (MaxHistoryRecords).
	Truncated bool `json:"truncated,omitempty"`
	// OwnOnly: the caller is not an admin and sees only its own records.
	OwnOnly bool `json:"own_only,omitempty"`
}

// HistoryQuery selects ended leases: those that ended at or after Since
// (zero: any), of User (a uid in decimal or a user name; "": any) and of
// Group ("": any).
type HistoryQuery struct {
	Since time.Time
	User  string
	Group string
}

// Bounds of a HistoryQuery's fields.
const (
	maxHistoryUserLen  = 64
	maxHistoryGroupLen = 128
	maxHistoryQueryLen = 1024
)

// Values is q as the URL query of PathHistory.
func (q HistoryQuery) Values() url.Values {
	v := url.Values{}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.User != "" {
		v.Set("user", q.User)
	}
	if q.Group != "" {
		v.Set("group", q.Group)
	}
	return v
}

// Path is PathHistory with q as its query.
func (q HistoryQuery) Path() string {
	if v := q.Values(); len(v) > 0 {
		return PathHistory + "?" + v.Encode()
	}
	return PathHistory
}

// ParseHistoryQuery reads a HistoryQuery from the raw URL query of a
// request to PathHistory, as strictly as the decoders read bodies: an
// unknown or repeated key, a since that is not an RFC 3339 time, or a
// user or group too long or holding a control character or a space is
// refused, wrapping ErrInvalid.
func ParseHistoryQuery(raw string) (HistoryQuery, error) {
	var q HistoryQuery
	if len(raw) > maxHistoryQueryLen {
		return q, fmt.Errorf("%w: history query is %d bytes, the most is %d", ErrInvalid, len(raw), maxHistoryQueryLen)
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return HistoryQuery{}, fmt.Errorf("%w: history query: %w", ErrInvalid, err)
	}
	for _, k := range slices.Sorted(maps.Keys(v)) {
		if len(v[k]) != 1 {
			return HistoryQuery{}, fmt.Errorf("%w: history query: %q given %d times", ErrInvalid, k, len(v[k]))
		}
		s := v[k][0]
		switch k {
		case "since":
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return HistoryQuery{}, fmt.Errorf("%w: history query: since %q is not an RFC 3339 time", ErrInvalid, s)
			}
			q.Since = t
		case "user":
			if err := historyName("user", s, maxHistoryUserLen); err != nil {
				return HistoryQuery{}, err
			}
			q.User = s
		case "group":
			if err := historyName("group", s, maxHistoryGroupLen); err != nil {
				return HistoryQuery{}, err
			}
			q.Group = s
		default:
			return HistoryQuery{}, fmt.Errorf("%w: history query: unknown key %q (since, user, group)", ErrInvalid, k)
		}
	}
	return q, nil
}

func historyName(key, s string, most int) error {
	if s == "" || len(s) > most {
		return fmt.Errorf("%w: history query: %s: want 1 to %d characters", ErrInvalid, key, most)
	}
	for _, r := range s {
		if r == unicode.ReplacementChar || unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%w: history query: %s %q holds a space or a control character", ErrInvalid, key, s)
		}
	}
	return nil
}

// Matches reports whether q selects r.
func (q HistoryQuery) Matches(r HistoryRecord) bool {
	if !q.Since.IsZero() && r.End.Before(q.Since) {
		return false
	}
	if q.Group != "" && r.Group != q.Group {
		return false
	}
	if q.User != "" && q.User != r.User && q.User != strconv.FormatUint(uint64(r.UID), 10) {
		return false
	}
	return true
}
