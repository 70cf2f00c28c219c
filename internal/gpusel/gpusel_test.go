package gpusel

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// inventory lists its GPUs out of index order, so positions and indexes
// differ, and has UUIDs chosen so that "GPU-aaaa" is ambiguous while
// "GPU-aaaa1" and "bbbb" are not, and one UUID is all digits after "GPU-".
var inventory = []GPU{
	{Index: 2, UUID: "GPU-bbbb3333-0000-0000-0000-000000000000"},
	{Index: 0, UUID: "GPU-aaaa1111-0000-0000-0000-000000000000"},
	{Index: 3, UUID: "GPU-12345678-0000-0000-0000-000000000000"},
	{Index: 1, UUID: "GPU-aaaa2222-0000-0000-0000-000000000000"},
}

// indexesAt maps positions in inventory to GPU indexes.
func indexesAt(t *testing.T, inv []GPU, pos []int) []int {
	t.Helper()
	out := make([]int, len(pos))
	for i, p := range pos {
		if p < 0 || p >= len(inv) {
			t.Fatalf("position %d outside an inventory of %d", p, len(inv))
		}
		out[i] = inv[p].Index
	}
	return out
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		entry string
		kind  Kind
		index int
	}{
		{"all", "all", All, -1},
		{"ALL upper case", "ALL", All, -1},
		{"all mixed case", "aLl", All, -1},
		{"index", "3", ByIndex, 3},
		{"index zero", "0", ByIndex, 0},
		{"leading zero index", "01", ByIndex, 1},
		{"largest index", "2147483647", ByIndex, 2147483647},
		{"full UUID", "GPU-bbbb3333-0000-0000-0000-000000000000", ByUUID, -1},
		{"full UUID upper case", "GPU-BBBB3333-0000-0000-0000-000000000000", ByUUID, -1},
		{"full UUID lower-case gpu-", "gpu-bbbb3333-0000-0000-0000-000000000000", ByUUID, -1},
		{"full UUID without GPU-", "bbbb3333-0000-0000-0000-000000000000", ByUUID, -1},
		{"prefix with GPU-", "GPU-aaaa1", ByPrefix, -1},
		{"prefix without GPU-", "bbbb", ByPrefix, -1},
		{"numeric prefix with GPU-", "GPU-1234", ByPrefix, -1},
		{"prefix ending in a dash", "GPU-aaaa1111-", ByPrefix, -1},
		{"UUID-long with a dash misplaced", "GPU-aaaa111-10000-0000-0000-000000000000", ByPrefix, -1},
		{"UUID-long with a dash missing", "GPU-aaaa11110-000-0000-0000-000000000000", ByPrefix, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.entry)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.entry, err)
			}
			if s.Kind() != tc.kind || s.Index() != tc.index || s.String() != tc.entry {
				t.Errorf("Parse(%q) = kind %d, index %d, %q; want kind %d, index %d, %q",
					tc.entry, s.Kind(), s.Index(), s.String(), tc.kind, tc.index, tc.entry)
			}
		})
	}
}

