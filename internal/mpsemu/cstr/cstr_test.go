package cstr

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The expectations below were read off NVIDIA's nvidia-cuda-mps-control
// (535/550/555), which applies these conversions to command arguments.

func TestScanInt(t *testing.T) {
	tests := []struct {
		name, in string
		want     int32
		rest     string
		ok       bool
	}{
		{"plain", "1234", 1234, "", true},
		{"trailing junk", "12abc", 12, "abc", true},
		{"negative", "-5", -5, "", true},
		{"plus", "+7", 7, "", true},
		{"leading space and tab", " \t42 x", 42, " x", true},
		{"hex is decimal zero", "0x10", 0, "x10", true},
		{"wraps to 32 bits", "99999999999", 1215752191, "", true},
		{"saturates then truncates", "99999999999999999999", -1, "", true},
		{"letters", "abc", 0, "abc", false},
		{"empty", "", 0, "", false},
		{"sign only", "-", 0, "-", false},
		{"int64 min", "-9223372036854775808", 0, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, rest, ok := ScanInt(tt.in)
			if got != tt.want || rest != tt.rest || ok != tt.ok {
				t.Errorf("ScanInt(%q) = %d, %q, %v; want %d, %q, %v", tt.in, got, rest, ok, tt.want, tt.rest, tt.ok)
			}
		})
	}
}

func TestScanUint(t *testing.T) {
	tests := []struct {
		name, in string
		want     uint32
		ok       bool
	}{
		{"plain", "5", 5, true},
		{"negative wraps", "-5", 4294967291, true},
		{"truncated", "99999999999", 1215752191, true},
		{"none", "x", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, _, ok := ScanUint(tt.in); got != tt.want || ok != tt.ok {
				t.Errorf("ScanUint(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestScanToken(t *testing.T) {
	tests := []struct{ name, in, tok, rest string }{
		{"first word", "get_server_list extra", "get_server_list", " extra"},
		{"leading spaces", "   foo", "foo", ""},
		{"carriage return ends it", "get_server_list\r", "get_server_list", "\r"},
		{"tab separated", "a\tb", "a", "\tb"},
		{"blank", "   ", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, rest, _ := ScanToken(tt.in)
			if tok != tt.tok || rest != tt.rest {
				t.Errorf("ScanToken(%q) = %q, %q; want %q, %q", tt.in, tok, rest, tt.tok, tt.rest)
			}
		})
	}
}

func TestStrtod(t *testing.T) {
	tests := []struct {
		name, in string
		want     float64
		n        int
	}{
		{"integer", "25", 25, 2},
		{"fraction", "33.333", 33.333, 6},
		{"trailing junk", "12abc", 12, 2},
		{"exponent", "1e1", 10, 3},
		{"exponent without digits", "1e", 1, 1},
		{"exponent sign without digits", "1e+", 1, 1},
		{"leading dot", ".5", 0.5, 2},
		{"trailing dot", "5.", 5, 2},
		{"hex", "0x10", 16, 4},
		{"hex float", "0x1p3", 8, 5},
		{"bare 0x is zero", "0x", 0, 1},
		{"leading space", " 50", 50, 3},
		{"inf", "inf", math.Inf(1), 3},
		{"infinity", "infinity", math.Inf(1), 8},
		{"negative zero", "-0", 0, 2},
		{"tiny", "1e-300", 1e-300, 6},
		{"huge is inf", "1e400", math.Inf(1), 5},
		{"letters", "abc", 0, 0},
		{"empty", "", 0, 0},
		{"dot only", ".", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n := Strtod(tt.in)
			if got != tt.want || n != tt.n {
				t.Errorf("Strtod(%q) = %v, %d; want %v, %d", tt.in, got, n, tt.want, tt.n)
			}
		})
	}
	if v, n := Strtod("nan(123)x"); !math.IsNaN(v) || n != 8 {
		t.Errorf("Strtod(nan(123)x) = %v, %d; want NaN, 8", v, n)
	}
}

func TestPinnedLimit(t *testing.T) {
	tests := []struct {
		name, in string
		bytes    uint64
		shown    string
	}{
		{"gibibytes", "2G", 2 << 30, "2G"},
		{"lower-case g", "2g", 2 << 30, "2G"},
		{"GB suffix", "2GB", 2 << 30, "2G"},
		{"mebibytes", "512M", 512 << 20, "512M"},
		{"T is MiB", "3T", 3 << 20, "3M"},
		{"K is MiB", "5K", 5 << 20, "5M"},
		{"no suffix is MiB", "1023", 1023 << 20, "1023M"},
		{"1024 MiB shows as 1G", "1024", 1 << 30, "1G"},
		{"floored to GiB", "1536M", 1536 << 20, "1G"},
		{"fraction stops the number", "1.5G", 1 << 20, "1M"},
		{"decimal, not octal", "010", 10 << 20, "10M"},
		{"hex is zero", "0x10", 0, ""},
		{"plus sign", "+7G", 7 << 30, "7G"},
		{"negative wraps", "-5G", 1<<64 - 5<<30, "17179869179G"},
		{"saturates", "99999999999999999999999G", math.MaxUint64 &^ (1<<30 - 1), "17179869183G"},
		{"wraps to zero", "17179869184G", 0, ""},
		{"letters are zero", "abc", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParsePinnedLimit(tt.in)
			if got != tt.bytes {
				t.Fatalf("ParsePinnedLimit(%q) = %d; want %d", tt.in, got, tt.bytes)
			}
			if got != 0 {
				if s := FormatPinnedLimit(got); s != tt.shown {
					t.Errorf("FormatPinnedLimit(%d) = %q; want %q", got, s, tt.shown)
				}
			}
		})
	}
}

func TestFormatPercent(t *testing.T) {
	// glibc's %.1f of the same doubles.
	tests := []struct {
		in   float64
		want string
	}{
		{25, "25.0"}, {33.333, "33.3"}, {0.25, "0.2"}, {0.35, "0.3"}, {0.05, "0.1"},
		{12.25, "12.2"}, {99.95, "100.0"}, {33.35, "33.4"}, {0.01, "0.0"},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatFloat(tt.in, 'g', -1, 64), func(t *testing.T) {
			if got := FormatPercent(tt.in); got != tt.want {
				t.Errorf("FormatPercent(%v) = %q; want %q", tt.in, got, tt.want)
			}
		})
	}
}

