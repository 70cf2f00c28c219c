package gpusel

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Sentinel errors callers branch on with errors.Is; each failed entry is an
// *Error wrapping one of them.
var (
	// ErrSyntax: an entry is not a selector; Error.Reason says why.
	ErrSyntax = errors.New("gpusel: not a GPU selector")
	// ErrEmptyList: a list has no entries. "No GPUs" is never what a group
	// means, so an empty list is refused rather than selecting nothing.
	ErrEmptyList = errors.New("gpusel: empty selector list")
	// ErrUnknownIndex: an index names no GPU of the inventory.
	ErrUnknownIndex = errors.New("gpusel: no GPU with this index")
	// ErrNoMatch: a UUID or UUID prefix no GPU's UUID starts with, or "all"
	// on an inventory without GPUs.
	ErrNoMatch = errors.New("gpusel: selects no GPU")
	// ErrAmbiguous: a UUID prefix matches more than one GPU; Error.Matches
	// lists them.
	ErrAmbiguous = errors.New("gpusel: ambiguous UUID prefix")
)

// Kind is the form a selector was written in.
type Kind int

// The forms of a selector. The zero Kind belongs to the zero Selector only.
const (
	All      Kind = iota + 1 // "all"
	ByIndex                  // an NVML index
	ByUUID                   // a whole GPU UUID
	ByPrefix                 // a UUID prefix, with or without "GPU-"
)

// uuidLen is the length of "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
const uuidLen = len("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")

// Selector is one parsed entry. The zero Selector stands for the empty
// entry: it selects nothing, and resolving it fails with ErrSyntax.
type Selector struct {
	kind  Kind
	index int    // -1 unless kind is ByIndex
	uuid  string // lower case, starting "gpu-": the whole UUID or a prefix
	entry string
}

// Kind returns the form the selector was written in.
func (s Selector) Kind() Kind { return s.kind }

// Index returns the NVML index a ByIndex selector names, and -1 for the
// other kinds.
func (s Selector) Index() int {
	if s.kind != ByIndex {
		return -1
	}
	return s.index
}

// String returns the entry as it was given to Parse.
func (s Selector) String() string { return s.entry }

// GPU is what resolving needs of one GPU: callers copy their own inventory
// into these pairs and map the positions Resolve returns back to it.
type GPU struct {
	Index int
	UUID  string
}

// Error is one entry that failed to parse or resolve.
type Error struct {
	// Pos is the entry's position in the list given to ParseList or
	// Resolve; 0 from Parse and Selector.Resolve.
	Pos int
	// Entry is the entry as written.
	Entry string
	// Err is ErrSyntax, ErrUnknownIndex, ErrNoMatch or ErrAmbiguous.
	Err error
	// Reason says what is wrong, worded to follow the quoted entry
	// (`"GPU-": UUID prefix is empty`). Callers with a wording of their
	// own build it from Err, the Selector and Matches instead.
	Reason string
	// Matches are the GPUs an ambiguous prefix matches, in index order;
	// nil for the other errors.
	Matches []GPU
}

func (e *Error) Error() string { return fmt.Sprintf("gpusel: %q: %s", e.Entry, e.Reason) }

// Unwrap makes errors.Is(err, e.Err) true.
func (e *Error) Unwrap() error { return e.Err }

// Errors is every entry of a list that failed, in list order, so a config
// with three bad entries says so at once rather than one edit at a time.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.Is and errors.As see each entry's error.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Parse reads one entry. It does not trim space: callers that accept
// padded, hand-typed entries trim them first. Whether the entry names a GPU
// is for Resolve to say; Parse fails only with an *Error wrapping ErrSyntax.
func Parse(entry string) (Selector, error) {
	s, e := parse(entry)
	if e != nil {
		return Selector{}, e
	}
	return s, nil
}

func parse(entry string) (Selector, *Error) {
	bad := func(reason string) (Selector, *Error) {
		return Selector{}, &Error{Entry: entry, Err: ErrSyntax, Reason: reason}
	}
	lower := strings.ToLower(entry)
	switch {
	case entry == "":
		return bad("empty")
	case lower == "all":
		return Selector{kind: All, index: -1, entry: entry}, nil
	case isDigits(entry):
		// NVML counts devices in an unsigned int; anything past int32 is no
		// GPU's index, and refusing it keeps int conversions safe everywhere.
		n, err := strconv.ParseInt(entry, 10, 32)
		if err != nil {
			return bad("GPU index out of range")
		}
		return Selector{kind: ByIndex, index: int(n), entry: entry}, nil
	case strings.HasPrefix(lower, "mig-"):
		return bad("MIG devices cannot be selected; select the whole GPU")
	}
	body := strings.TrimPrefix(lower, "gpu-")
	switch {
	case body == "":
		return bad("UUID prefix is empty")
	case body[0] == '-' || strings.Trim(body, "0123456789abcdef-") != "":
		// A leading dash ("-1", "GPU--a") could never match a UUID; saying
		// so here beats "matches nothing" later.
		return bad(`want "all", an index, a GPU UUID or a UUID prefix`)
	}
	uuid := "gpu-" + body
	if len(uuid) > uuidLen {
		return bad("longer than a GPU UUID")
	}
	kind := ByPrefix
	if isFullUUID(uuid) {
		kind = ByUUID
	}
	return Selector{kind: kind, index: -1, uuid: uuid, entry: entry}, nil
}

