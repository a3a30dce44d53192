package sync

import (
	"context"
	"log/slog"
	gosync "sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// wakeHint decides which of the forwarder's ingest transactions send the
// NOTIFY wake-up. A notifying commit takes a database-wide lock, so notifying
// commits serialize; under load, one batch per interval notifies. A batch that
// committed without one leaves a wake-up owed, which the next notifying commit
// pays or a trailing NOTIFY sends at the end of the interval, so a listener
// never waits longer than the interval for a hint, and never gets one before
// the rows it is for have committed.
type wakeHint struct {
	interval time.Duration
	db       DB
	clock    clock.Clock
	log      *slog.Logger
	sends    gosync.WaitGroup

	mu      gosync.Mutex
	last    time.Time // when a batch last took the turn to notify
	owed    bool
	trailer clock.Timer
	stopped bool
}

func newWakeHint(db DB, interval time.Duration, clk clock.Clock, log *slog.Logger) *wakeHint {
	return &wakeHint{interval: interval, db: db, clock: clk, log: log}
}

// decide reports whether the transaction about to run should notify.
func (h *wakeHint) decide() bool {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.last) >= h.interval {
		h.last = now
		return true
	}
	return false
}

// committed records the transaction's end: a notifying commit pays what is
// owed; a commit without a NOTIFY, or a notifying one that failed while a
// wake-up was owed, leaves one owed.
func (h *wakeHint) committed(notified, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case notified && ok:
		h.owed = false
		return
	case notified && !ok:
		h.last = time.Time{} // the turn was not used
	case ok:
		h.owed = true
	}
	if h.owed && h.trailer == nil && !h.stopped {
		h.trailer = h.clock.AfterFunc(max(0, h.last.Add(h.interval).Sub(h.clock.Now())), h.trail)
	}
}

// trail sends the owed wake-up unless a notifying commit already paid it.
func (h *wakeHint) trail() {
	h.mu.Lock()
	h.trailer = nil
	owed := h.owed && !h.stopped
	if owed {
		h.last, h.owed = h.clock.Now(), false
		h.sends.Add(1)
	}
	h.mu.Unlock()
	if owed {
		defer h.sends.Done()
		h.send()
	}
}

// stop cancels the trailing timer, sends what is owed and waits for sends in flight.
func (h *wakeHint) stop() {
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
		h.send()
	}
	h.sends.Wait()
}

func (h *wakeHint) send() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := WakeUp(ctx, h.db); err != nil {
		// Only a hint: listeners read committed rows on their own schedule too.
		h.log.Debug("trailing wake-up", "err", err)
	}
}