func TestParseBad(t *testing.T) {
	const notSelector = `want "all", an index, a GPU UUID or a UUID prefix`
	for _, tc := range []struct {
		name   string
		entry  string
		reason string
	}{
		{"empty", "", "empty"},
		{"padded: callers trim", " 1 ", notSelector},
		{"index past int32", "2147483648", "GPU index out of range"},
		{"huge index", "99999999999999999999", "GPU index out of range"},
		{"negative index", "-1", notSelector},
		{"lone dash", "-", notSelector},
		{"dash after GPU-", "GPU--aaaa", notSelector},
		{"not hex", "gpu0", notSelector},
		{"a name", "nvidia", notSelector},
		{"two entries in one", "all,0", notSelector},
		{"space inside", "GPU-aaaa 1111", notSelector},
		{"non-ASCII", "ÿ", notSelector},
		{"invalid UTF-8", "aa\xff", notSelector},
		{"bare GPU-", "GPU-", "UUID prefix is empty"},
		{"bare gpu-", "gpu-", "UUID prefix is empty"},
		{"MIG UUID", "MIG-aaaa1111", "MIG devices cannot be selected; select the whole GPU"},
		{"MIG lower case", "mig-GPU-aaaa1111-0000-0000-0000-000000000000/1/0", "MIG devices"},
		{"longer than a UUID", "GPU-aaaa1111-0000-0000-0000-0000000000000", "longer than a GPU UUID"},
		{"longer than a UUID without GPU-", "aaaa1111-0000-0000-0000-0000000000000", "longer than a GPU UUID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.entry)
			if err == nil {
				t.Fatalf("Parse(%q) = kind %d; want an error", tc.entry, s.Kind())
			}
			var e *Error
			if !errors.Is(err, ErrSyntax) || !errors.As(err, &e) {
				t.Fatalf("Parse(%q) error %v is not an *Error wrapping ErrSyntax", tc.entry, err)
			}
			if e.Entry != tc.entry || !strings.Contains(e.Reason, tc.reason) || e.Pos != 0 || e.Matches != nil {
				t.Errorf("Parse(%q) error = %+v; want entry %q, reason containing %q", tc.entry, *e, tc.entry, tc.reason)
			}
			if s != (Selector{}) {
				t.Errorf("Parse(%q) returned %+v with its error; want the zero Selector", tc.entry, s)
			}
		})
	}
}

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []string
		wantErr error
		badPos  []int // positions of the entries reported
	}{
		{"good list", []string{"all", "0", "GPU-aaaa"}, nil, nil},
		{"nil list", nil, ErrEmptyList, nil},
		{"empty list", []string{}, ErrEmptyList, nil},
		{"one bad entry", []string{"0", "x!"}, ErrSyntax, []int{1}},
		{"every bad entry", []string{"x!", "0", "", "MIG-1", "GPU-aaaa"}, ErrSyntax, []int{0, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sels, err := ParseList(tc.entries)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("ParseList(%q): %v", tc.entries, err)
				}
				var got []string
				for _, s := range sels {
					got = append(got, s.String())
				}
				if !slices.Equal(got, tc.entries) {
					t.Errorf("ParseList(%q) = %q; want every entry in order", tc.entries, got)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || sels != nil {
				t.Fatalf("ParseList(%q) = %v, %v; want no selectors and %v", tc.entries, sels, err, tc.wantErr)
			}
			if tc.badPos == nil {
				return
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("ParseList(%q) error %T is not Errors", tc.entries, err)
			}
			var pos []int
			for _, e := range es {
				pos = append(pos, e.Pos)
				if e.Entry != tc.entries[e.Pos] {
					t.Errorf("error %v names %q; entry %d is %q", e, e.Entry, e.Pos, tc.entries[e.Pos])
				}
			}
			if !slices.Equal(pos, tc.badPos) {
				t.Errorf("ParseList(%q) reported entries %v; want %v", tc.entries, pos, tc.badPos)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []string
		want    []int // GPU indexes
	}{
		{"all in index order", []string{"all"}, []int{0, 1, 2, 3}},
		{"one index", []string{"2"}, []int{2}},
		{"indexes sorted and deduplicated", []string{"3", "0", "3"}, []int{0, 3}},
		{"full UUID", []string{"GPU-bbbb3333-0000-0000-0000-000000000000"}, []int{2}},
		{"full UUID any case", []string{"gPu-BBBB3333-0000-0000-0000-000000000000"}, []int{2}},
		{"full UUID without GPU-", []string{"aaaa2222-0000-0000-0000-000000000000"}, []int{1}},
		{"prefix with GPU-", []string{"GPU-aaaa1"}, []int{0}},
		{"prefix without GPU-", []string{"bbbb"}, []int{2}},
		{"numeric prefix with GPU-", []string{"GPU-1234"}, []int{3}},
		{"mixed forms overlapping", []string{"GPU-aaaa2", "1", "bbbb3333"}, []int{1, 2}},
		{"all plus index", []string{"all", "2"}, []int{0, 1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sels, err := ParseList(tc.entries)
			if err != nil {
				t.Fatalf("ParseList(%q): %v", tc.entries, err)
			}
			pos, err := Resolve(inventory, sels)
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.entries, err)
			}
			if got := indexesAt(t, inventory, pos); !slices.Equal(got, tc.want) {
				t.Errorf("Resolve(%q) selects GPUs %v; want %v", tc.entries, got, tc.want)
			}
		})
	}
}

