// Package clock is the one way spoolcast tells time: every component that
// schedules, expires or compares times takes a Clock from its Config (nil:
// the wall clock), so that tests move it: a backoff of minutes, a 24-hour
// receipt window or a key TTL is then a test step, not a wait.
package clock

import (
	"slices"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer whose channel receives once d has passed.
	NewTimer(d time.Duration) Timer
	// AfterFunc runs f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a *time.Timer, or a fake one.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Or returns c, or the wall clock when c is nil: how a component's Config
// fills its Clock default.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Since is the time passed on c since t.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Until is the time on c until t.
func Until(c Clock, t time.Time) time.Duration { return t.Sub(c.Now()) }

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// AfterFunc calls time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Frozen returns a clock that stands at t: a maintenance pass run "as of" a
// given time.
func Frozen(t time.Time) *Fake { return NewFake(t) }

// Fake is a clock that moves only when told to.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	added  chan struct{} // receives when a timer is made
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, added: make(chan struct{}, 1)}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when Advance passes its deadline.
func (f *Fake) NewTimer(d time.Duration) Timer {
	return f.add(&fakeTimer{c: make(chan time.Time, 1)}, d)
}

// AfterFunc runs fn when Advance passes d from now.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	return f.add(&fakeTimer{fn: fn}, d)
}

func (f *Fake) add(t *fakeTimer, d time.Duration) Timer {
	f.mu.Lock()
	t.clock, t.at = f, f.now.Add(d)
	f.timers = append(f.timers, t)
	f.mu.Unlock()
	select {
	case f.added <- struct{}{}:
	default:
	}
	if d <= 0 {
		f.Advance(0)
	}
	return t
}

// Advance moves the clock by d and fires the timers that are due, in order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	now := f.now
	var due []*fakeTimer
	kept := f.timers[:0]
	for _, t := range f.timers {
		if !t.at.After(now) {
			due = append(due, t)
		} else {
			kept = append(kept, t)
		}
	}
	f.timers = kept
	f.mu.Unlock()
	slices.SortFunc(due, func(a, b *fakeTimer) int { return a.at.Compare(b.at) })
	for _, t := range due {
		if t.fn != nil {
			go t.fn()
		} else {
			t.c <- now
		}
	}
}

// Pending returns how many timers have not fired or been stopped.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Next returns the time until the earliest pending timer, and false when there is none.
func (f *Fake) Next() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return 0, false
	}
	next := f.timers[0].at
	for _, t := range f.timers[1:] {
		if t.at.Before(next) {
			next = t.at
		}
	}
	return next.Sub(f.now), true
}

// TimerAdded returns a channel that receives after a timer is made.
func (f *Fake) TimerAdded() <-chan struct{} { return f.added }

type fakeTimer struct {
	clock *Fake
	at    time.Time
	c     chan time.Time
	fn    func()
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	f := t.clock
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			return true
		}
	}
	return false
}
