package cgroup

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestValidName(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want bool
	}{
		{"simple", "inference", true},
		{"uuid", "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f", true},
		{"underscore", "a_b", true},
		{"max length", strings.Repeat("a", maxNameLen), true},
		{"empty", "", false},
		{"too long", strings.Repeat("a", maxNameLen+1), false},
		{"dot", ".", false},
		{"dotdot", "..", false},
		{"hidden", ".x", false},
		{"slash", "a/b", false},
		{"control file", "cgroup.procs", false},
		{"leading dash", "-x", false},
		{"space", "a b", false},
		{"nul", "a\x00", false},
		{"unicode", "é", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := validName(c.in); got != c.want {
				t.Fatalf("validName(%q) = %v, want %v", c.in, got, c.want)
			}
		})
	}
}

func FuzzValidName(f *testing.F) {
	for _, s := range []string{"inference", "..", "a/b", "cgroup.procs", "", "-x", "a_b-c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !validName(s) {
			return
		}
		if filepath.Base(s) != s || filepath.Clean(s) != s || strings.ContainsAny(s, "/.\x00") || len(s) > maxNameLen {
			t.Fatalf("validName accepted unsafe %q", s)
		}
	})
}

func TestValidParent(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{"mpsd", true},
		{"system.slice/mpsd.service/leases", true},
		{"", false},
		{"/mpsd", false},
		{"mpsd/", false},
		{"a//b", false},
		{"a/../b", false},
		{"..", false},
		{".hidden", false},
	} {
		t.Run(c.in, func(t *testing.T) {
			err := validParent(c.in)
			if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidName)) {
				t.Fatalf("validParent(%q) = %v, want ok=%v", c.in, err, c.ok)
			}
		})
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		lim  Limits
		ok   bool
	}{
		{"zero", Limits{}, true},
		{"all", Limits{CPUWeight: 100, CPUQuota: time.Second, CPUPeriod: time.Second, MemoryBytes: 1, Pids: 1}, true},
		{"weight too big", Limits{CPUWeight: 10001}, false},
		{"quota below 1ms", Limits{CPUQuota: 999 * time.Microsecond}, false},
		{"negative quota", Limits{CPUQuota: -1}, false},
		{"period without quota", Limits{CPUPeriod: time.Second}, false},
		{"period too long", Limits{CPUQuota: time.Second, CPUPeriod: 2 * time.Second}, false},
		{"negative memory", Limits{MemoryBytes: -1}, false},
		{"negative pids", Limits{Pids: -1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.lim.Validate()
			if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidLimits)) {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", c.lim, err, c.ok)
			}
		})
	}
}

func TestWeightSharesRoundTrip(t *testing.T) {
	for w := uint64(minWeight); w <= maxWeight; w++ {
		s := weightToShares(w)
		if s < minShares || s > maxShares {
			t.Fatalf("weightToShares(%d) = %d out of range", w, s)
		}
		if got := sharesToWeight(s); got != w {
			t.Fatalf("sharesToWeight(weightToShares(%d) = %d) = %d", w, s, got)
		}
	}
	for _, c := range []struct{ shares, weight uint64 }{{0, 1}, {2, 1}, {1024, 40}, {262144, 10000}, {1 << 40, 10000}} {
		if got := sharesToWeight(c.shares); got != c.weight {
			t.Errorf("sharesToWeight(%d) = %d, want %d", c.shares, got, c.weight)
		}
	}
}

func TestParseCPUMax(t *testing.T) {
	for _, c := range []struct {
		name          string
		in            string
		quota, period time.Duration
		ok            bool
	}{
		{"no quota", "max 100000\n", 0, 100 * time.Millisecond, true},
		{"quota", "50000 100000\n", 50 * time.Millisecond, 100 * time.Millisecond, true},
		{"one field", "max", 0, 0, false},
		{"three fields", "1 2 3", 0, 0, false},
		{"zero period", "max 0", 0, 0, false},
		{"zero quota", "0 100000", 0, 0, false},
		{"negative", "-1 100000", 0, 0, false},
		{"overflow", "99999999999999999999 100000", 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			q, p, err := parseCPUMax([]byte(c.in))
			if (err == nil) != c.ok || q != c.quota || p != c.period {
				t.Fatalf("parseCPUMax(%q) = %s, %s, %v; want %s, %s, ok=%v", c.in, q, p, err, c.quota, c.period, c.ok)
			}
		})
	}
}

func FuzzParseCPUMax(f *testing.F) {
	for _, s := range []string{"max 100000\n", "50000 100000", "1 1", "max", "0 0", " 5 6 "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		q, p, err := parseCPUMax(b)
		if err != nil {
			return
		}
		if p <= 0 || q < 0 {
			t.Fatalf("parseCPUMax(%q) = %s, %s: want positive period, non-negative quota", b, q, p)
		}
	})
}

