package deviceplugin

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

func TestParseUnit(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want Unit
		ok   bool
	}{
		{"inference-gpu0-sm0", Unit{"inference", 0, 0}, true},
		{"a-gpu7-sm99", Unit{"a", 7, 99}, true},
		{"x-gpu3-gpu12-sm5", Unit{"x-gpu3", 12, 5}, true},
		{"my_group-1-gpu1023-sm42", Unit{"my_group-1", 1023, 42}, true},
		{"a-gpu0-sm100", Unit{}, false},
		{"a-gpu1024-sm1", Unit{}, false},
		{"a-gpu01-sm1", Unit{}, false},
		{"a-gpu1-sm01", Unit{}, false},
		{"a-gpu-1-sm1", Unit{}, false},
		{"a-gpu1-sm+1", Unit{}, false},
		{"a-gpu1-sm", Unit{}, false},
		{"-gpu1-sm1", Unit{}, false},
		{"A-gpu1-sm1", Unit{}, false},
		{"_a-gpu1-sm1", Unit{}, false},
		{"a-gpu1", Unit{}, false},
		{"", Unit{}, false},
		{strings.Repeat("a", 33) + "-gpu0-sm0", Unit{}, false},
	} {
		t.Run(tc.id, func(t *testing.T) {
			got, err := ParseUnit(tc.id)
			if tc.ok != (err == nil) || got != tc.want {
				t.Fatalf("ParseUnit(%q) = %+v, %v; want %+v, ok %v", tc.id, got, err, tc.want, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrBadID) {
				t.Errorf("error %v does not wrap ErrBadID", err)
			}
			if err == nil && got.ID() != tc.id {
				t.Errorf("ID() = %q, want %q", got.ID(), tc.id)
			}
		})
	}
}

func TestParseUnits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ids   []string
		gpu   int
		units []int
		err   string
	}{
		{"sorted and deduplicated", []string{"a-gpu1-sm5", "a-gpu1-sm2", "a-gpu1-sm5"}, 1, []int{2, 5}, ""},
		{"two GPUs", []string{"a-gpu0-sm1", "a-gpu1-sm2"}, 0, nil, "must lie on one GPU"},
		{"another group", []string{"b-gpu0-sm1"}, 0, nil, "not a unit of group a"},
		{"none", nil, 0, nil, "no device IDs"},
		{"malformed", []string{"a-gpu0-sm1", "nvidia0"}, 0, nil, `"nvidia0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpu, units, err := parseUnits("a", tc.ids)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseUnits(%v) error %v, want one containing %q", tc.ids, err, tc.err)
				}
				return
			}
			if err != nil || gpu != tc.gpu || !slices.Equal(units, tc.units) {
				t.Fatalf("parseUnits(%v) = %d, %v, %v; want %d, %v", tc.ids, gpu, units, err, tc.gpu, tc.units)
			}
		})
	}
}

func seq(a, b int) []int {
	var s []int
	for n := a; n <= b; n++ {
		s = append(s, n)
	}
	return s
}

func TestJobID(t *testing.T) {
	evens := []int{}
	for n := 0; n < MaxUnits; n += 2 {
		evens = append(evens, n)
	}
	for _, tc := range []struct {
		name  string
		units []int
		want  string
	}{
		{"one", []int{7}, "k8s:sm=7"},
		{"a range", seq(0, 29), "k8s:sm=0-29"},
		{"ranges and singles", append(append(seq(0, 9), 20), seq(40, 42)...), "k8s:sm=0-9,20,40-42"},
		{"too fragmented for ranges", evens, "k8s:sm=x" + strings.Repeat("55", 12) + "05"},
		{"every unit", seq(0, 99), "k8s:sm=0-99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := jobID(tc.units)
			if got != tc.want {
				t.Fatalf("jobID = %q, want %q", got, tc.want)
			}
			if len(got) > api.MaxJobIDLen {
				t.Errorf("jobID is %d bytes, more than api.MaxJobIDLen", len(got))
			}
			back, ok := parseJobID(got)
			if !ok || !slices.Equal(back, tc.units) {
				t.Errorf("parseJobID(%q) = %v, %v; want %v", got, back, ok, tc.units)
			}
		})
	}
	for _, bad := range []string{"", "k8s:sm=", "slurm-1234", "k8s:sm=5-3", "k8s:sm=3,3", "k8s:sm=4,2", "k8s:sm=0-100",
		"k8s:sm=x", "k8s:sm=xzz", "k8s:sm=x00", "k8s:sm=x" + strings.Repeat("ff", 14), "k8s:sm=1,", "k8s:sm=01", "k8s:sm=-1"} {
		if units, ok := parseJobID(bad); ok {
			t.Errorf("parseJobID(%q) = %v, want not ours", bad, units)
		}
	}
}

// Every device ID the plugin accepts is one it would make itself.
func FuzzParseUnit(f *testing.F) {
	for _, s := range []string{"inference-gpu0-sm0", "a-gpu7-sm99", "x-gpu3-gpu12-sm5", "a-gpu01-sm1", "-gpu1-sm1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		u, err := ParseUnit(id)
		if err != nil {
			return
		}
		if u.ID() != id {
			t.Fatalf("ParseUnit(%q).ID() = %q", id, u.ID())
		}
		if u.N < 0 || u.N >= MaxUnits || u.GPU < 0 || u.GPU > maxGPUIndex || !validGroup(u.Group) {
			t.Fatalf("ParseUnit(%q) = %+v out of range", id, u)
		}
		if got := ResourceName(u.Group); len(got) > len(ResourceDomain)+1+63 {
			t.Fatalf("resource name %q too long for Kubernetes", got)
		}
	})
}

// A job id mpsd's status shows is outside input: parsing never yields
// units out of range or unsorted, and what it yields encodes back to the
// same units.
func FuzzParseJobID(f *testing.F) {
	for _, s := range []string{"k8s:sm=0-29", "k8s:sm=0-9,20,40-42", "k8s:sm=x5505", "k8s:sm=3,3", "slurm-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		units, ok := parseJobID(s)
		if !ok {
			return
		}
		if len(units) == 0 || !slices.IsSorted(units) ||
			units[0] < 0 || units[len(units)-1] >= MaxUnits {
			t.Fatalf("parseJobID(%q) = %v", s, units)
		}
		for i := 1; i < len(units); i++ {
			if units[i] == units[i-1] {
				t.Fatalf("parseJobID(%q) = %v repeats a unit", s, units)
			}
		}
		again, ok := parseJobID(jobID(units))
		if !ok || !slices.Equal(again, units) {
			t.Fatalf("jobID(%v) = %q parses to %v, %v", units, jobID(units), again, ok)
		}
	})
}

func ExampleUnit_ID() {
	u := Unit{Group: "inference", GPU: 1, N: 29}
	fmt.Println(ResourceName(u.Group), u.ID())
	// Output: mpsd.io/inference-sm inference-gpu1-sm29
}

func TestParseGroups(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  bool
	}{
		{"", nil, false},
		{"a", []string{"a"}, false},
		{" inference , batch_2,", []string{"inference", "batch_2"}, false},
		{"a,Bad", nil, true},
		{"a b", nil, true},
	} {
		got, err := ParseGroups(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("ParseGroups(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
