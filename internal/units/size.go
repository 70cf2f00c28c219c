package units

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Binary size units, the only ones the project knows.
const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
	TiB int64 = 1 << 40
)

var (
	// ErrSyntax is wrapped by ParseSize when the text is not a size.
	ErrSyntax = errors.New("units: invalid size")
	// ErrRange is wrapped when a size does not fit in an int64 of bytes, or
	// (MPSLimit) is too small to express.
	ErrRange = errors.New("units: size out of range")
)

// maxFracDigits bounds the decimal places ParseSize reads; 10^19 still fits
// in a uint64, and further digits are worth less than a millionth of a byte.
const maxFracDigits = 19

var pow10 = func() [maxFracDigits + 1]uint64 {
	var p [maxFracDigits + 1]uint64
	p[0] = 1
	for i := 1; i < len(p); i++ {
		p[i] = p[i-1] * 10
	}
	return p
}()

// ParseSize returns the number of bytes s stands for.
//
// Accepted: a decimal number, optionally with a fraction (`1.5G`), then
// optionally spaces and a unit: K, M, G or T in either case (all binary),
// optionally followed by "i" and/or "B" (`8G`, `8GiB`, `8gi`, `8GB`), or "B"
// alone; no unit means bytes. Surrounding white space is ignored. Sub-byte
// remainders of a fraction are dropped (`1.1G` is 1181116006 bytes); a
// fraction of a bare byte count is an error. Signs, exponents, hex, "_"
// separators, lower-case "b" (bits) and units beyond T are errors.
//
// Errors wrap ErrSyntax (not a size) or ErrRange (more than an int64 of
// bytes) and quote the input.
func ParseSize(s string) (int64, error) {
	in := s
	bad := func(why string) (int64, error) {
		return 0, fmt.Errorf("%w %q: %s", ErrSyntax, in, why)
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return bad("empty")
	}
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intDigits := s[:i]
	if intDigits == "" {
		switch s[0] {
		case '-', '+':
			return bad("a size has no sign")
		case '.':
			return bad("write a digit before the decimal point (0.5G)")
		}
		return bad("a size starts with a digit")
	}
	var fracDigits string
	if i < len(s) && s[i] == '.' {
		j := i + 1
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		fracDigits = s[i+1 : j]
		if fracDigits == "" {
			return bad("a digit must follow the decimal point")
		}
		i = j
	}
	mult, why := unitOf(strings.TrimLeft(s[i:], " \t"))
	if why != "" {
		return bad(why)
	}
	if fracDigits != "" && mult == 1 {
		return bad("a byte count is a whole number")
	}

	tooBig := func() (int64, error) {
		return 0, fmt.Errorf("%w %q: more than %d bytes", ErrRange, in, int64(math.MaxInt64))
	}
	var n uint64
	for k := 0; k < len(intDigits); k++ {
		hi, lo := bits.Mul64(n, 10)
		if hi != 0 {
			return tooBig()
		}
		var carry uint64
		n, carry = bits.Add64(lo, uint64(intDigits[k]-'0'), 0)
		if carry != 0 {
			return tooBig()
		}
	}
	hi, total := bits.Mul64(n, uint64(mult))
	if hi != 0 || total > math.MaxInt64 {
		return tooBig()
	}
	if fracDigits != "" {
		if len(fracDigits) > maxFracDigits {
			fracDigits = fracDigits[:maxFracDigits]
		}
		f, err := strconv.ParseUint(fracDigits, 10, 64)
		if err != nil { // cannot happen: at most 19 digits
			return bad("fraction: " + err.Error())
		}
		// f/10^d < 1, so f*mult/10^d < mult and the high word is below 10^d.
		phi, plo := bits.Mul64(f, uint64(mult))
		part, _ := bits.Div64(phi, plo, pow10[len(fracDigits)])
		total += part
		if total > math.MaxInt64 {
			return tooBig()
		}
	}
	return int64(total), nil
}

// unitOf returns the multiplier of a unit suffix, or why it is not one.
func unitOf(u string) (int64, string) {
	if u == "" || u == "B" {
		return 1, ""
	}
	var mult int64
	switch u[0] {
	case 'k', 'K':
		mult = KiB
	case 'm', 'M':
		mult = MiB
	case 'g', 'G':
		mult = GiB
	case 't', 'T':
		mult = TiB
	case 'b':
		return 0, `"b" means bits; sizes are in bytes ("B")`
	default:
		return 0, fmt.Sprintf("unknown unit %q; use K, M, G or T (binary), optionally with iB, or none for bytes", u)
	}
	switch rest := u[1:]; rest {
	case "", "B", "i", "I", "iB", "IB":
		return mult, ""
	case "b", "ib", "Ib":
		return 0, fmt.Sprintf(`"%s" means bits; sizes are in bytes (%cB, %ciB)`, u, u[0], u[0])
	default:
		return 0, fmt.Sprintf("unknown unit %q; use K, M, G or T (binary), optionally with iB, or none for bytes", u)
	}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// FormatSize renders b for people in the largest binary unit it reaches,
// with at most two decimals, truncated so a limit is never overstated:
// 40G, 1.5G, 79.64G, 512M, 100B. ParseSize reads every result back,
// exactly when b is a whole number of hundredths of its unit.
func FormatSize(b int64) string {
	if b < 0 {
		return "-" + formatUnsigned(uint64(-(b+1))+1)
	}
	return formatUnsigned(uint64(b))
}

func formatUnsigned(b uint64) string {
	for _, u := range [...]struct {
		size   uint64
		suffix byte
	}{{uint64(TiB), 'T'}, {uint64(GiB), 'G'}, {uint64(MiB), 'M'}, {uint64(KiB), 'K'}} {
		if b < u.size {
			continue
		}
		buf := strconv.AppendUint(make([]byte, 0, 24), b/u.size, 10)
		// rem < 2^40, so rem*100 cannot overflow.
		if hundredths := b % u.size * 100 / u.size; hundredths != 0 {
			buf = append(buf, '.', byte('0'+hundredths/10))
			if hundredths%10 != 0 {
				buf = append(buf, byte('0'+hundredths%10))
			}
		}
		return string(append(buf, u.suffix))
	}
	return strconv.FormatUint(b, 10) + "B"
}

// MPSLimit renders b as the pinned device memory limit mps/ hands to MPS
// (set_default_device_pinned_mem_limit, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT):
// whole MiB with an "M" suffix, rounded down, e.g. 8 GiB is "8192M". MiB is
// the finest unit MPS reads; below 1 MiB the error wraps ErrRange.
func MPSLimit(b int64) (string, error) {
	if b < MiB {
		return "", fmt.Errorf("%w: MPS memory limit %s is below 1M, the smallest MPS can enforce", ErrRange, FormatSize(b))
	}
	return strconv.FormatInt(b/MiB, 10) + "M", nil
}