// FuzzStrtod checks Strtod against strconv on the prefix it claims: the
// prefix must be a number, and no longer prefix may be one.
func FuzzStrtod(f *testing.F) {
	for _, s := range []string{"25", "12abc", "1e", "0x1p3", "0x", " -7.5e-3z", "inf", "nan(x)", ".", "1e400", "+.5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, n := Strtod(s)
		if n < 0 || n > len(s) {
			t.Fatalf("Strtod(%q) consumed %d of %d bytes", s, n, len(s))
		}
		if n == 0 {
			if v != 0 {
				t.Fatalf("Strtod(%q) = %v with nothing consumed", s, v)
			}
			return
		}
		lit := strings.TrimLeft(s[:n], " \t\n\v\f\r")
		low := strings.ToLower(strings.TrimLeft(lit, "+-"))
		if strings.HasPrefix(low, "nan") {
			if !math.IsNaN(v) {
				t.Fatalf("Strtod(%q) = %v, want NaN", s, v)
			}
			return
		}
		if strings.HasPrefix(low, "0x") && !strings.ContainsAny(low, "p") && len(low) > 2 {
			lit += "p0"
		}
		want, err := strconv.ParseFloat(lit, 64)
		if err != nil && !strings.Contains(err.Error(), "range") {
			if low != "0x" && !strings.HasPrefix(low, "0x") {
				t.Fatalf("Strtod(%q) consumed %q, which strconv rejects: %v", s, lit, err)
			}
			return
		}
		if v != want && !(math.IsInf(v, 0) && math.IsInf(want, 0)) {
			t.Fatalf("Strtod(%q) = %v; strconv says %v for %q", s, v, want, lit)
		}
	})
}

// FuzzScanInt checks the sscanf("%d") emulation against an independent
// reading with strconv and 32-bit truncation.
func FuzzScanInt(f *testing.F) {
	for _, s := range []string{"1234", "12abc", "-5", "+7", "99999999999", "-99999999999999999999", "x", " 0x10", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, rest, ok := ScanInt(s)
		if !ok {
			if rest != s {
				t.Fatalf("ScanInt(%q) failed but consumed input", s)
			}
			return
		}
		lit := strings.TrimSuffix(s, rest)
		lit = strings.TrimLeft(lit, " \t\n\v\f\r")
		n, err := strconv.ParseInt(lit, 10, 64)
		if err != nil {
			if strings.HasPrefix(lit, "-") {
				n = math.MinInt64
			} else {
				n = math.MaxInt64
			}
		}
		if v != int32(n) {
			t.Fatalf("ScanInt(%q) = %d; want int32(%d) = %d", s, v, n, int32(n))
		}
	})
}

// FuzzParsePinnedLimit checks the loose size parser: it never fails, the
// unit is GiB exactly when a 'G' or 'g' follows the digits, and formatting
// round-trips for exact multiples.
func FuzzParsePinnedLimit(f *testing.F) {
	for _, s := range []string{"8G", "512M", "3T", "1.5G", "-5G", "99999999999999999999999G", "abc", "", "2gb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := ParsePinnedLimit(s)
		v, n := Strtoull(s)
		want := v << 20
		if n < len(s) && (s[n] == 'G' || s[n] == 'g') {
			want = v << 30
		}
		if got != want {
			t.Fatalf("ParsePinnedLimit(%q) = %d; want %d", s, got, want)
		}
		if got != 0 && got%GiB == 0 {
			if back := ParsePinnedLimit(FormatPinnedLimit(got)); back != got {
				t.Fatalf("%q: %d formats as %q which parses to %d", s, got, FormatPinnedLimit(got), back)
			}
		}
	})
}
