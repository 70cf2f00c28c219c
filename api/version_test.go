package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestDecodeVersion(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Version
		err        error
	}{
		{"full", `{"version":"v1.2.3","commit":"0123abcd","modified":true,"api_level":2,"go_version":"go1.26.0"}`,
			Version{Version: "v1.2.3", Commit: "0123abcd", Modified: true, APILevel: 2, GoVersion: "go1.26.0"}, nil},
		{"devel, no commit", `{"version":"(devel)","api_level":2}`, Version{Version: "(devel)", APILevel: 2}, nil},
		{"a later mpsd's fields are ignored", `{"version":"v9","api_level":9,"features":["x"]}`, Version{Version: "v9", APILevel: 9}, nil},
		{"no version", `{"api_level":2}`, Version{}, ErrInvalid},
		{"no level", `{"version":"v1"}`, Version{}, ErrInvalid},
		{"level 0", `{"version":"v1","api_level":0}`, Version{}, ErrInvalid},
		{"level too high", `{"version":"v1","api_level":99999999}`, Version{}, ErrInvalid},
		{"space in version", `{"version":"v1 rc","api_level":2}`, Version{}, ErrInvalid},
		{"control character", `{"version":"v1\u001b[2J","api_level":2}`, Version{}, ErrInvalid},
		{"commit not hex", `{"version":"v1","commit":"unknown","api_level":2}`, Version{}, ErrInvalid},
		{"version too long", `{"version":"` + strings.Repeat("v", MaxVersionLen+1) + `","api_level":2}`, Version{}, ErrInvalid},
		{"null", `null`, Version{}, ErrInvalid},
		{"array", `[]`, Version{}, ErrInvalid},
		{"two objects", `{"version":"v1","api_level":2}{}`, Version{}, ErrInvalid},
		{"too large", `{"version":"v1","api_level":2,"x":"` + strings.Repeat("x", MaxVersionBytes) + `"}`, Version{}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeVersion(strings.NewReader(tc.body))
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) || got != tc.want {
				t.Errorf("DecodeVersion(%.60s) = %+v, %v; want %+v, %v", tc.body, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestParseAPILevel(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"", LevelBase, true}, // an mpsd from before the header
		{"1", 1, true},
		{"2", 2, true},
		{"17", 17, true},
		{"0", 0, false},
		{"-1", 0, false},
		{"+2", 0, false},
		{"02", 0, false},
		{"2.0", 0, false},
		{" 2", 0, false},
		{"99999999", 0, false},
		{"two", 0, false},
	} {
		got, err := ParseAPILevel(tc.in)
		if got != tc.want || (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("ParseAPILevel(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestAPILevel: the level this package serves is its newest, so an mpsd
// built with it serves every client built with it.
func TestAPILevel(t *testing.T) {
	if APILevel < LevelOperatorView || LevelOperatorView <= LevelBase {
		t.Errorf("APILevel %d, LevelOperatorView %d, LevelBase %d: levels must rise and APILevel be the newest", APILevel, LevelOperatorView, LevelBase)
	}
}

// FuzzDecodeVersion: no panic; every accepted version is valid, survives
// a write and a read back unchanged, and its version is safe as a header
// value; every refusal wraps ErrInvalid or ErrTooLarge.
func FuzzDecodeVersion(f *testing.F) {
	for _, seed := range []string{
		`{"version":"v1.2.3","commit":"0123abcd","modified":true,"api_level":2,"go_version":"go1.26.0"}`,
		`{"version":"(devel)","api_level":1}`,
		`{"version":"v9","api_level":9,"features":["x"]}`,
		`{"version":"","api_level":2}`,
		`{"version":"v1","api_level":1e3}`,
		`{"version":"v1","api_level":2}{}`,
		`{"version":"\u00e9","api_level":2}`,
		`null`, `[]`, `"x"`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		v, err := DecodeVersion(bytes.NewReader(body))
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if err := v.Validate(); err != nil {
			t.Fatalf("accepted an invalid version %+v: %v", v, err)
		}
		if strings.ContainsAny(v.Version, " \r\n\t") || v.APILevel < LevelBase {
			t.Fatalf("accepted %+v", v)
		}
		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeVersion(bytes.NewReader(enc))
		if err != nil || back != v {
			t.Fatalf("round trip of %s: %+v, %v", enc, back, err)
		}
	})
}

// FuzzParseAPILevel: no panic; an accepted level is a level and reads
// back from its decimal form; a refusal wraps ErrInvalid.
func FuzzParseAPILevel(f *testing.F) {
	for _, seed := range []string{"", "1", "2", "0", "-1", "+2", "02", "99999999", "1e3", "\x00"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, h string) {
		n, err := ParseAPILevel(h)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if n < LevelBase || n > maxAPILevel {
			t.Fatalf("ParseAPILevel(%q) = %d", h, n)
		}
		if h != "" && strconv.Itoa(n) != h {
			t.Fatalf("ParseAPILevel(%q) = %d, not its decimal form", h, n)
		}
	})
}
