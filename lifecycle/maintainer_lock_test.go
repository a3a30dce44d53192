package lifecycle_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/weekly"
	"github.com/spoolcast/spoolcast/lifecycle"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// oldWeek makes the partition of a week 20 weeks ago, past a 90-day
// retention, with one notification in it, and returns its name.
func oldWeek(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	ctx := context.Background()
	old := time.Now().AddDate(0, 0, -140)
	if _, err := weekly.Ensure(ctx, pool, "notifications", old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key)
		VALUES ('u1', $1, 't', 'c', 'p', 'old', 'old')`, old); err != nil {
		t.Fatal(err)
	}
	return weekly.Partition("notifications", old)
}

// openReader leaves a transaction open on its own connection that has read
// notifications, as a report, pg_dump or a session idle in transaction does:
// it holds ACCESS SHARE on the table and every partition until it ends,
// which the returned function does.
func openReader(t *testing.T, url string) (end func()) {
	t.Helper()
	return pgtest.HoldOpen(t, url, `SELECT id FROM notifications LIMIT 1`)
}

// waitingOnALock reports whether a session of the test's database waits for a
// lock.
func waitingOnALock(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`) > 0
}

type passResult struct {
	rep lifecycle.Report
	err error
}

func runInBackground(ctx context.Context, cfg lifecycle.Config) <-chan passResult {
	done := make(chan passResult, 1)
	go func() {
		rep, err := lifecycle.Run(ctx, cfg)
		done <- passResult{rep, err}
	}()
	return done
}

func await(t *testing.T, done <-chan passResult) lifecycle.Report {
	t.Helper()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if !r.rep.Ran {
			t.Fatal("the pass was skipped")
		}
		return r.rep
	case <-time.After(time.Minute):
		t.Fatal("the pass did not end within a minute")
		return lifecycle.Report{}
	}
}

func pending(t *testing.T, pool *pgxpool.Pool, partition string) bool {
	t.Helper()
	return pgtest.Count(t, pool, `SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhdetachpending`, partition) == 1
}

func exists(t *testing.T, pool *pgxpool.Pool, table string) bool {
	t.Helper()
	return pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, table) == 1
}