func TestResolveBad(t *testing.T) {
	const ambiguous = "matches GPU 0 (GPU-aaaa1111-0000-0000-0000-000000000000), GPU 1 (GPU-aaaa2222-0000-0000-0000-000000000000)"
	type want struct {
		pos     int
		err     error
		reason  string
		matches []int // indexes of Error.Matches
	}
	for _, tc := range []struct {
		name    string
		inv     []GPU
		entries []string
		want    []want
	}{
		{"unknown index", inventory, []string{"4"}, []want{{0, ErrUnknownIndex, "no GPU with index 4 (this host has 4 GPUs)", nil}}},
		{"unknown index, one GPU", inventory[:1], []string{"4"}, []want{{0, ErrUnknownIndex, "no GPU with index 4 (this host has 1 GPU)", nil}}},
		{"unknown UUID", inventory, []string{"GPU-cccc3333-0000-0000-0000-000000000000"}, []want{{0, ErrNoMatch, "no GPU with this UUID", nil}}},
		{"unknown prefix", inventory, []string{"GPU-cc"}, []want{{0, ErrNoMatch, "no GPU UUID starts with it", nil}}},
		{"UUID-long prefix", inventory, []string{"GPU-aaaa111-10000-0000-0000-000000000000"}, []want{{0, ErrNoMatch, "no GPU UUID starts with it", nil}}},
		{"ambiguous prefix", inventory, []string{"GPU-aaaa"}, []want{{0, ErrAmbiguous, ambiguous, []int{0, 1}}}},
		{"ambiguous without GPU-", inventory, []string{"AAAA"}, []want{{0, ErrAmbiguous, ambiguous, []int{0, 1}}}},
		{"all without GPUs", nil, []string{"all"}, []want{{0, ErrNoMatch, "this host has no GPUs", nil}}},
		{"index without GPUs", []GPU{}, []string{"0"}, []want{{0, ErrUnknownIndex, "this host has no GPUs", nil}}},
		{"prefix without GPUs", nil, []string{"GPU-aa"}, []want{{0, ErrNoMatch, "this host has no GPUs", nil}}},
		{"every failure, by position", inventory, []string{"0", "9", "GPU-aaaa", "all", "GPU-ff"}, []want{
			{1, ErrUnknownIndex, "no GPU with index 9", nil},
			{2, ErrAmbiguous, ambiguous, []int{0, 1}},
			{4, ErrNoMatch, "no GPU UUID starts with it", nil},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sels, err := ParseList(tc.entries)
			if err != nil {
				t.Fatalf("ParseList(%q): %v", tc.entries, err)
			}
			pos, err := Resolve(tc.inv, sels)
			var es Errors
			if !errors.As(err, &es) || pos != nil {
				t.Fatalf("Resolve(%q) = %v, %v; want no positions and Errors", tc.entries, pos, err)
			}
			if len(es) != len(tc.want) {
				t.Fatalf("Resolve(%q) reported %d entries: %v; want %d", tc.entries, len(es), err, len(tc.want))
			}
			for i, w := range tc.want {
				e := es[i]
				if e.Pos != w.pos || e.Entry != tc.entries[w.pos] || !errors.Is(e, w.err) || !strings.Contains(e.Reason, w.reason) {
					t.Errorf("error %d = %+v; want entry %d (%q), %v, reason containing %q", i, *e, w.pos, tc.entries[w.pos], w.err, w.reason)
				}
				var got []int
				for _, g := range e.Matches {
					got = append(got, g.Index)
				}
				if !slices.Equal(got, w.matches) {
					t.Errorf("error %d names matches %v; want %v", i, got, w.matches)
				}
				if !errors.Is(err, w.err) {
					t.Errorf("errors.Is(%v, %v) is false through Errors", err, w.err)
				}
			}
		})
	}
}

func TestResolveEmptyList(t *testing.T) {
	for _, sels := range [][]Selector{nil, {}} {
		if pos, err := Resolve(inventory, sels); !errors.Is(err, ErrEmptyList) || pos != nil {
			t.Errorf("Resolve(%v) = %v, %v; want %v", sels, pos, err, ErrEmptyList)
		}
	}
}

func TestSelectorResolve(t *testing.T) {
	all, err := Parse("all")
	if err != nil {
		t.Fatal(err)
	}
	pos, err := all.Resolve(inventory)
	if err != nil {
		t.Fatal(err)
	}
	if got := indexesAt(t, inventory, pos); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("all selects GPUs %v; want 0, 1, 2, 3", got)
	}

	// The zero Selector is the empty entry, not a wildcard.
	pos, err = Selector{}.Resolve(inventory)
	if !errors.Is(err, ErrSyntax) || pos != nil {
		t.Errorf("zero Selector resolves to %v, %v; want %v", pos, err, ErrSyntax)
	}
}

