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
	if !h.decide(now) {
		t.Fatal("the first batch after a quiet spell did not notify")
	}
	h.committed(true, true)
	for i := range 2 {
		if h.decide(now.Add(time.Duration(i+1) * 10 * time.Millisecond)) {
			t.Fatal("a batch within the interval notified")
		}
		h.committed(false, true)
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
	h.stop()
}