// A pass behind an open reader used to queue an ACCESS EXCLUSIVE lock on
// notifications, and every ingest and feed read behind it, for as long as
// the reader stayed open. Now the partitions ahead are attached without a
// lock any reader or writer waits for, the detach past retention gives up
// at the lock timeout and is counted, ingest and the feed answer meanwhile,
// and once the reader ends the next pass finishes the detach and drops the
// partition.
func TestAPassBehindAnOpenReaderKeepsIngestAndTheFeedAnsweringAndFinishesNextPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.DB(t)
	// The pool central and `spoolcast maintain` use: a statement whose
	// context ends is cancelled in Postgres. (Not through PgBouncer
	// here: 1.18, installed here, exits on a cancel request,
	// pgbouncer#801.)
	pool, err := pgpool.New(ctx, pgpool.Config{URL: url, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	old := oldWeek(t, pool)
	ingestEvents(t, pool, "before", 1)
	endReader := openReader(t, url)

	// Two weeks on: weeks 5 and 6 ahead of today are new, and the
	// old week is past retention.
	at := time.Now().AddDate(0, 0, 14)
	metrics := lifecycle.NewMetrics(nil)
	cfg := lifecycle.Config{DB: pool, Retention: 90 * 24 * time.Hour, LockTimeout: 4 * time.Second, Clock: clock.Frozen(at), Metrics: metrics}
	passCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := runInBackground(passCtx, cfg)
	testsignal.Eventually(t, "the pass to wait on a lock behind the reader", 20*time.Second, func() bool { return waitingOnALock(t, pool) })

	// While the pass waits, well within its lock timeout: before,
	// both waited for the reader to end.
	ictx, icancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer icancel()
	if _, err := ingest.Ingest(ictx, pool, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "during", "u1")}}); err != nil {
		t.Fatalf("ingest while the pass waits: %v", err)
	}
	page, err := feed.NewStore(pool, nil).Page(ictx, feed.Query{UserID: "u1"})
	if err != nil {
		t.Fatalf("feed read while the pass waits: %v", err)
	}
	if len(page.Items) != 2 || page.Items[0].Title != "Export ready" {
		t.Errorf("feed while the pass waits = %+v; want the event just ingested, then the one before", page.Items)
	}

	rep := await(t, done)
	ahead := weekly.Partition("notifications", at.AddDate(0, 0, 28))
	if !contains(rep.Created, ahead) || !contains(rep.Created, weekly.Partition("push_dispatches", at.AddDate(0, 0, 28))) {
		t.Errorf("created %v behind the reader; want the weeks ahead up to %s", rep.Created, ahead)
	}
	want := []lifecycle.DDLLockTimeout{{Op: lifecycle.OpDetach, Partition: old}}
	if !slices.Equal(rep.LockTimeouts, want) || contains(rep.Dropped, old) {
		t.Errorf("lock timeouts %v, dropped %v; want the detach of %s given up", rep.LockTimeouts, rep.Dropped, old)
	}
	if n := testutil.ToFloat64(metrics.LockTimeouts(lifecycle.OpDetach)); n != 1 {
		t.Errorf("spoolcast_maintenance_ddl_lock_timeouts_total{op=\"detach\"} = %v, want 1", n)
	}
	if !pending(t, pool, old) {
		t.Fatalf("%s is not pending detach after the pass gave up", old)
	}
	if i := slices.IndexFunc(rep.Partitions, func(p lifecycle.Partition) bool { return p.Name == old }); i < 0 || !rep.Partitions[i].DetachPending {
		t.Errorf("the report's partitions do not show %s pending detach", old)
	}

	endReader()
	next := pass(t, pool, at) // the same retention, with the default lock timeout
	if !contains(next.Dropped, old) || len(next.LockTimeouts) != 0 {
		t.Errorf("the pass after the reader ended dropped %v with lock timeouts %v; want %s dropped", next.Dropped, next.LockTimeouts, old)
	}
	if exists(t, pool, old) {
		t.Errorf("%s still exists", old)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications WHERE user_id = 'u1'`); n != 2 {
		t.Errorf("notifications of u1 = %d, want the 2 within retention", n)
	}
}

// Attaching a partition conflicts with no reader or writer, but with a lock
// a long ANALYZE, a VACUUM or other DDL of the table holds: behind one, the
// pass gives up on that table's partitions ahead at the lock timeout, counts
// it, makes the other table's, and the next pass makes what is missing.
func TestAPassBehindDDLOnATableCountsItsCreateAndTheNextPassMakesIt(t *testing.T) {
	t.Parallel()
	eachWay(t, func(t *testing.T, url string, pool *pgxpool.Pool) {
		ctx := context.Background()
		holder, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close(ctx)
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE notifications IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		at := time.Now().AddDate(0, 0, 14)
		metrics := lifecycle.NewMetrics(nil)
		cfg := lifecycle.Config{DB: pool, LockTimeout: 300 * time.Millisecond, Clock: clock.Frozen(at), Metrics: metrics}
		rep := await(t, runInBackground(ctx, cfg))
		first := weekly.Partition("notifications", at.AddDate(0, 0, 21)) // weeks 0-4 ahead of today exist since migrating
		// The daily ANALYZE of the partitioned table waits behind the
		// same lock, and gives way too.
		if want := []lifecycle.DDLLockTimeout{{Op: lifecycle.OpCreate, Partition: first}, {Op: lifecycle.OpAnalyze, Partition: "notifications"}}; !slices.Equal(rep.LockTimeouts, want) {
			t.Errorf("lock timeouts = %v, want %v", rep.LockTimeouts, want)
		}
		if n := testutil.ToFloat64(metrics.LockTimeouts(lifecycle.OpCreate)); n != 1 {
			t.Errorf("spoolcast_maintenance_ddl_lock_timeouts_total{op=\"create\"} = %v, want 1", n)
		}
		if exists(t, pool, first) || !contains(rep.Created, weekly.Partition("push_dispatches", at.AddDate(0, 0, 28))) {
			t.Errorf("created %v; want push_dispatches' weeks ahead and none of notifications'", rep.Created)
		}
		// Ingest and reads take no lock the holder's conflicts with.
		ictx, icancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer icancel()
		if _, err := ingest.Ingest(ictx, pool, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "during", "u1")}}); err != nil {
			t.Fatalf("ingest behind the holder: %v", err)
		}

		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		cfg.Metrics = nil
		next := await(t, runInBackground(ctx, cfg))
		for _, w := range []int{21, 28} {
			if name := weekly.Partition("notifications", at.AddDate(0, 0, w)); !contains(next.Created, name) {
				t.Errorf("the next pass created %v; want %s", next.Created, name)
			}
		}
		if len(next.LockTimeouts) != 0 {
			t.Errorf("the next pass timed out on %v", next.LockTimeouts)
		}
		noLockTimeoutLeft(t, pool)
	})
}

// eachWay runs test on a new database directly and through PgBouncer in
// transaction mode.
func eachWay(t *testing.T, test func(t *testing.T, url string, pool *pgxpool.Pool)) {
	for _, via := range []string{"directly", "through PgBouncer in transaction mode"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			url := pgtest.DB(t)
			poolURL := url
			if via != "directly" {
				poolURL = pgtest.PgBouncer(t, url)
			}
			// Unnamed statements, as through PgBouncer before 1.21 they must be.
			test(t, url, pgtest.Connect(t, withQueryExecMode(poolURL)))
		})
	}
}

// noLockTimeoutLeft checks that no connection of pool kept a lock timeout
// after the passes: with PgBouncer in transaction mode, one left on a server
// connection would hold the next client to it.
func noLockTimeoutLeft(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var txs []pgx.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback(ctx)
		}
	}()
	for range 4 { // as many transactions at once as PgBouncer's pool has server connections
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
		var timeout string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&timeout); err != nil {
			t.Fatal(err)
		}
		if timeout != "0" {
			t.Errorf("a connection kept lock_timeout = %s after the passes", timeout)
		}
	}
}

func withQueryExecMode(url string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "default_query_exec_mode=cache_describe"
}
