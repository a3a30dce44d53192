// Package lograte keeps repeated errors from flooding the logs: one line per
// interval, carrying how many were left out since the last one.
package lograte

import (
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Limiter lets one call in per interval and counts the calls it turns away.
type Limiter struct {
	sometimes  rate.Sometimes
	suppressed atomic.Int64
}

// New returns a limiter that lets the first call through, then one per interval.
func New(interval time.Duration) *Limiter {
	return &Limiter{sometimes: rate.Sometimes{Interval: interval}}
}

// Do runs log when the interval allows, with the number of calls left out
// since it last ran; otherwise it only counts this call.
func (l *Limiter) Do(log func(suppressed int64)) {
	l.suppressed.Add(1)
	l.sometimes.Do(func() { log(l.suppressed.Swap(0) - 1) })
}