func TestParseUintOrMax(t *testing.T) {
	for _, c := range []struct {
		in        string
		v         uint64
		unlimited bool
		ok        bool
	}{
		{"max\n", 0, true, true},
		{"4096\n", 4096, false, true},
		{"0", 0, false, true},
		{"", 0, false, false},
		{"-1", 0, false, false},
		{"1 2", 0, false, false},
		{"MAX", 0, false, false},
	} {
		t.Run(c.in, func(t *testing.T) {
			v, unlimited, err := parseUintOrMax([]byte(c.in))
			if (err == nil) != c.ok || v != c.v || unlimited != c.unlimited {
				t.Fatalf("parseUintOrMax(%q) = %d, %v, %v", c.in, v, unlimited, err)
			}
		})
	}
}

func FuzzParseUintOrMax(f *testing.F) {
	for _, s := range []string{"max\n", "4096", "", "-1", "18446744073709551615"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, unlimited, err := parseUintOrMax(b)
		if err == nil && unlimited && v != 0 {
			t.Fatalf("parseUintOrMax(%q): unlimited with value %d", b, v)
		}
		if _, err := parseInt(b); err != nil && !errors.Is(err, errParse) {
			t.Fatalf("parseInt(%q) error %v does not wrap errParse", b, err)
		}
	})
}

func TestParsePopulated(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want bool
		ok   bool
	}{
		{"empty cgroup", "populated 0\nfrozen 0\n", false, true},
		{"populated", "populated 1\nfrozen 0\n", true, true},
		{"order", "frozen 1\npopulated 1\n", true, true},
		{"missing key", "frozen 0\n", false, false},
		{"bad value", "populated 2\n", false, false},
		{"empty", "", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parsePopulated([]byte(c.in))
			if (err == nil) != c.ok || got != c.want {
				t.Fatalf("parsePopulated(%q) = %v, %v", c.in, got, err)
			}
		})
	}
}

func FuzzParsePopulated(f *testing.F) {
	for _, s := range []string{"populated 0\nfrozen 0\n", "populated 1\n", "frozen 1", "populated x", "\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parsePopulated(b)
		if err == nil && got != strings.Contains(string(b), "populated 1") {
			t.Fatalf("parsePopulated(%q) = %v without a matching line", b, got)
		}
	})
}

func TestParsePids(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want []int
		ok   bool
	}{
		{"empty", "", nil, true},
		{"two", "12\n345\n", []int{12, 345}, true},
		{"no trailing newline", "7", []int{7}, true},
		{"zero", "0\n", nil, false},
		{"negative", "-3\n", nil, false},
		{"junk", "12\nabc\n", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parsePids([]byte(c.in))
			if (err == nil) != c.ok || !slices.Equal(got, c.want) {
				t.Fatalf("parsePids(%q) = %v, %v", c.in, got, err)
			}
		})
	}
}

func FuzzParsePids(f *testing.F) {
	for _, s := range []string{"", "1\n2\n", "0", "x", "12\n\n13"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		pids, err := parsePids(b)
		if err != nil {
			return
		}
		for _, p := range pids {
			if p <= 0 {
				t.Fatalf("parsePids(%q) returned pid %d", b, p)
			}
		}
	})
}

func TestModeString(t *testing.T) {
	for m, want := range map[Mode]string{ModeAuto: "auto", ModeV2: "v2", ModeHybrid: "hybrid", ModeV1: "v1", Mode(9): "Mode(9)"} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}

func TestParseKernelRelease(t *testing.T) {
	for _, c := range []struct {
		name         string
		in           string
		major, minor int
		ok           bool
	}{
		{"debian", "6.1.0-18-amd64", 6, 1, true},
		{"plain", "5.7.0", 5, 7, true},
		{"two fields", "5.10", 5, 10, true},
		{"suffix on minor", "4.19-rc1", 4, 19, true},
		{"this build", "6.18.44-fc-v669", 6, 18, true},
		{"empty", "", 0, 0, false},
		{"no dot", "6", 0, 0, false},
		{"no minor", "6.x", 0, 0, false},
		{"signed", "-5.7", 0, 0, false},
		{"words", "linux.kernel", 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			major, minor, ok := parseKernelRelease(c.in)
			if major != c.major || minor != c.minor || ok != c.ok {
				t.Fatalf("parseKernelRelease(%q) = %d, %d, %v, want %d, %d, %v", c.in, major, minor, ok, c.major, c.minor, c.ok)
			}
		})
	}
}

func FuzzParseKernelRelease(f *testing.F) {
	for _, s := range []string{"6.1.0-18-amd64", "5.7", "", "5", "-1.2", "5.-7", "99999999999999999999.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		major, minor, ok := parseKernelRelease(s)
		if !ok && (major != 0 || minor != 0) {
			t.Fatalf("parseKernelRelease(%q) = %d, %d, false, want zeros", s, major, minor)
		}
		if ok && (major < 0 || minor < 0) {
			t.Fatalf("parseKernelRelease(%q) = %d, %d, negative", s, major, minor)
		}
	})
}
