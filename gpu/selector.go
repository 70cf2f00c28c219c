package gpu

import (
	"errors"
	"fmt"
	"strings"

	"github.com/mpsd/mpsd/internal/gpusel"
)

// Selector names GPUs in configuration (a group's `gpus:` list). Forms:
//
//	all                                      every GPU of the host
//	3                                        the GPU with NVML index 3
//	GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d a full UUID
//	GPU-1a2b, 1a2b                           a UUID prefix matching exactly one GPU
//
// Entries made only of digits are indexes; to give a UUID prefix that is all
// digits, write it with "GPU-". Matching is case-insensitive and space around
// an entry is ignored. The grammar is internal/gpusel's, shared with policy/.
type Selector struct {
	sel gpusel.Selector
	raw string
}

// String returns the selector as it was written.
func (s Selector) String() string { return s.raw }

// ParseSelector checks the syntax of one selector; whether it names a GPU is
// for Resolve to say. Errors wrap ErrBadSelector and quote the entry.
func ParseSelector(s string) (Selector, error) {
	sel, err := gpusel.Parse(strings.TrimSpace(s))
	if err != nil {
		return Selector{}, selectorError([]string{s}, err)
	}
	return Selector{sel: sel, raw: s}, nil
}

// ParseSelectors parses a selector list, reporting every bad entry at once.
// An empty list is an error: "no GPUs" is never what a group means.
func ParseSelectors(list []string) ([]Selector, error) {
	trimmed := make([]string, len(list))
	for i, s := range list {
		trimmed[i] = strings.TrimSpace(s)
	}
	sels, err := gpusel.ParseList(trimmed)
	if err != nil {
		return nil, selectorError(list, err)
	}
	out := make([]Selector, len(sels))
	for i, sel := range sels {
		out[i] = Selector{sel: sel, raw: list[i]}
	}
	return out, nil
}

// Resolve returns the GPUs of inv the selectors name, once each, in index
// order. Every selector must name at least one GPU and a prefix exactly one;
// all failures are reported together, wrapping ErrBadSelector or
// ErrAmbiguousSelector.
func Resolve(inv []Info, sels []Selector) ([]Info, error) {
	pairs := make([]gpusel.GPU, len(inv))
	for i, info := range inv {
		pairs[i] = gpusel.GPU{Index: info.Index, UUID: info.UUID}
	}
	core := make([]gpusel.Selector, len(sels))
	raw := make([]string, len(sels))
	for i, s := range sels {
		core[i], raw[i] = s.sel, s.raw
	}
	pos, err := gpusel.Resolve(pairs, core)
	if err != nil {
		return nil, selectorError(raw, err)
	}
	out := make([]Info, len(pos))
	for i, p := range pos {
		out[i] = inv[p]
	}
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

// selectorError rewords gpusel's errors as this package's: each failed
// entry wraps ErrBadSelector, or ErrAmbiguousSelector for an ambiguous
// prefix, and is quoted as the caller wrote it (raw, by position), padding
// included.
func selectorError(raw []string, err error) error {
	if errors.Is(err, gpusel.ErrEmptyList) {
		return fmt.Errorf("%w: empty list (use [all] for every GPU)", ErrBadSelector)
	}
	var list gpusel.Errors
	var one *gpusel.Error
	switch {
	case errors.As(err, &list):
	case errors.As(err, &one):
		list = gpusel.Errors{one}
	default:
		return fmt.Errorf("%w: %w", ErrBadSelector, err)
	}
	errs := make([]error, len(list))
	for i, e := range list {
		sentinel := ErrBadSelector
		if errors.Is(e, gpusel.ErrAmbiguous) {
			sentinel = ErrAmbiguousSelector
		}
		errs[i] = fmt.Errorf("%w %q: %s", sentinel, raw[e.Pos], e.Reason)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}