// ParseList parses every entry of a list. It fails with ErrEmptyList for
// an empty list, or with Errors naming every bad entry (each wrapping
// ErrSyntax, Pos set); then it returns no selectors.
func ParseList(entries []string) ([]Selector, error) {
	if len(entries) == 0 {
		return nil, ErrEmptyList
	}
	out := make([]Selector, 0, len(entries))
	var errs Errors
	for i, entry := range entries {
		s, e := parse(entry)
		if e != nil {
			e.Pos = i
			errs = append(errs, e)
			continue
		}
		out = append(out, s)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// Resolve returns the positions in inv of the GPUs s selects, in index
// order. Every selector must select at least one GPU and a prefix exactly
// one, else it fails with an *Error wrapping ErrUnknownIndex, ErrNoMatch
// or ErrAmbiguous (ErrSyntax for the zero Selector).
func (s Selector) Resolve(inv []GPU) ([]int, error) {
	pos, e := s.resolve(inv)
	if e != nil {
		return nil, e
	}
	return pos, nil
}

func (s Selector) resolve(inv []GPU) ([]int, *Error) {
	fail := func(err error, reason string) ([]int, *Error) {
		return nil, &Error{Entry: s.entry, Err: err, Reason: reason}
	}
	if s.kind == 0 {
		return fail(ErrSyntax, "empty")
	}
	var pos []int
	for i, g := range inv {
		if s.selects(g) {
			pos = append(pos, i)
		}
	}
	sortByIndex(inv, pos)
	switch {
	case len(pos) == 0:
		err := ErrNoMatch
		if s.kind == ByIndex {
			err = ErrUnknownIndex
		}
		switch {
		case len(inv) == 0:
			return fail(err, "this host has no GPUs")
		case s.kind == ByIndex:
			n := fmt.Sprintf("%d GPUs", len(inv))
			if len(inv) == 1 {
				n = "1 GPU"
			}
			return fail(err, fmt.Sprintf("no GPU with index %d (this host has %s)", s.index, n))
		case s.kind == ByUUID:
			return fail(err, "no GPU with this UUID")
		}
		return fail(err, "no GPU UUID starts with it")
	case len(pos) > 1 && s.kind == ByPrefix:
		matches := make([]GPU, len(pos))
		names := make([]string, len(pos))
		for i, p := range pos {
			matches[i] = inv[p]
			names[i] = fmt.Sprintf("GPU %d (%s)", inv[p].Index, inv[p].UUID)
		}
		return nil, &Error{Entry: s.entry, Err: ErrAmbiguous, Reason: "matches " + strings.Join(names, ", "), Matches: matches}
	}
	return pos, nil
}

func (s Selector) selects(g GPU) bool {
	switch s.kind {
	case All:
		return true
	case ByIndex:
		return g.Index == s.index
	case ByUUID:
		return strings.ToLower(g.UUID) == s.uuid
	case ByPrefix:
		return strings.HasPrefix(strings.ToLower(g.UUID), s.uuid)
	}
	return false
}

// Resolve returns the positions in inv of the GPUs sels select together,
// once each, in index order. It fails with ErrEmptyList for no selectors,
// or with Errors naming every selector Selector.Resolve refuses (Pos is its
// position in sels); then it returns no positions.
func Resolve(inv []GPU, sels []Selector) ([]int, error) {
	if len(sels) == 0 {
		return nil, ErrEmptyList
	}
	picked := make([]bool, len(inv))
	var errs Errors
	for i, s := range sels {
		pos, e := s.resolve(inv)
		if e != nil {
			e.Pos = i
			errs = append(errs, e)
			continue
		}
		for _, p := range pos {
			picked[p] = true
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	var out []int
	for p, ok := range picked {
		if ok {
			out = append(out, p)
		}
	}
	sortByIndex(inv, out)
	return out, nil
}

// sortByIndex orders positions by GPU index, keeping inventory order where
// an inventory repeats an index.
func sortByIndex(inv []GPU, pos []int) {
	slices.SortStableFunc(pos, func(a, b int) int { return cmp.Compare(inv[a].Index, inv[b].Index) })
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// isFullUUID reports whether s (lower case, hex digits and dashes) has the
// exact shape gpu-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func isFullUUID(s string) bool {
	if len(s) != uuidLen || !strings.HasPrefix(s, "gpu-") {
		return false
	}
	for i, r := range s[len("gpu-"):] {
		if (r == '-') != (i == 8 || i == 13 || i == 18 || i == 23) {
			return false
		}
	}
	return true
}
