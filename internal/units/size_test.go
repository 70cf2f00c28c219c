package units

import (
	"errors"
	"math"
	"math/big"
	"regexp"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want int64
		err  error
	}{
		{"bare bytes", "1024", 1024, nil},
		{"zero", "0", 0, nil},
		{"bytes with B", "512B", 512, nil},
		{"K", "4K", 4 * KiB, nil},
		{"lower k", "4k", 4 * KiB, nil},
		{"M", "512M", 512 * MiB, nil},
		{"G", "8G", 8 * GiB, nil},
		{"GiB", "8GiB", 8 * GiB, nil},
		{"GB is binary", "8GB", 8 * GiB, nil},
		{"Gi", "8Gi", 8 * GiB, nil},
		{"lower gib", "8giB", 8 * GiB, nil},
		{"T", "2T", 2 * TiB, nil},
		{"TiB", "1TiB", TiB, nil},
		{"fraction", "1.5G", GiB + GiB/2, nil},
		{"fraction of M", "0.5M", MiB / 2, nil},
		{"sub-byte remainder dropped", "1.1G", 1181116006, nil},
		{"many decimals", "1.00000000000000000000000001K", KiB, nil},
		{"surrounding space", "  8G\n", 8 * GiB, nil},
		{"space before unit", "8 GiB", 8 * GiB, nil},
		{"leading zeros", "008G", 8 * GiB, nil},
		{"largest", "9223372036854775807", math.MaxInt64, nil},
		{"largest in T", "8388607T", 8388607 * TiB, nil},
		{"largest with fraction", "8388607.99999999999999999T", math.MaxInt64, nil},

		{"empty", "", 0, ErrSyntax},
		{"blank", "   ", 0, ErrSyntax},
		{"negative", "-1G", 0, ErrSyntax},
		{"plus", "+1G", 0, ErrSyntax},
		{"no digits", "G", 0, ErrSyntax},
		{"leading point", ".5G", 0, ErrSyntax},
		{"trailing point", "1.G", 0, ErrSyntax},
		{"two points", "1.2.3G", 0, ErrSyntax},
		{"fractional bytes", "1.5", 0, ErrSyntax},
		{"fractional B", "1.5B", 0, ErrSyntax},
		{"bits", "8Gb", 0, ErrSyntax},
		{"bits lower", "8gib", 0, ErrSyntax},
		{"bare bits", "8b", 0, ErrSyntax},
		{"unknown unit", "8X", 0, ErrSyntax},
		{"peta", "1P", 0, ErrSyntax},
		{"exponent", "1e9", 0, ErrSyntax},
		{"hex", "0x10", 0, ErrSyntax},
		{"underscore", "1_000", 0, ErrSyntax},
		{"trailing junk", "8GiBs", 0, ErrSyntax},
		{"space inside unit", "8 G B", 0, ErrSyntax},
		{"overflow bytes", "9223372036854775808", 0, ErrRange},
		{"overflow uint64", "99999999999999999999999", 0, ErrRange},
		{"overflow T", "8388608T", 0, ErrRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSize(tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("ParseSize(%q) = %d, %v; want error %v", tc.in, got, err, tc.err)
				}
				if !strings.Contains(err.Error(), "\""+tc.in+"\"") && tc.in != "" {
					t.Errorf("error %q does not quote the input", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseSizeBitsMessage(t *testing.T) {
	_, err := ParseSize("8Gb")
	if err == nil || !strings.Contains(err.Error(), "bits") {
		t.Fatalf("ParseSize(8Gb) error %v should explain that b means bits", err)
	}
}

func TestFormatSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   int64
		want string
	}{
		{"zero", 0, "0B"},
		{"bytes", 100, "100B"},
		{"just below K", 1023, "1023B"},
		{"K", KiB, "1K"},
		{"M", 512 * MiB, "512M"},
		{"G", 40 * GiB, "40G"},
		{"one and a half", GiB + GiB/2, "1.5G"},
		{"hundredths", GiB + GiB/4, "1.25G"},
		{"truncated not rounded", 2*GiB - 1, "1.99G"},
		{"H100 80GB", 81559 * MiB, "79.64G"},
		{"T", 3 * TiB, "3T"},
		{"largest", math.MaxInt64, "8388607.99T"},
		{"negative", -8 * GiB, "-8G"},
		{"most negative", math.MinInt64, "-8388608T"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FormatSize(tc.in); got != tc.want {
				t.Errorf("FormatSize(%d) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestMPSLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   int64
		want string
		err  error
	}{
		{"8 GiB", 8 * GiB, "8192M", nil},
		{"1 MiB", MiB, "1M", nil},
		{"rounded down", 3*MiB + MiB/2, "3M", nil},
		{"40 GiB", 40 * GiB, "40960M", nil},
		{"below 1 MiB", MiB - 1, "", ErrRange},
		{"zero", 0, "", ErrRange},
		{"negative", -MiB, "", ErrRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MPSLimit(tc.in)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Errorf("MPSLimit(%d) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

// sizeGrammar is an independent statement of what ParseSize accepts, used
// to check it in the fuzz test with exact rational arithmetic.
var sizeGrammar = regexp.MustCompile(`^([0-9]+)(\.[0-9]+)?[ \t]*(?:([kKmMgGtT])(?:i|I)?B?|B)?$`)

// referenceSize computes floor(number × unit) with math/big.
func referenceSize(s string) (*big.Int, bool) {
	m := sizeGrammar.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return nil, false
	}
	if m[2] != "" && m[3] == "" {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(m[1] + m[2])
	if !ok {
		return nil, false
	}
	mult := map[string]int64{"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}[strings.ToLower(m[3])]
	r.Mul(r, new(big.Rat).SetInt64(mult))
	return new(big.Int).Quo(r.Num(), r.Denom()), true
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"8G", "8GiB", "512M", "1.5G", "1024", "0", "4k", "2TiB", "1.1G", "8Gb", "-1", "1e9",
		"9223372036854775807", "8388607.99999T", " 8 G ", "0.0000001K", "1.", ".5", "G", "8GiBs", "99999999999999999999T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseSize(s)
		want, grammatical := referenceSize(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrRange) {
				t.Fatalf("ParseSize(%q): error %v wraps neither ErrSyntax nor ErrRange", s, err)
			}
			if errors.Is(err, ErrRange) && (!grammatical || want.IsInt64()) {
				t.Fatalf("ParseSize(%q): range error %v but reference value %v", s, err, want)
			}
			if errors.Is(err, ErrSyntax) && grammatical {
				t.Fatalf("ParseSize(%q): syntax error %v for a grammatical size", s, err)
			}
			return
		}
		if !grammatical {
			t.Fatalf("ParseSize(%q) = %d, but the input is not a size", s, got)
		}
		// Digits past the 19th decimal place are ignored, so allow the
		// floor to differ by one byte from the exact value.
		if d := new(big.Int).Sub(want, big.NewInt(got)); d.Sign() < 0 || d.Cmp(big.NewInt(1)) > 0 {
			t.Fatalf("ParseSize(%q) = %d, exact value %v", s, got, want)
		}
		// What FormatSize prints reads back as at most b and within
		// one hundredth of its unit.
		text := FormatSize(got)
		back, err := ParseSize(text)
		if err != nil {
			t.Fatalf("ParseSize(FormatSize(%d) = %q): %v", got, text, err)
		}
		unit := int64(1)
		for _, u := range []int64{TiB, GiB, MiB, KiB} {
			if got >= u {
				unit = u
				break
			}
		}
		if back > got || got-back > unit/100+1 {
			t.Fatalf("FormatSize(%d) = %q reads back as %d", got, text, back)
		}
	})
}
