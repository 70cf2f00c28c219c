package api

import (
	"errors"
	"fmt"
	"io"
	"strconv"
)

// API levels. Within protocol v1 (package doc) mpsd only adds: a request,
// a field, an event, a header. Each addition a client may depend on
// raises the level, and mpsd reports its level on every answer
// (HeaderAPILevel), so that a client that needs a later level than mpsd
// serves can say so (once) instead of failing on an unknown path or
// field. A client needs the level of the newest thing it uses; an mpsd of
// a later level serves every earlier one.
const (
	// LevelBase is protocol v1 as it stood before levels: leases, attach,
	// release, pod binding, status, drain, resume, restart, requeue,
	// shutdown and inject-xid. An answer without HeaderAPILevel comes
	// from an mpsd of this level.
	LevelBase = 1
	// LevelOperatorView adds what an operator sees and does: GET
	// /v1/version (PathVersion, Version), the HeaderVersion and
	// HeaderAPILevel headers on every answer and Status.Mpsd; POST
	// /v1/cancel (PathCancel) and the error event CodeCancelled; a
	// drain's AdminTarget.Reason, recorded as InstanceStatus.DrainReason,
	// DrainedBy and DrainedAt, with AdminResult.Already; the instance
	// states InstanceDrained and InstanceRetiring; GET /v1/history
	// (PathHistory, History) and ReleaseRequest.ExitStatus and Signal.
	// An mpsd without HeaderAPILevel may lack any of them.
	LevelOperatorView = 2

	// APILevel is the level this package describes: the one mpsd serves
	// and reports. A change that adds to the protocol adds a Level
	// constant above, says what it added, and moves APILevel to it.
	APILevel = LevelOperatorView
)

// Where mpsd says what it is.
const (
	// PathVersion returns mpsd's Version (GET). Anyone may ask.
	PathVersion = "/v1/version"
	// HeaderVersion carries mpsd's version (Version.Version) on every
	// answer, HeaderAPILevel its API level (a decimal integer).
	HeaderVersion  = "Mpsd-Version"
	HeaderAPILevel = "Mpsd-Api-Level"

	// MaxVersionBytes bounds a Version document.
	MaxVersionBytes = 4 << 10
	// MaxVersionLen bounds Version's strings (and HeaderVersion).
	MaxVersionLen = 128
	// maxAPILevel bounds the levels a reader takes for one: far above any
	// real one, far below an int's overflow.
	maxAPILevel = 1 << 20
)

// Version is the answer to GET PathVersion: the build of the mpsd that
// answers, as its --version line says it (internal/buildinfo), and the
// API level it serves.
type Version struct {
	// Version is mpsd's version: a tag, git describe's
	// "v1.2.3-4-g0123456", or "(devel)".
	Version string `json:"version"`
	// Commit is the commit mpsd was built from (hex), "" when unknown.
	Commit string `json:"commit,omitempty"`
	// Modified: the commit's work tree had changes.
	Modified bool `json:"modified,omitempty"`
	// APILevel is the API level mpsd serves (APILevel of its build).
	APILevel int `json:"api_level"`
	// GoVersion is the Go toolchain that built it.
	GoVersion string `json:"go_version,omitempty"`
}

// Validate checks what a reader relies on: a version, a level of at
// least LevelBase, and strings of printable ASCII within MaxVersionLen
// (so that they are safe in a header and on a terminal). Errors wrap
// ErrInvalid.
func (v Version) Validate() error {
	switch {
	case v.Version == "":
		return fmt.Errorf("%w: version: no version", ErrInvalid)
	case v.APILevel < LevelBase || v.APILevel > maxAPILevel:
		return fmt.Errorf("%w: version: api_level %d is not a level (%d-%d)", ErrInvalid, v.APILevel, LevelBase, maxAPILevel)
	}
	for _, f := range []struct{ name, s string }{{"version", v.Version}, {"commit", v.Commit}, {"go_version", v.GoVersion}} {
		if err := ValidVersionText(f.s); err != nil {
			return fmt.Errorf("%w: version: %s: %w", ErrInvalid, f.name, err)
		}
	}
	for _, c := range v.Commit {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("%w: version: commit %q is not lower-case hex", ErrInvalid, v.Commit)
		}
	}
	return nil
}

// errVersionText is ValidVersionText's reason.
var errVersionText = errors.New("not printable ASCII without spaces, or too long")

// ValidVersionText reports whether s may be a version string (of Version,
// or HeaderVersion's value): at most MaxVersionLen bytes of printable
// ASCII, no spaces.
func ValidVersionText(s string) error {
	if len(s) > MaxVersionLen {
		return errVersionText
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return errVersionText
		}
	}
	return nil
}

// DecodeVersion reads mpsd's answer to GET PathVersion from r: at most
// MaxVersionBytes, one JSON object and nothing after it; fields this
// version does not know are ignored (an answer, package doc); Validate
// must pass. Errors wrap ErrTooLarge or ErrInvalid.
func DecodeVersion(r io.Reader) (Version, error) {
	var v Version
	if err := decodeObject(r, MaxVersionBytes, "version", &v, false); err != nil {
		return Version{}, err
	}
	if err := v.Validate(); err != nil {
		return Version{}, err
	}
	return v, nil
}

// ParseAPILevel reads HeaderAPILevel's value: "" (no header: an mpsd from
// before levels) is LevelBase; a decimal integer from LevelBase up is
// that level; anything else wraps ErrInvalid.
func ParseAPILevel(h string) (int, error) {
	if h == "" {
		return LevelBase, nil
	}
	if len(h) > 7 || h[0] < '1' || h[0] > '9' {
		return 0, fmt.Errorf("%w: %s %q is not an API level", ErrInvalid, HeaderAPILevel, clipHeader(h))
	}
	n, err := strconv.Atoi(h)
	if err != nil || n < LevelBase || n > maxAPILevel {
		return 0, fmt.Errorf("%w: %s %q is not an API level", ErrInvalid, HeaderAPILevel, clipHeader(h))
	}
	return n, nil
}

// clipHeader shortens a header value an error quotes.
func clipHeader(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
