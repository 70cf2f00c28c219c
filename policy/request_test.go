package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/units"
)

func TestNewRequest(t *testing.T) {
	g := Group{Name: "inference", GPUsPerInstance: 2, SMPercent: 100, Memory: 40 * gib, MaxClients: 16,
		DefaultSM: 25, DefaultMem: 8 * gib, MaxSM: 50, MaxMem: 20 * gib, Priority: 7}
	for _, tc := range []struct {
		name string
		d    Demand
		want Request
		// errs are substrings the error must contain, in order.
		errs []string
	}{
		{"defaults", Demand{}, Request{Group: "inference", UID: 42, SM: 25, Mem: 8 * gib, GPUs: 2, Procs: 1, Priority: 7}, nil},
		{"explicit", Demand{SM: 50, Mem: 20 * gib, GPUs: 2}, Request{Group: "inference", UID: 42, SM: 50, Mem: 20 * gib, GPUs: 2, Procs: 1, Priority: 7}, nil},
		{"smallest", Demand{SM: 1, Mem: units.MiB}, Request{Group: "inference", UID: 42, SM: 1, Mem: units.MiB, GPUs: 2, Procs: 1, Priority: 7}, nil},
		{"mem rounded down to MiB", Demand{Mem: 3*units.MiB + 5}, Request{Group: "inference", UID: 42, SM: 25, Mem: 3 * units.MiB, GPUs: 2, Procs: 1, Priority: 7}, nil},
		{"procs share the sm", Demand{SM: 30, Procs: 4}, Request{Group: "inference", UID: 42, SM: 30, Mem: 8 * gib, GPUs: 2, Procs: 4, Priority: 7}, nil},
		{"one percent each", Demand{SM: 8, Procs: 8}, Request{Group: "inference", UID: 42, SM: 8, Mem: 8 * gib, GPUs: 2, Procs: 8, Priority: 7}, nil},
		{"procs over sm", Demand{SM: 8, Procs: 9}, Request{}, []string{"procs 9 is more than sm 8: each process would get sm/procs, under 1% of the SMs (at most 8 processes for sm 8)"}},
		{"procs over the default sm", Demand{Procs: 26}, Request{}, []string{"procs 26 is more than sm 25"}},
		{"procs over max_clients", Demand{SM: 50, Procs: 17}, Request{}, []string{`procs 17 is more than group "inference" serves per instance (max_clients 16)`}},
		{"procs over MPS's clients", Demand{SM: 50, Procs: 49}, Request{}, []string{"procs 49: want 1 to 48 processes (MPS serves at most 48 clients per GPU)"}},
		{"procs negative", Demand{Procs: -1}, Request{}, []string{"procs -1: want 1 to 48"}},
		{"sm over 100", Demand{SM: 120}, Request{}, []string{"sm 120 is not a percentage from 1 to 100"}},
		{"sm negative", Demand{SM: -1}, Request{}, []string{"sm -1 is not a percentage"}},
		{"sm over max_sm", Demand{SM: 51}, Request{}, []string{`sm 51 is more than group "inference" allows one client (max_sm 50)`}},
		{"mem over max_mem", Demand{Mem: 20*gib + 1}, Request{}, []string{`mem 20G is more than group "inference" allows one client (max_mem 20G)`}},
		{"mem negative", Demand{Mem: -5}, Request{}, []string{"mem -5 is negative"}},
		{"mem below 1M", Demand{Mem: 1000}, Request{}, []string{"mem 1000B is below 1M"}},
		{"gpus over the set", Demand{GPUs: 3}, Request{}, []string{"gpus 3: group inference's instances have 2 GPUs each; ask --gpus 2"}},
		{"gpus under the set", Demand{GPUs: 1}, Request{}, []string{"gpus 1: group inference's instances have 2 GPUs each; ask --gpus 2"}},
		{"gpus negative", Demand{GPUs: -1}, Request{}, []string{"gpus -1 is negative"}},
		{"every reason at once", Demand{SM: 101, Mem: 30 * gib, GPUs: 4}, Request{}, []string{"sm 101", "; mem 30G", "; gpus 4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := g.NewRequest(42, tc.d)
			if tc.errs == nil {
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("NewRequest(%+v) = %+v, %v; want %+v", tc.d, got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("NewRequest(%+v) error %v does not match ErrInvalidRequest", tc.d, err)
			}
			msg, at := err.Error(), 0
			for _, want := range tc.errs {
				i := strings.Index(msg[at:], want)
				if i < 0 {
					t.Fatalf("error %q lacks %q", msg, want)
				}
				at += i + len(want)
			}
		})
	}
}

func TestNewRequestGPUsOfOneGPUInstances(t *testing.T) {
	g := Group{Name: "a", GPUsPerInstance: 1, SMPercent: 100, Memory: gib, MaxClients: 48,
		DefaultSM: 25, DefaultMem: gib / 4, MaxSM: 100, MaxMem: gib}
	for _, tc := range []struct {
		name string
		gpus int
		want int
		err  string
	}{
		{"default", 0, 1, ""},
		{"the size", 1, 1, ""},
		{"more", 2, 0, "gpus 2: group a's instances have 1 GPU each; ask --gpus 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := g.NewRequest(42, Demand{GPUs: tc.gpus})
			if tc.err != "" {
				if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("NewRequest(gpus %d) error %v, want one with %q", tc.gpus, err, tc.err)
				}
				return
			}
			if err != nil || r.GPUs != tc.want {
				t.Fatalf("NewRequest(gpus %d) = gpus %d, %v; want %d", tc.gpus, r.GPUs, err, tc.want)
			}
		})
	}
}

func TestWithinAny(t *testing.T) {
	singles, pairs := [][]int{{0}, {1}}, [][]int{{0, 1}, {2, 3}}
	for _, tc := range []struct {
		name string
		only []int
		sets [][]int
		want bool
		text string
	}{
		{"any GPU", nil, singles, true, "GPU 0, GPU 1"},
		{"one of the group's", []int{1}, singles, true, "GPU 0, GPU 1"},
		{"some outside the group", []int{1, 5}, singles, true, "GPU 0, GPU 1"},
		{"outside the group", []int{3}, singles, false, "GPU 0, GPU 1"},
		{"a whole pair", []int{2, 3}, pairs, true, "GPUs 0,1; GPUs 2,3"},
		{"half of each pair", []int{1, 2}, pairs, false, "GPUs 0,1; GPUs 2,3"},
		{"no instances", []int{0}, nil, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Request{Only: tc.only}
			if got := r.WithinAny(tc.sets); got != tc.want {
				t.Errorf("WithinAny(%v) with only %v = %v, want %v", tc.sets, tc.only, got, tc.want)
			}
			if got := DescribeSets(tc.sets); got != tc.text {
				t.Errorf("DescribeSets(%v) = %q, want %q", tc.sets, got, tc.text)
			}
		})
	}
}
