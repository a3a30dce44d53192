package ingest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/weekly"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// withoutThisWeek returns a pool on a new database whose notifications have
// no partition for this week, as when maintenance has not run for weeks.
func withoutThisWeek(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	if _, err := pool.Exec(context.Background(), `DROP TABLE `+weekly.Partition("notifications", time.Now())); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

// A report, pg_dump or a session idle in transaction holds ACCESS SHARE on
// notifications: creating the week's partition on demand used to wait for
// it, and the ingest with it. Attaching conflicts with no reader.
func TestIngestCreatesAMissingPartitionBehindAnOpenReader(t *testing.T) {
	t.Parallel()
	url, pool := withoutThisWeek(t)
	pgtest.HoldOpen(t, url, `SELECT id FROM notifications LIMIT 1`)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "k", "u1")}}); err != nil {
		t.Fatalf("ingest behind an open reader: %v", err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 1 {
		t.Errorf("notifications = %d, want 1", n)
	}
}

// Behind a lock that attaching does conflict with (DDL, a long ANALYZE or
// VACUUM of notifications), ingest does not wait for it: the on-demand
// creation gives up after weekly.OnDemandLockTimeout and the batch fails
// with a lock timeout, which no caller takes for a refusal of the events
// (not the "no partition" check violation), and the same batch lands once
// the lock is gone.
func TestIngestBehindDDLOnNotificationsFailsFastAndRetryably(t *testing.T) {
	t.Parallel()
	url, pool := withoutThisWeek(t)
	end := pgtest.HoldOpen(t, url, `LOCK TABLE notifications IN SHARE UPDATE EXCLUSIVE MODE`)
	items := []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "k", "u1")}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ingest.Ingest(ctx, pool, items)
	var pgErr *pgconn.PgError
	if !weekly.LockTimeout(err) || !errors.As(err, &pgErr) || pgErr.Code[:2] == "23" || ctx.Err() != nil {
		t.Fatalf("ingest behind DDL = %v; want a lock timeout (55P03), well within its context", err)
	}
	end()
	res, err := ingest.Ingest(ctx, pool, items)
	if err != nil || len(res) != 1 || res[0].Created != 1 {
		t.Fatalf("the retry once the lock is gone = %+v, %v; want the event accepted", res, err)
	}
}
