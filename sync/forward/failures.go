package forward

// After a failed attempt: the backoff, and holding newer batches back until
// the oldest pending lands whole (see Forwarder).

import (
	"context"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// heldBack reports that a failure holds takes back: a batch is in flight
// (the one to go first), or the backoff has not ended. f.mu is held.
func (f *Forwarder) heldBack() bool {
	return f.failures > 0 && (f.inflight > 0 || f.clock.Now().Before(f.retryAt))
}

// holdBack records a failed attempt, and chunk, the smaller statement size
// it calls for when a statement ran too long (0: no change), and returns the
// backoff before the next.
func (f *Forwarder) holdBack(chunk int) (wait time.Duration, failures int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	if f.failures == 0 {
		f.failedAt = now
	}
	f.failures++
	if chunk > 0 {
		f.chunk = chunk
	}
	wait = startstop.Backoff(f.failures, f.cfg.MinBackoff, f.cfg.MaxBackoff)
	f.retryAt = now.Add(wait)
	return wait, f.failures
}

// recovered ends a failure: the batch taken from the top after it landed
// whole. Logged once however many workers and attempts the failure held.
func (f *Forwarder) recovered() {
	f.mu.Lock()
	failures, since := f.failures, f.failedAt
	f.failures, f.chunk = 0, 0
	f.mu.Unlock()
	if failures > 0 {
		f.log.Info("forwarding recovered", "after_failures", failures, "failing_for", clock.Since(f.clock, since).Round(time.Millisecond))
	}
}

// failed counts and logs a failure and waits out its backoff; false when the
// forwarder is stopping.
func (f *Forwarder) failed(ctx context.Context, err error, failures int) bool {
	return f.backOff(ctx, err, failures, startstop.Backoff(failures, f.cfg.MinBackoff, f.cfg.MaxBackoff))
}

// backOff counts and logs a failure and waits for wait; false when the
// forwarder is stopping.
func (f *Forwarder) backOff(ctx context.Context, err error, failures int, wait time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	f.cfg.Metrics.errors.Inc()
	// A failure may be a failover: the next commit reads Postgres's history
	// at once, whenever the last read was.
	f.historyAt.Store(0)
	f.failLog.Do(func(suppressed int64) {
		f.log.Warn("forwarding failed; events stay in the spool and will be retried",
			"err", err, "attempt", failures, "retry_in", wait.Round(time.Millisecond), "suppressed", suppressed)
	})
	t := f.clock.NewTimer(wait)
	defer t.Stop()
	f.testSignals.backoff.Signal(wait)
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
