// Package testsignal lets a background loop tell a test what it just did
// (a batch landed, a backoff began), so that tests wait on events instead of
// sleeping. A signal that was never initialised costs one nil check.
package testsignal

import (
	"fmt"
	"testing"
	"time"
)

// Signal carries values of T from the code under test to the test.
type Signal[T any] struct{ ch chan T }

// Init turns the signal on; call it before the code under test starts.
func (s *Signal[T]) Init() { s.ch = make(chan T, 1000) }

// Signal sends v if the signal is on. It never blocks: a test that lets
// 1,000 signals pile up unread has a bug, and it panics to say so.
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
		panic("testsignal: 1,000 signals were never read")
	}
}

// Wait returns the next value, or an error after timeout.
func (s *Signal[T]) Wait(timeout time.Duration) (T, error) {
	select {
	case v := <-s.ch:
		return v, nil
	case <-time.After(timeout):
		var zero T
		return zero, fmt.Errorf("no signal within %s", timeout)
	}
}

// Eventually waits until cond holds, checking it every few milliseconds,
// and fails the test after timeout, naming what it waited for. It is how a
// test waits for a condition it cannot be signalled about (a metric, a row,
// another process), instead of sleeping a guessed time.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; !cond(); wait = min(2*wait, 25*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(wait)
	}
}
