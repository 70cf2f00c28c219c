package cstr

import "fmt"

// Binary size units.
const (
	MiB = 1 << 20
	GiB = 1 << 30
)

// ParsePinnedLimit reads a pinned device memory limit the way MPS does: an
// unsigned decimal (strtoull, so "-5" wraps) followed by 'G' or 'g' for GiB;
// anything else, including no suffix, "T" or ".5G", means MiB. The result is
// in bytes, modulo 2^64 as in the real daemon; 0 means "no limit".
func ParsePinnedLimit(s string) uint64 {
	v, n := Strtoull(s)
	if n < len(s) && (s[n] == 'G' || s[n] == 'g') {
		return v << 30
	}
	return v << 20
}

// FormatPinnedLimit prints a limit as MPS does: whole GiB ("1G" for
// 1536 MiB) when at least 1 GiB, else whole MiB.
func FormatPinnedLimit(b uint64) string {
	if b >= GiB {
		return fmt.Sprintf("%dG", b>>30)
	}
	return fmt.Sprintf("%dM", b>>20)
}

// FormatPercent prints an SM percentage as MPS does ("%.1f"); Go's %.1f
// rounds the exact binary value like glibc's printf.
func FormatPercent(p float64) string { return fmt.Sprintf("%.1f", p) }

// ValidPercent reports whether p is a thread percentage MPS accepts:
// (0, 100]. NaN is rejected because both comparisons fail, as in C.
func ValidPercent(p float64) bool { return p > 0 && p <= 100 }
