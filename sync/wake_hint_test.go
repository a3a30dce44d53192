package sync

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	h := newWakeHint(pool, 200*time.Millisecond, slog.New(slog.DiscardHandler))
	now := time.Now()
	if !h.take(now) {
		t.Fatal("the first batch after a quiet spell did not notify")
	}
	if h.take(now.Add(10*time.Millisecond)) || h.take(now.Add(20*time.Millisecond)) {
		t.Fatal("batches within the interval notified")
	}
	// The skipped batches are covered by one trailing wake-up.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := listener.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("no trailing wake-up: %v", err)
	}
	quiet, cancel2 := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel2()
	if n, err := listener.Conn().WaitForNotification(quiet); err == nil {
		t.Errorf("a second trailing wake-up %q for the same interval", n.Payload)
	}
	h.stop(ctx)
}
