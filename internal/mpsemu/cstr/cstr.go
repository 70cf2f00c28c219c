package cstr

import (
	"math"
	"strconv"
	"strings"
)

// IsSpace reports whether c is white space for C's isspace in the C locale.
func IsSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// SkipSpace drops leading C white space.
func SkipSpace(s string) string {
	i := 0
	for i < len(s) && IsSpace(s[i]) {
		i++
	}
	return s[i:]
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// digits scans optional white space, an optional sign and decimal digits.
// It returns the magnitude (saturated at math.MaxUint64 with overflow set),
// whether the sign was '-', and the bytes consumed; consumed is 0 when there
// are no digits, as for strtol's endptr.
func digits(s string) (mag uint64, neg, overflow bool, consumed int) {
	i := 0
	for i < len(s) && IsSpace(s[i]) {
		i++
	}
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		d := uint64(s[i] - '0')
		if !overflow {
			if mag > (math.MaxUint64-d)/10 {
				overflow = true
				mag = math.MaxUint64
			} else {
				mag = mag*10 + d
			}
		}
		i++
	}
	if i == start {
		return 0, false, false, 0
	}
	return mag, neg, overflow, i
}

// Strtol is C's strtol(s, &end, 10) on LP64: the value saturates at the
// int64 bounds; n is the number of bytes consumed, 0 when s holds no number.
func Strtol(s string) (v int64, n int) {
	mag, neg, overflow, n := digits(s)
	if n == 0 {
		return 0, 0
	}
	switch {
	case neg && (overflow || mag > 1<<63):
		return math.MinInt64, n
	case neg:
		return -int64(mag), n // mag == 1<<63 wraps to MinInt64, as C does
	case overflow || mag > math.MaxInt64:
		return math.MaxInt64, n
	}
	return int64(mag), n
}

// Strtoull is C's strtoull(s, &end, 10): a leading '-' negates modulo 2^64,
// overflow saturates at math.MaxUint64 whatever the sign.
func Strtoull(s string) (v uint64, n int) {
	mag, neg, overflow, n := digits(s)
	if n == 0 {
		return 0, 0
	}
	if overflow {
		return math.MaxUint64, n
	}
	if neg {
		return -mag, n
	}
	return mag, n
}

// ScanInt is sscanf(s, "%d", &v): glibc converts with strtol and stores the
// low 32 bits, so "99999999999" yields 1215752191.
func ScanInt(s string) (v int32, rest string, ok bool) {
	l, n := Strtol(s)
	if n == 0 {
		return 0, s, false
	}
	return int32(l), s[n:], true
}

// ScanUint is sscanf(s, "%u", &v): strtoul, then the low 32 bits ("-5" is
// 4294967291).
func ScanUint(s string) (v uint32, rest string, ok bool) {
	u, n := Strtoull(s)
	if n == 0 {
		return 0, s, false
	}
	return uint32(u), s[n:], true
}

// ScanToken is sscanf(s, "%s", buf): the next run of non-space bytes.
func ScanToken(s string) (tok, rest string, ok bool) {
	s = SkipSpace(s)
	i := 0
	for i < len(s) && !IsSpace(s[i]) {
		i++
	}
	if i == 0 {
		return "", s, false
	}
	return s[:i], s[i:], true
}

// Strtod is C's strtod(s, &end) in the C locale: the longest prefix that is
// a decimal or hexadecimal floating-point number, "inf", "infinity" or
// "nan[(...)]", after optional white space and sign. n is the number of
// bytes consumed, 0 when there is no number.
func Strtod(s string) (v float64, n int) {
	i := 0
	for i < len(s) && IsSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	body := i
	sign := 1.0
	if neg {
		sign = -1
	}
	lower := strings.ToLower(s[body:])
	switch {
	case strings.HasPrefix(lower, "infinity"):
		return sign * math.Inf(1), body + len("infinity")
	case strings.HasPrefix(lower, "inf"):
		return sign * math.Inf(1), body + len("inf")
	case strings.HasPrefix(lower, "nan"):
		j := body + 3
		if j < len(s) && s[j] == '(' {
			k := j + 1
			for k < len(s) && (isAlnum(s[k]) || s[k] == '_') {
				k++
			}
			if k < len(s) && s[k] == ')' {
				j = k + 1
			}
		}
		return math.NaN(), j
	case strings.HasPrefix(lower, "0x"):
		if end, ok := scanHex(s, body+2); ok {
			lit := s[body:end]
			if !strings.ContainsAny(lit, "pP") {
				lit += "p0"
			}
			f, err := strconv.ParseFloat(lit, 64)
			if err != nil && !isRangeErr(err) {
				return 0, 0
			}
			return sign * f, end
		}
		// "0x" with no hex digits: the number is the "0".
		return 0 * sign, body + 1
	}
	end, ok := scanDecimal(s, body)
	if !ok {
		return 0, 0
	}
	f, err := strconv.ParseFloat(s[body:end], 64)
	if err != nil && !isRangeErr(err) {
		return 0, 0
	}
	return sign * f, end
}

func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

func isAlnum(c byte) bool {
	return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'z')
}

func isHex(c byte) bool {
	return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'f')
}

// scanDecimal returns the end of "digits[.digits][e[+-]digits]" at i, which
// needs at least one mantissa digit; an exponent without digits is not part
// of the number.
func scanDecimal(s string, i int) (int, bool) { return scanNumber(s, i, isDigit, 'e') }

// scanHex is scanDecimal for the part after "0x": hex digits, an optional
// fraction and an optional binary exponent "p[+-]digits".
func scanHex(s string, i int) (int, bool) { return scanNumber(s, i, isHex, 'p') }

// scanNumber scans a mantissa of digits accepted by isMant with an optional
// fraction, then an optional exponent introduced by exp (either case) whose
// digits are always decimal, as strtod reads them.
func scanNumber(s string, i int, isMant func(byte) bool, exp byte) (int, bool) {
	mant := 0
	for i < len(s) && isMant(s[i]) {
		i++
		mant++
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && isMant(s[i]) {
			i++
			mant++
		}
	}
	if mant == 0 {
		return 0, false
	}
	if i < len(s) && s[i]|0x20 == exp {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			i = j
		}
	}
	return i, true
}
