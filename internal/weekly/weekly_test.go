package weekly_test

import (
	"context"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// CREATE TABLE ... PARTITION OF waited for every open reader of the table,
// and queued its readers and writers meanwhile: a partition is now attached,
// which no reader or writer conflicts with.
func TestEnsureAttachesAPartitionBehindAnOpenReader(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	pgtest.HoldOpen(t, url, `SELECT id FROM notifications LIMIT 1`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	at := time.Now().AddDate(0, 0, 70)
	created, err := weekly.EnsureWithin(ctx, pool, "notifications", at, 10*time.Second)
	if err != nil || !created {
		t.Fatalf("ensure behind a reader = %v, %v; want created at once", created, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key)
		VALUES ('u1', $1, 't', 'c', 'p', 'k', 'k')`, at); err != nil {
		t.Fatalf("a row for the new week: %v", err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM `+weekly.Partition("notifications", at)); n != 1 {
		t.Errorf("rows in the new partition = %d, want 1", n)
	}
}

// Behind a lock attaching conflicts with (DDL, ANALYZE, VACUUM of the
// table), EnsureWithin gives up at its lock timeout with an error
// LockTimeout reports, makes nothing, and leaves the caller's own lock
// timeout as it was.
func TestEnsureBehindDDLGivesUpAtItsLockTimeout(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	pgtest.HoldOpen(t, url, `LOCK TABLE push_dispatches IN SHARE UPDATE EXCLUSIVE MODE`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	at := time.Now().AddDate(0, 0, 70)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
		t.Fatal(err)
	}
	created, err := weekly.EnsureWithin(ctx, tx, "notifications", at, 200*time.Millisecond)
	if err != nil || !created {
		t.Fatalf("ensure of a table no one locks = %v, %v", created, err)
	}
	var caller string
	if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&caller); err != nil || caller != "7s" {
		t.Errorf("the caller's lock timeout after ensure = %q, %v; want 7s", caller, err)
	}
	_ = tx.Rollback(ctx)

	created, err = weekly.Ensure(ctx, pool, "push_dispatches", at)
	if !weekly.LockTimeout(err) || created || ctx.Err() != nil {
		t.Fatalf("ensure behind DDL = %v, %v; want a lock timeout, well within the context", created, err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, weekly.Partition("push_dispatches", at)); n != 0 {
		t.Errorf("a table was left behind by the ensure that gave up")
	}
}

func TestMillisRoundsUpAndIsNeverZero(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int64{0: 1, time.Microsecond: 1, time.Millisecond: 1, 1500 * time.Microsecond: 2, 250 * time.Millisecond: 250, 5 * time.Second: 5000} {
		if got := weekly.Millis(d); got != want {
			t.Errorf("Millis(%s) = %d, want %d", d, got, want)
		}
	}
}
