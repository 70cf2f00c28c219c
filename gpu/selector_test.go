package gpu

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/gpusel"
)

// selectorInventory has UUIDs chosen so that "GPU-aaaa" is ambiguous while
// "GPU-aaaa1" and "bbbb" are not, and one UUID is all digits after "GPU-".
var selectorInventory = []Info{
	{Index: 0, UUID: "GPU-aaaa1111-0000-0000-0000-000000000000"},
	{Index: 1, UUID: "GPU-aaaa2222-0000-0000-0000-000000000000"},
	{Index: 2, UUID: "GPU-bbbb3333-0000-0000-0000-000000000000"},
	{Index: 3, UUID: "GPU-12345678-0000-0000-0000-000000000000"},
}

func TestSelectGood(t *testing.T) {
	tests := []struct {
		name string
		sels []string
		want []int
	}{
		{"all", []string{"all"}, []int{0, 1, 2, 3}},
		{"indexes sorted and deduplicated", []string{"3", "0", "3"}, []int{0, 3}},
		{"index with spaces", []string{" 1 "}, []int{1}},
		{"UUID with spaces", []string{"\tGPU-aaaa1 "}, []int{0}},
		{"full UUID", []string{"GPU-bbbb3333-0000-0000-0000-000000000000"}, []int{2}},
		{"full UUID upper case", []string{"GPU-BBBB3333-0000-0000-0000-000000000000"}, []int{2}},
		{"UUID prefix without GPU-", []string{"bbbb"}, []int{2}},
		{"mixed forms overlapping", []string{"GPU-aaaa2", "1", "bbbb3333"}, []int{1, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Select(selectorInventory, tc.sels)
			if err != nil {
				t.Fatalf("Select(%q): %v", tc.sels, err)
			}
			var idx []int
			for _, g := range got {
				idx = append(idx, g.Index)
			}
			if !slices.Equal(idx, tc.want) {
				t.Errorf("Select(%q) = %v; want %v", tc.sels, idx, tc.want)
			}
		})
	}
}

