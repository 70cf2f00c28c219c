package mpsd

import (
	"testing"
	"time"

	"github.com/mpsd/mpsd/policy"

	"github.com/mpsd/mpsd/internal/clock"
)

// An Xid confirms one fault record of an instance on its GPU, only while
// it is fresh, and never a second one: a tenant who writes more fault
// records after a real fault cannot have each of them taken for one.
func TestXidConfirmsOneRecord(t *testing.T) {
	t0 := time.Now()
	d := &Daemon{clock: clock.Real{}, xidAt: map[int]time.Time{0: t0}}
	on0 := &instance{p: policy.Instance{GPUs: []int{0}}}
	also0 := &instance{p: policy.Instance{GPUs: []int{1, 0}}}
	on1 := &instance{p: policy.Instance{GPUs: []int{1}}}
	for _, tc := range []struct {
		name string
		in   *instance
		now  time.Time
		want bool
	}{
		{"the Xid on its GPU", on0, t0.Add(time.Second), true},
		{"the same Xid again", on0, t0.Add(time.Second), false},
		{"another instance on that GPU", also0, t0.Add(time.Second), true},
		{"an instance on another GPU", on1, t0.Add(time.Second), false},
	} {
		if got := d.takeXidLocked(tc.in, tc.now); got != tc.want {
			t.Errorf("%s: confirmed %v, want %v", tc.name, got, tc.want)
		}
	}
	d.xidAt[1] = t0
	if d.takeXidLocked(on1, t0.Add(xidEvidenceWindow+time.Millisecond)) {
		t.Error("an Xid older than the window confirmed a record")
	}
	d.xidAt[0] = t0.Add(2 * time.Second)
	if !d.takeXidLocked(on0, t0.Add(3*time.Second)) {
		t.Error("a new Xid did not confirm the next record")
	}
}

// A log gate lets one line a second through, each standing for what was
// held back since the last.
func TestLogGate(t *testing.T) {
	var g logGate
	t0 := time.Now()
	for _, step := range []struct {
		at   time.Duration
		n    int
		want int
		pass bool
	}{
		{0, 1, 1, true},
		{100 * time.Millisecond, 3, 0, false},
		{999 * time.Millisecond, 2, 0, false},
		{time.Second, 1, 6, true},
		{3 * time.Second, 4, 4, true},
	} {
		if got, pass := g.pass(t0.Add(step.at), step.n); got != step.want || pass != step.pass {
			t.Errorf("at %s, %d more: (%d, %v), want (%d, %v)", step.at, step.n, got, pass, step.want, step.pass)
		}
	}
}
