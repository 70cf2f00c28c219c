package clock

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)

func fired(c <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-c:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimersFireInDeadlineOrder(t *testing.T) {
	f := NewFake(t0)
	late, early := f.NewTimer(3*time.Second), f.NewTimer(time.Second)
	if got := f.Pending(); got != 2 {
		t.Fatalf("pending %d, want 2", got)
	}
	if when, ok := f.NextDeadline(); !ok || !when.Equal(t0.Add(time.Second)) {
		t.Fatalf("next deadline %v %v, want %v", when, ok, t0.Add(time.Second))
	}
	f.Advance(999 * time.Millisecond)
	if _, ok := fired(early.C()); ok {
		t.Fatal("a 1s timer fired at 999ms")
	}
	f.Advance(5 * time.Second)
	if v, ok := fired(early.C()); !ok || !v.Equal(t0.Add(time.Second)) {
		t.Fatalf("1s timer: %v %v, want it fired at its deadline", v, ok)
	}
	if v, ok := fired(late.C()); !ok || !v.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("3s timer: %v %v, want it fired at its deadline", v, ok)
	}
	if got := f.Now(); !got.Equal(t0.Add(5*time.Second + 999*time.Millisecond)) {
		t.Fatalf("now %v after advancing 5.999s", got)
	}
	if f.Since(t0) != 5*time.Second+999*time.Millisecond {
		t.Fatalf("since %v", f.Since(t0))
	}
}

func TestFakeStopAndReset(t *testing.T) {
	f := NewFake(t0)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer reported it inactive")
	}
	f.Advance(2 * time.Second)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported it active")
	}
	f.Advance(time.Second)
	if _, ok := fired(tm.C()); !ok {
		t.Fatal("a reset timer did not fire")
	}
	// A fired value not read is dropped by Reset, as Go's timers do.
	tm.Reset(time.Second)
	f.Advance(time.Second)
	tm.Reset(time.Second)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a stale value was received after Reset")
	}
	if tm := f.NewTimer(0); func() bool { _, ok := fired(tm.C()); return !ok }() {
		t.Fatal("a zero timer did not fire at once")
	}
}

func TestFakeAfterFunc(t *testing.T) {
	f := NewFake(t0)
	var n atomic.Int32
	done := make(chan struct{}, 2)
	f.AfterFunc(time.Minute, func() { n.Add(1); done <- struct{}{} })
	stopped := f.AfterFunc(time.Minute, func() { n.Add(10); done <- struct{}{} })
	stopped.Stop()
	f.Advance(time.Minute)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterFunc's function did not run")
	}
	if f.Pending() != 0 || n.Load() != 1 {
		t.Fatalf("pending %d, calls %d; want 0 and only the armed one", f.Pending(), n.Load())
	}
}

func TestFakeTickerDropsUnreadTicks(t *testing.T) {
	f := NewFake(t0)
	tk := f.NewTicker(time.Second)
	defer tk.Stop()
	f.Advance(3500 * time.Millisecond)
	v, ok := fired(tk.C())
	if !ok || !v.Equal(t0.Add(time.Second)) {
		t.Fatalf("first tick %v %v, want the one at 1s (later ones dropped)", v, ok)
	}
	if _, ok := fired(tk.C()); ok {
		t.Fatal("more than one tick buffered")
	}
	f.Advance(500 * time.Millisecond)
	if v, ok := fired(tk.C()); !ok || !v.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("tick at 4s: %v %v", v, ok)
	}
	tk.Reset(10 * time.Second)
	f.Advance(9 * time.Second)
	if _, ok := fired(tk.C()); ok {
		t.Fatal("a ticker reset to 10s ticked after 9s")
	}
	f.Advance(time.Second)
	if _, ok := fired(tk.C()); !ok {
		t.Fatal("a ticker reset to 10s did not tick at 10s")
	}
}

func TestReal(t *testing.T) {
	var c Clock = Real{}
	tm := c.NewTimer(time.Millisecond)
	select {
	case <-tm.C():
	case <-time.After(10 * time.Second):
		t.Fatal("real timer did not fire")
	}
	done := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(done) })
	<-done
	tk := c.NewTicker(time.Millisecond)
	<-tk.C()
	tk.Stop()
	if c.Since(c.Now().Add(-time.Second)) < time.Second {
		t.Fatal("Since is short")
	}
}

func TestFakeWaitPending(t *testing.T) {
	f := NewFake(t0)
	got := make(chan bool)
	go func() { got <- f.WaitPending(2, nil) }()
	f.NewTimer(time.Second)
	f.AfterFunc(time.Second, func() {})
	if !<-got {
		t.Fatal("WaitPending(2) returned false with two timers armed")
	}
	done := make(chan struct{})
	close(done)
	if f.WaitPending(3, done) {
		t.Fatal("WaitPending(3) returned true with two timers armed")
	}
	f.Advance(time.Second) // the AfterFunc's goroutine ends at once
}