func TestSelectBad(t *testing.T) {
	tests := []struct {
		name    string
		inv     []Info
		sels    []string
		wantErr error
		says    []string
	}{
		{"empty list", selectorInventory, nil, ErrBadSelector, []string{"empty list", "[all]"}},
		{"empty entry", selectorInventory, []string{""}, ErrBadSelector, []string{`""`, "empty"}},
		{"blank entry", selectorInventory, []string{"  "}, ErrBadSelector, []string{`"  "`, "empty"}},
		{"index out of range", selectorInventory, []string{"4"}, ErrBadSelector, []string{`"4"`, "no GPU with index 4", "4 GPUs"}},
		{"huge index", selectorInventory, []string{"99999999999999999999"}, ErrBadSelector, []string{"index out of range"}},
		{"not hex", selectorInventory, []string{"gpu0"}, ErrBadSelector, []string{`"gpu0"`, `want "all", an index`}},
		{"bare GPU-", selectorInventory, []string{"GPU-"}, ErrBadSelector, []string{"UUID prefix is empty"}},
		{"MIG UUID", selectorInventory, []string{"MIG-aaaa1111"}, ErrBadSelector, []string{"MIG devices"}},
		{"too long", selectorInventory, []string{"GPU-aaaa1111-0000-0000-0000-0000000000000"}, ErrBadSelector, []string{"longer than a GPU UUID"}},
		{"unknown UUID", selectorInventory, []string{"GPU-cccc3333-0000-0000-0000-000000000000"}, ErrBadSelector, []string{"no GPU with this UUID"}},
		{"unknown prefix", selectorInventory, []string{"GPU-cc"}, ErrBadSelector, []string{`"GPU-cc"`, "no GPU UUID starts with it"}},
		{"ambiguous prefix", selectorInventory, []string{"GPU-aaaa"}, ErrAmbiguousSelector,
			[]string{`"GPU-aaaa"`, "GPU 0 (GPU-aaaa1111-0000-0000-0000-000000000000)", "GPU 1 (GPU-aaaa2222-0000-0000-0000-000000000000)"}},
		{"all on empty host", nil, []string{"all"}, ErrBadSelector, []string{"this host has no GPUs"}},
		{"every bad entry reported", selectorInventory, []string{"0", "x!", "7"}, ErrBadSelector, []string{`"x!"`}},
		{"every unresolved entry reported", selectorInventory, []string{"0", "9", "GPU-aaaa"}, ErrBadSelector,
			[]string{`"9"`, `"GPU-aaaa"`}},
		{"every unresolved entry keeps its sentinel", selectorInventory, []string{"0", "9", "GPU-aaaa"}, ErrAmbiguousSelector,
			[]string{`"GPU-aaaa": matches GPU 0`}},
		{"padded entry quoted as written", selectorInventory, []string{"0", " 9 "}, ErrBadSelector,
			[]string{`gpu: bad device selector " 9 ": no GPU with index 9`}},
		{"padded bad entry quoted as written", selectorInventory, []string{" MIG-1 "}, ErrBadSelector,
			[]string{`gpu: bad device selector " MIG-1 ": MIG devices`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Select(tc.inv, tc.sels)
			if err == nil {
				t.Fatalf("Select(%q) = %v; want an error", tc.sels, got)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("error %q does not wrap %v", err, tc.wantErr)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestParseSelectorsReportsAllBadEntries(t *testing.T) {
	_, err := ParseSelectors([]string{"x!", "0", "", "MIG-1"})
	for _, s := range []string{`"x!"`, `""`, `"MIG-1"`} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("error %v does not name %s", err, s)
		}
	}
	if strings.Contains(err.Error(), `"0"`) {
		t.Errorf("error %v names the good entry \"0\"", err)
	}
}

func TestSelectorString(t *testing.T) {
	for _, raw := range []string{"all", " 3", "GPU-aaaa", "bbbb"} {
		s, err := ParseSelector(raw)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", raw, err)
		}
		if s.String() != raw {
			t.Errorf("String() = %q; want %q", s.String(), raw)
		}
	}
}

func TestHostSelectOnSimulatedUUIDs(t *testing.T) {
	h, _ := newSimHost(t, SimSpec{GPUs: 8})
	for i := range 8 {
		uuid := SimUUID(i)
		for _, sel := range []string{uuid, uuid[:len("GPU-")+8], strings.ToUpper(uuid[len("GPU-"):])} {
			got, err := h.Select([]string{sel})
			if err != nil || len(got) != 1 || got[0].Index != i {
				t.Errorf("Select(%q) = %v, %v; want GPU %d", sel, got, err, i)
			}
		}
	}
}

// FuzzSelect holds the adapter to its contract whatever the entries (the
// grammar itself is fuzzed in internal/gpusel): no panic, every error wraps
// one of this package's selector sentinels, space around an entry changes
// nothing, and what is selected is a sorted, duplicate-free subset of the
// inventory.
func FuzzSelect(f *testing.F) {
	for _, s := range []string{"all", "0", "3", "17", "GPU-aaaa", "GPU-aaaa1", " bbbb", "GPU-bbbb3333-0000-0000-0000-000000000000",
		"", " ", "-1", "MIG-x", "GPU-", "gpu-AAAA2", "99999999999999999999", "ÿ", "all,0"} {
		f.Add(s, "1")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		got, err := Select(selectorInventory, []string{a, b})
		padded, errPadded := Select(selectorInventory, []string{" " + a + "\t", "\n" + b})
		if (err == nil) != (errPadded == nil) || !slices.Equal(got, padded) {
			t.Fatalf("Select(%q, %q) = %v, %v; padded, %v, %v", a, b, got, err, padded, errPadded)
		}
		if err != nil {
			if !errors.Is(err, ErrBadSelector) && !errors.Is(err, ErrAmbiguousSelector) {
				t.Fatalf("Select(%q, %q) error %v wraps no selector sentinel", a, b, err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatalf("Select(%q, %q) selected nothing without an error", a, b)
		}
		for i, g := range got {
			if i > 0 && got[i-1].Index >= g.Index {
				t.Fatalf("Select(%q, %q) = %v: not sorted or duplicated", a, b, got)
			}
			if selectorInventory[g.Index] != g {
				t.Fatalf("Select(%q, %q) returned %v, not from the inventory", a, b, g)
			}
		}
	})
}

// isFullUUID reports whether the selector grammar reads s as a whole GPU
// UUID rather than a prefix (TestSimUUID holds SimUUID to it).
func isFullUUID(s string) bool {
	sel, err := gpusel.Parse(s)
	return err == nil && sel.Kind() == gpusel.ByUUID
}
