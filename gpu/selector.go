package gpu

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Selector names GPUs in configuration (a group's `gpus:` list). Forms:
//
//	all                                      every GPU of the host
//	3                                        the GPU with NVML index 3
//	GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d a full UUID
//	GPU-1a2b, 1a2b                           a UUID prefix matching exactly one GPU
//
// Entries made only of digits are indexes; to give a UUID prefix that is all
// digits, write it with "GPU-". Matching is case-insensitive.
type Selector struct {
	kind   selectorKind
	index  int
	prefix string // lower-case UUID or UUID prefix, always starting "gpu-"
	raw    string
}

type selectorKind int

const (
	selectAll selectorKind = iota + 1
	selectIndex
	selectUUID
	selectPrefix
)

const uuidLen = len("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")

// String returns the selector as it was written.
func (s Selector) String() string { return s.raw }

// ParseSelector checks the syntax of one selector; whether it names a GPU is
// for Resolve to say. Errors wrap ErrBadSelector and quote the entry.
func ParseSelector(s string) (Selector, error) {
	raw := s
	s = strings.TrimSpace(s)
	bad := func(why string) (Selector, error) {
		return Selector{}, fmt.Errorf("%w %q: %s", ErrBadSelector, raw, why)
	}
	if s == "" {
		return bad("empty")
	}
	lower := strings.ToLower(s)
	if lower == "all" {
		return Selector{kind: selectAll, raw: raw}, nil
	}
	if isDigits(s) {
		i, err := strconv.Atoi(s)
		if err != nil {
			return bad("index out of range")
		}
		return Selector{kind: selectIndex, index: i, raw: raw}, nil
	}
	if strings.HasPrefix(lower, "mig-") {
		return bad("MIG devices cannot be selected; select the whole GPU")
	}
	body := strings.TrimPrefix(lower, "gpu-")
	if body == "" {
		return bad("UUID prefix is empty")
	}
	if !isUUIDChars(body) || body[0] == '-' {
		return bad(`want "all", an index, a GPU UUID or a UUID prefix`)
	}
	p := "gpu-" + body
	if len(p) > uuidLen {
		return bad("longer than a GPU UUID")
	}
	kind := selectPrefix
	if isFullUUID(p) {
		kind = selectUUID
	}
	return Selector{kind: kind, prefix: p, raw: raw}, nil
}

// ParseSelectors parses a selector list, reporting every bad entry at once.
// An empty list is an error: "no GPUs" is never what a group means.
func ParseSelectors(list []string) ([]Selector, error) {
	if len(list) == 0 {
		return nil, fmt.Errorf("%w: empty list (use [all] for every GPU)", ErrBadSelector)
	}
	out := make([]Selector, 0, len(list))
	var errs []error
	for _, s := range list {
		sel, err := ParseSelector(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, sel)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Resolve returns the GPUs of inv the selectors name, once each, in index
// order. Every selector must name at least one GPU and a prefix exactly one;
// all failures are reported together, wrapping ErrBadSelector or
// ErrAmbiguousSelector.
func Resolve(inv []Info, sels []Selector) ([]Info, error) {
	if len(sels) == 0 {
		return nil, fmt.Errorf("%w: empty list (use [all] for every GPU)", ErrBadSelector)
	}
	picked := make([]bool, len(inv))
	var errs []error
	for _, sel := range sels {
		matches := sel.match(inv)
		switch {
		case len(matches) == 0:
			errs = append(errs, fmt.Errorf("%w %q: %s", ErrBadSelector, sel.raw, noMatchReason(sel, inv)))
		case len(matches) > 1 && sel.kind == selectPrefix:
			names := make([]string, len(matches))
			for i, m := range matches {
				names[i] = fmt.Sprintf("GPU %d (%s)", inv[m].Index, inv[m].UUID)
			}
			errs = append(errs, fmt.Errorf("%w %q: matches %s", ErrAmbiguousSelector, sel.raw, strings.Join(names, ", ")))
		default:
			for _, m := range matches {
				picked[m] = true
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var out []Info
	for i, ok := range picked {
		if ok {
			out = append(out, inv[i])
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return a.Index - b.Index })
	return out, nil
}

// Select parses and resolves a selector list in one step.
func Select(inv []Info, list []string) ([]Info, error) {
	sels, err := ParseSelectors(list)
	if err != nil {
		return nil, err
	}
	return Resolve(inv, sels)
}

// match returns the positions in inv the selector names.
func (s Selector) match(inv []Info) []int {
	var out []int
	for i, info := range inv {
		var ok bool
		switch s.kind {
		case selectAll:
			ok = true
		case selectIndex:
			ok = info.Index == s.index
		case selectUUID:
			ok = strings.EqualFold(info.UUID, s.prefix)
		case selectPrefix:
			ok = strings.HasPrefix(strings.ToLower(info.UUID), s.prefix)
		}
		if ok {
			out = append(out, i)
		}
	}
	return out
}

func noMatchReason(s Selector, inv []Info) string {
	if len(inv) == 0 {
		return "this host has no GPUs"
	}
	switch s.kind {
	case selectIndex:
		return fmt.Sprintf("no GPU with index %d (this host has %d GPUs)", s.index, len(inv))
	case selectUUID:
		return "no GPU with this UUID"
	}
	return "no GPU UUID starts with it"
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func isUUIDChars(s string) bool {
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') && r != '-' {
			return false
		}
	}
	return true
}

// isFullUUID reports whether s (lower case) has the exact shape
// gpu-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func isFullUUID(s string) bool {
	if len(s) != uuidLen || !strings.HasPrefix(s, "gpu-") {
		return false
	}
	for i, r := range s[len("gpu-"):] {
		switch i {
		case 8, 13, 18, 23:
			if r != '-' {
				return false
			}
		default:
			if r == '-' {
				return false
			}
		}
	}
	return true
}
