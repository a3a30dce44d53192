// Package startstop is the one lifecycle every background loop in spoolcast
// has: Start returns at once and runs the loop's goroutines under a context
// of their own; Stop cancels that context, waits for them until its own
// context ends, runs the component's final step, and is safe to call twice
// and before Start (a Start after Stop starts nothing). Stopped tells others
// when the loops have returned. In the spirit of River's
// rivershared/startstop.
//
// The pass helpers (Every) give the loops that "run a pass every interval or
// when woken" one shape on an injected clock, so tests move time instead of
// waiting for it.
package startstop

import (
	"context"
	"sync"
)

// Service runs a component's goroutines. The zero value is ready to use; a
// component embeds or holds one.
type Service struct {
	mu      sync.Mutex
	state   state
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped chan struct{} // closed once every goroutine has returned after Stop, or at a Stop before Start
	stopErr error
	stop    sync.Once
}

type state int

const (
	idle state = iota
	running
	stopping
)

func (s *Service) init() {
	if s.stopped == nil {
		s.stopped = make(chan struct{})
	}
}

// Start runs each loop in its own goroutine under a context derived from ctx
// that Stop cancels, and returns at once. It reports whether it started them:
// only the first call does, and none after Stop.
func (s *Service) Start(ctx context.Context, loops ...func(ctx context.Context)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	if s.state != idle {
		return false
	}
	s.state = running
	ctx, s.cancel = context.WithCancel(ctx)
	for _, loop := range loops {
		s.wg.Go(func() { loop(ctx) })
	}
	return true
}

// Go runs one more goroutine under the loops' context; it reports false,
// running nothing, when the service is not running.
func (s *Service) Go(ctx context.Context, fn func(ctx context.Context)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != running {
		return false
	}
	s.wg.Go(func() { fn(ctx) })
	return true
}

// Started reports whether Start has run (whether or not Stop has since).
func (s *Service) Started() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancel != nil
}

// Stop cancels the loops' context and waits for them to return, until ctx
// ends; then, when they all returned and Start had run, it runs final (the
// component's last flush, if any) with ctx. The second and later calls wait
// for the first and return its answer. Before Start it returns nil at once,
// and Start will start nothing.
func (s *Service) Stop(ctx context.Context, final ...func(ctx context.Context) error) error {
	s.stop.Do(func() {
		s.mu.Lock()
		s.init()
		was := s.state
		s.state = stopping
		cancel := s.cancel
		s.mu.Unlock()
		defer close(s.stopped)
		if was != running {
			return
		}
		cancel()
		if !Wait(ctx, &s.wg) {
			s.stopErr = ctx.Err()
			return
		}
		for _, fn := range final {
			if err := fn(ctx); err != nil && s.stopErr == nil {
				s.stopErr = err
			}
		}
	})
	select {
	case <-s.Stopped():
		return s.stopErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stopped returns a channel closed once Stop has finished: the loops
// returned (or Stop's context ended first) and the final step ran.
func (s *Service) Stopped() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	return s.stopped
}

// Wait waits for wg until ctx ends; false when ctx ended first.
func Wait(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
