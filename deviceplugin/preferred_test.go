package deviceplugin

import (
	"slices"
	"testing"
)

func ids(group string, gpu int, units ...int) []string {
	out := make([]string, len(units))
	for i, n := range units {
		out[i] = Unit{Group: group, GPU: gpu, N: n}.ID()
	}
	return out
}

func TestPreferred(t *testing.T) {
	cat := func(parts ...[]string) []string { return slices.Concat(parts...) }
	for _, tc := range []struct {
		name      string
		available []string
		must      []string
		size      int
		want      []string
	}{
		{"tightest GPU that fits", cat(ids("a", 0, seq(0, 99)...), ids("a", 1, seq(60, 99)...)), nil, 30,
			ids("a", 1, seq(60, 89)...)},
		{"exact fit wins", cat(ids("a", 0, seq(0, 29)...), ids("a", 1, seq(0, 59)...)), nil, 30,
			ids("a", 0, seq(0, 29)...)},
		{"too small GPU skipped", cat(ids("a", 0, seq(0, 9)...), ids("a", 2, seq(0, 49)...)), nil, 20,
			ids("a", 2, seq(0, 19)...)},
		{"tie goes to the lower index", cat(ids("a", 3, seq(0, 49)...), ids("a", 1, seq(50, 99)...)), nil, 10,
			ids("a", 1, seq(50, 59)...)},
		{"lowest units first, in any order given", ids("a", 0, 9, 3, 7, 1), nil, 2, ids("a", 0, 1, 3)},
		{"must-include first, same GPU", cat(ids("a", 0, seq(0, 99)...), ids("a", 1, seq(0, 9)...)), ids("a", 1, 5), 3,
			ids("a", 1, 5, 0, 1)},
		{"none fits: the GPU with the most", cat(ids("a", 0, seq(0, 9)...), ids("a", 1, seq(0, 19)...)), nil, 30,
			ids("a", 1, seq(0, 19)...)},
		{"foreign and malformed IDs ignored", cat([]string{"b-gpu0-sm0", "junk"}, ids("a", 0, 4)), nil, 1, ids("a", 0, 4)},
		{"nothing available", nil, nil, 1, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := preferred("a", tc.available, tc.must, tc.size)
			if !slices.Equal(got, tc.want) {
				t.Errorf("preferred = %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		a, b []int
		want bool
	}{
		{[]int{1, 3, 5}, []int{2, 4, 6}, false},
		{[]int{1, 3, 5}, []int{5}, true},
		{nil, []int{1}, false},
		{seq(0, 29), seq(29, 40), true},
	} {
		if got := overlaps(tc.a, tc.b); got != tc.want {
			t.Errorf("overlaps(%v, %v) = %v", tc.a, tc.b, got)
		}
	}
}
