// Package clock is the time mpsd's core reads and waits on: the wall
// clock in production, a fake one that moves only when a test advances it
// (Fake), so that backoffs, grace periods, probe intervals and quarantine
// windows run in a test without sleeping, the same on every run. Its
// shape follows tailscale's tstime.Clock.
package clock

import "time"

// Clock tells the time and makes timers on it.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
	// NewTimer fires once, d from now, on its channel.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
	// NewTicker fires every d on its channel until stopped; a tick the
	// reader was not ready for is dropped, as time.Ticker's is.
	NewTicker(d time.Duration) Ticker
}

// Timer is a time.Timer of a Clock. C is nil for an AfterFunc timer.
type Timer interface {
	C() <-chan time.Time
	// Stop reports whether it stopped the timer before it fired.
	Stop() bool
	// Reset makes the timer fire d from now; it reports whether it had
	// been active.
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker of a Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real is the wall clock.
type Real struct{}

var _ Clock = Real{}

func (Real) Now() time.Time                  { return time.Now() }
func (Real) Since(t time.Time) time.Duration { return time.Since(t) }

func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }
