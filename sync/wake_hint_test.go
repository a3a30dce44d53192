package sync

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

func TestWakeUpsAreThrottledButNeverOwedForLong(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	h := newWakeHint(pool, 200*time.Millisecond, clk, slog.New(slog.DiscardHandler))
	if !h.decide() {
		t.Fatal("the first batch after a quiet spell did not notify")
	}
	h.committed(true, true)
	for range 2 {
		clk.Advance(10 * time.Millisecond)
		if h.decide() {
			t.Fatal("a batch within the interval notified")
		}
		h.committed(false, true)
	}
	// The skipped batches are covered by one trailing wake-up, due when the
	// interval since the last notifying batch ends.
	if wait, ok := clk.Next(); !ok || wait != 180*time.Millisecond {
		t.Fatalf("trailing wake-up due in %v (%v); want 180ms", wait, ok)
	}
	clk.Advance(180 * time.Millisecond)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := listener.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("no trailing wake-up: %v", err)
	}
	if n := clk.Pending(); n != 0 {
		t.Errorf("%d wake-ups still scheduled after the owed one was sent", n)
	}
	// The next batch after the interval notifies itself, owing nothing.
	clk.Advance(time.Second)
	if !h.decide() {
		t.Error("a batch after the interval did not notify")
	}
	h.committed(true, true)
	if n := clk.Pending(); n != 0 {
		t.Errorf("a notifying commit scheduled %d trailing wake-ups", n)
	}
	h.stop()
}
