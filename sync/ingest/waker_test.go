package ingest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

// listen opens a connection listening on NotifyChannel.
func listen(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), "LISTEN "+NotifyChannel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// wakeUps counts the wake-ups that arrive within d.
func wakeUps(conn *pgx.Conn, d time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	n := 0
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return n
		}
		n++
	}
}

func TestWakeUpsAreThrottledButNeverOwedForLong(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	listener := listen(t, url)
	clk := clock.NewFake(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	w := NewWaker(pool, 200*time.Millisecond, clk, slog.New(slog.DiscardHandler))

	// The first commit after a quiet spell wakes listeners at once.
	w.Committed()
	if n := wakeUps(listener, 2*time.Second); n != 1 {
		t.Fatalf("wake-ups after the first commit = %d, want 1", n)
	}
	// Commits within the interval are covered by one trailing wake-up, due
	// when the interval since the last one ends.
	for range 3 {
		clk.Advance(10 * time.Millisecond)
		w.Committed()
	}
	if n := wakeUps(listener, 300*time.Millisecond); n != 0 {
		t.Fatalf("%d wake-ups within the interval; want none until it ends", n)
	}
	if wait, ok := clk.Next(); !ok || wait != 170*time.Millisecond {
		t.Fatalf("trailing wake-up due in %v (%v); want 170ms", wait, ok)
	}
	clk.Advance(170 * time.Millisecond)
	if n := wakeUps(listener, 2*time.Second); n != 1 {
		t.Fatalf("trailing wake-ups = %d, want 1", n)
	}
	if n := clk.Pending(); n != 0 {
		t.Errorf("%d wake-ups still scheduled after the owed one was sent", n)
	}
	// A commit after the interval wakes at once, owing nothing.
	clk.Advance(time.Second)
	w.Committed()
	if n := wakeUps(listener, 2*time.Second); n != 1 {
		t.Errorf("wake-ups after a quiet second = %d, want 1", n)
	}
	// Stop pays what is owed.
	w.Committed()
	w.Stop()
	if n := wakeUps(listener, time.Second); n != 1 {
		t.Errorf("wake-ups at stop = %d, want the owed one", n)
	}
	w.Committed()
	if n := wakeUps(listener, 300*time.Millisecond); n != 0 {
		t.Errorf("a commit after Stop sent %d wake-ups", n)
	}
}

func TestWakeUpWorksThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	bouncer := pgtest.PgBouncer(t, url)
	pool, err := pgxpool.New(context.Background(), bouncer)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	listener := listen(t, url)
	if err := WakeUp(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	if n := wakeUps(listener, 2*time.Second); n != 1 {
		t.Errorf("wake-ups = %d, want 1", n)
	}
}
