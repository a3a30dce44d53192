package sync

import (
	"context"
	"log/slog"
	gosync "sync"
	"time"
)

// wakeHint decides which of the forwarder's ingest transactions send the
// NOTIFY wake-up. A notifying commit takes a database-wide lock, so notifying
// commits serialize; under load, one per interval notifies. A batch that
// skipped it is covered by a trailing wake-up at the end of the interval, so a
// listener never waits longer than the interval for a hint.
type wakeHint struct {
	interval time.Duration
	db       DB
	log      *slog.Logger

	mu      gosync.Mutex
	last    time.Time
	owed    bool
	trailer *time.Timer
	stopped bool
}

func newWakeHint(db DB, interval time.Duration, log *slog.Logger) *wakeHint {
	return &wakeHint{interval: interval, db: db, log: log}
}

// take reports whether the transaction about to commit should notify. When it
// should not, a trailing wake-up is owed.
func (h *wakeHint) take(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.interval <= 0 || now.Sub(h.last) >= h.interval {
		h.last, h.owed = now, false
		return true
	}
	h.owed = true
	if h.trailer == nil && !h.stopped {
		h.trailer = time.AfterFunc(h.last.Add(h.interval).Sub(now), h.trail)
	}
	return false
}

// trail sends the owed wake-up unless a notifying batch already did.
func (h *wakeHint) trail() {
	h.mu.Lock()
	h.trailer = nil
	owed := h.owed && !h.stopped
	if owed {
		h.last, h.owed = time.Now(), false
	}
	h.mu.Unlock()
	if owed {
		h.send(context.Background())
	}
}

// stop cancels the trailing timer and sends what is owed.
func (h *wakeHint) stop(ctx context.Context) {
	h.mu.Lock()
	h.stopped = true
	if h.trailer != nil {
		h.trailer.Stop()
		h.trailer = nil
	}
	owed := h.owed
	h.owed = false
	h.mu.Unlock()
	if owed {
		h.send(ctx)
	}
}

func (h *wakeHint) send(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := WakeUp(ctx, h.db); err != nil {
		// Only a hint: listeners read committed rows on their own schedule too.
		h.log.Debug("trailing wake-up", "err", err)
	}
}
