package startstop

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// Schedule says when a pass runs: every Interval on Clock, and at once when
// Wake or Kick receives.
type Schedule struct {
	// Interval is the longest wait between two passes. Required.
	Interval time.Duration
	// Wake and Kick start a pass at once when they receive: a wake-up hint
	// from outside, another worker's kick. Nil: not listened to.
	Wake, Kick <-chan struct{}
	// Clock times the interval. Default the wall clock.
	Clock clock.Clock
	// Delay makes the first pass wait for the interval (or a wake-up) instead
	// of running at start.
	Delay bool
}

// Every runs pass by the schedule until ctx ends. A pass that returns true
// found more work than it took: the next one runs at once.
func Every(ctx context.Context, s Schedule, pass func(ctx context.Context) (again bool)) {
	clk := clock.Or(s.Clock)
	wait := s.Delay
	for ctx.Err() == nil {
		if wait {
			t := clk.NewTimer(s.Interval)
			select {
			case <-ctx.Done():
			case <-s.Wake:
			case <-s.Kick:
			case <-t.C():
			}
			t.Stop()
			if ctx.Err() != nil {
				return
			}
		}
		wait = !pass(ctx)
	}
}

// Sleep waits d on clk until ctx ends; false when ctx ended first.
func Sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// Backoff is the wait after the given number of failures in a row:
// exponential from minWait, capped at maxWait, with full jitter on its upper
// half so that replicas failing together do not retry together.
func Backoff(failures int, minWait, maxWait time.Duration) time.Duration {
	d := minWait << min(max(failures, 1)-1, 30)
	if d <= 0 || d > maxWait {
		d = maxWait
	}
	return d/2 + rand.N(d/2+1)
}