// TestResolveEachGPU checks every way of writing one GPU against the
// inventory, so no form quietly selects a neighbour.
func TestResolveEachGPU(t *testing.T) {
	for _, g := range inventory {
		body := g.UUID[len("GPU-"):]
		for _, entry := range []string{
			g.UUID, strings.ToLower(g.UUID), strings.ToUpper(body), body,
			g.UUID[:len("GPU-")+8], "GPU-" + body[:8], string(rune('0' + g.Index)),
		} {
			s, err := Parse(entry)
			if err != nil {
				t.Errorf("Parse(%q): %v", entry, err)
				continue
			}
			pos, err := s.Resolve(inventory)
			if err != nil || len(pos) != 1 || inventory[pos[0]] != g {
				t.Errorf("%q selects positions %v, %v; want only GPU %d", entry, pos, err, g.Index)
			}
		}
	}
}

func TestErrorsText(t *testing.T) {
	_, err := ParseList([]string{"x!", "0", "GPU-"})
	want := `gpusel: "x!": want "all", an index, a GPU UUID or a UUID prefix` + "\n" + `gpusel: "GPU-": UUID prefix is empty`
	if err == nil || err.Error() != want {
		t.Errorf("ParseList error = %v; want\n%s", err, want)
	}
}

// FuzzResolve feeds arbitrary entries to the parser and resolver. They
// must never panic; each error must name the failing entry by position and
// wrap the sentinel for its stage; what resolves must be a sorted,
// duplicate-free, non-empty set of inventory positions; and for ASCII
// entries the case they are written in must not matter.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"all", "0", "3", "17", "GPU-aaaa", "GPU-aaaa1", "bbbb", "GPU-bbbb3333-0000-0000-0000-000000000000",
		"", " ", "-1", "MIG-x", "GPU-", "gpu-AAAA2", "99999999999999999999", "ÿ", "all,0", "GPU--1", "aaaa2222-0000-0000-0000-000000000000"} {
		f.Add(s, "1")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		entries := []string{a, b}
		pos, err := resolveList(t, entries)
		if isASCII(a) && isASCII(b) {
			upper, errUpper := resolveList(t, []string{strings.ToUpper(a), strings.ToUpper(b)})
			if (err == nil) != (errUpper == nil) || !slices.Equal(pos, upper) {
				t.Fatalf("%q selects %v, %v; upper case selects %v, %v", entries, pos, err, upper, errUpper)
			}
		}
		if err != nil {
			return
		}
		if len(pos) == 0 {
			t.Fatalf("%q selected nothing without an error", entries)
		}
		idx := indexesAt(t, inventory, pos)
		for i := 1; i < len(idx); i++ {
			if idx[i-1] >= idx[i] {
				t.Fatalf("%q selects GPUs %v: not sorted or duplicated", entries, idx)
			}
		}
	})
}

// resolveList parses and resolves entries against inventory, checking the
// shape of any error on the way.
func resolveList(t *testing.T, entries []string) ([]int, error) {
	t.Helper()
	sels, err := ParseList(entries)
	if err != nil {
		checkErrors(t, entries, err, ErrSyntax)
		return nil, err
	}
	for i, s := range sels {
		if s.String() != entries[i] {
			t.Fatalf("selector %d is %q; entry was %q", i, s, entries[i])
		}
	}
	pos, err := Resolve(inventory, sels)
	if err != nil {
		checkErrors(t, entries, err, ErrUnknownIndex, ErrNoMatch, ErrAmbiguous)
	}
	return pos, err
}

func checkErrors(t *testing.T, entries []string, err error, sentinels ...error) {
	t.Helper()
	var es Errors
	if !errors.As(err, &es) || len(es) == 0 {
		t.Fatalf("%q: error %v is not Errors", entries, err)
	}
	for _, e := range es {
		if e.Pos < 0 || e.Pos >= len(entries) || e.Entry != entries[e.Pos] || e.Reason == "" {
			t.Fatalf("%q: error %+v does not name its entry", entries, *e)
		}
		if !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(e, s) }) {
			t.Fatalf("%q: error %v wraps none of %v", entries, e, sentinels)
		}
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
