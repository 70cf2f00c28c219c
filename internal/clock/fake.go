package clock

import (
	"slices"
	"sync"
	"time"
)

// Fake is a Clock that moves only when Advance or Set moves it. Timers
// and tickers due by then fire in the order of their deadlines (ties in
// the order they were made); an AfterFunc's function runs in its own
// goroutine, as the real one's does, and Advance does not wait for it.
// Safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer
	// armed is closed (and replaced) whenever a timer is armed.
	armed chan struct{}
}

var _ Clock = (*Fake)(nil)

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start, armed: make(chan struct{})} }

// WaitPending waits until at least n timers and tickers wait to fire
// (the subject under test has armed what it waits on), or until done is
// closed; false then.
func (f *Fake) WaitPending(n int, done <-chan struct{}) bool {
	for {
		f.mu.Lock()
		if len(f.timers) >= n {
			f.mu.Unlock()
			return true
		}
		armed := f.armed
		f.mu.Unlock()
		select {
		case <-armed:
		case <-done:
			return false
		}
	}
}

// signalLocked tells WaitPending that a timer was armed.
func (f *Fake) signalLocked() {
	close(f.armed)
	f.armed = make(chan struct{})
}

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// Advance moves the clock d forward, firing what falls due on the way.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.setLocked(f.now.Add(d))
}

// Set moves the clock to t (never back), firing what falls due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.setLocked(t)
}

// Pending reports how many timers and tickers wait to fire: a test waits
// for its subject to arm one before it advances.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NextDeadline is the earliest time a timer waits for, false when none
// does.
func (f *Fake) NextDeadline() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return time.Time{}, false
	}
	return f.timers[0].when, true
}

// setLocked fires, one by one in deadline order, every timer due at or
// before to, moving now to each deadline as it fires it; it unlocks f.mu.
func (f *Fake) setLocked(to time.Time) {
	var run []func()
	for len(f.timers) > 0 && !f.timers[0].when.After(to) {
		t := f.timers[0]
		f.timers = f.timers[1:]
		if t.when.After(f.now) {
			f.now = t.when
		}
		if t.period > 0 {
			t.when = t.when.Add(t.period)
			f.insertLocked(t)
		}
		if t.fn != nil {
			run = append(run, t.fn)
			continue
		}
		select {
		case t.c <- f.now:
		default: // the reader was not ready: dropped, as time's are
		}
	}
	if to.After(f.now) {
		f.now = to
	}
	f.mu.Unlock()
	for _, fn := range run {
		go fn()
	}
}

// insertLocked puts t in deadline order, after those of the same time.
func (f *Fake) insertLocked(t *fakeTimer) {
	i, _ := slices.BinarySearchFunc(f.timers, t, func(a, b *fakeTimer) int {
		if c := a.when.Compare(b.when); c != 0 {
			return c
		}
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	f.timers = slices.Insert(f.timers, i, t)
}

func (f *Fake) removeLocked(t *fakeTimer) bool {
	i := slices.Index(f.timers, t)
	if i < 0 {
		return false
	}
	f.timers = slices.Delete(f.timers, i, i+1)
	return true
}

func (f *Fake) add(d time.Duration, period time.Duration, fn func()) *fakeTimer {
	f.mu.Lock()
	f.seq++
	t := &fakeTimer{f: f, when: f.now.Add(d), period: period, fn: fn, seq: f.seq}
	if fn == nil {
		t.c = make(chan time.Time, 1)
	}
	f.insertLocked(t)
	f.signalLocked()
	// A deadline now or past fires at once, as the real clock's does.
	f.setLocked(f.now)
	return t
}

func (f *Fake) NewTimer(d time.Duration) Timer { return f.add(d, 0, nil) }

func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer { return f.add(d, 0, fn) }

func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	return fakeTicker{f.add(d, d, nil)}
}

type fakeTimer struct {
	f      *Fake
	when   time.Time
	period time.Duration
	fn     func()
	c      chan time.Time
	seq    uint64
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

// Stop and Reset drain a value fired and not yet read, as a time.Timer
// does since Go 1.23: no stale tick is received after either.
func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.drain()
	return t.f.removeLocked(t)
}

func (t *fakeTimer) drain() {
	if t.c == nil {
		return
	}
	select {
	case <-t.c:
	default:
	}
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.f
	f.mu.Lock()
	t.drain()
	active := f.removeLocked(t)
	f.seq++
	t.seq = f.seq
	t.when = f.now.Add(d)
	if t.period > 0 {
		t.period = d
	}
	f.insertLocked(t)
	f.signalLocked()
	f.setLocked(f.now)
	return active
}

type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) C() <-chan time.Time   { return k.t.c }
func (k fakeTicker) Stop()                 { k.t.Stop() }
func (k fakeTicker) Reset(d time.Duration) { k.t.Reset(d) }
