package feed_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

func TestPagesAndCountsReachPastTheRecentWindow(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, daysAgo := range []int{60, 30, 20, 1} {
		at := time.Now().AddDate(0, 0, -daysAgo)
		if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', $1)`, at); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
			VALUES ('erin', $1, 't', 'c', 'p', $2, $2, $2)`, at, fmt.Sprintf("%d days ago", daysAgo)); err != nil {
			t.Fatal(err)
		}
	}
	store := feed.NewStore(pool, nil)
	if got := fmt.Sprint(allTitles(t, store, feed.Query{UserID: "erin", Limit: 3})); got != "[1 days ago 20 days ago 30 days ago 60 days ago]" {
		t.Errorf("erin's feed = %s; want all four, newest first", got)
	}
	if n, _, err := store.UnreadCount(ctx, "erin"); err != nil || n != 4 {
		t.Errorf("unread = %d, %v; want 4", n, err)
	}
	if _, _, err := store.MarkAllRead(ctx, "erin"); err != nil {
		t.Fatal(err)
	}
	if n, _, err := store.UnreadCount(ctx, "erin"); err != nil || n != 0 {
		t.Errorf("unread after read-all = %d, %v; want 0", n, err)
	}
}

// allTitles pages through q's whole feed and returns the titles in order.
func allTitles(t *testing.T, store *feed.Store, q feed.Query) []string {
	t.Helper()
	var titles []string
	for {
		page, err := store.Page(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range page.Items {
			titles = append(titles, n.Title)
		}
		if !page.HasMore {
			return titles
		}
		q.After = &page.Next
	}
}

// errorRecorder passes every statement to Postgres and keeps the errors
// Postgres answered with.
type errorRecorder struct {
	*pgxpool.Pool
	mu   sync.Mutex
	errs []string
}

func (r *errorRecorder) record(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		r.mu.Lock()
		r.errs = append(r.errs, pgErr.Code+" "+pgErr.Message)
		r.mu.Unlock()
	}
}

func (r *errorRecorder) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := r.Pool.Query(ctx, sql, args...)
	r.record(err)
	return rows, err
}

func (r *errorRecorder) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return recordedRow{r.Pool.QueryRow(ctx, sql, args...), r}
}

type recordedRow struct {
	pgx.Row
	r *errorRecorder
}

func (row recordedRow) Scan(dest ...any) error {
	err := row.Row.Scan(dest...)
	row.r.record(err)
	return err
}

// A deployment younger than the weeks a read asks by name (or one whose
// maintenance has not created this week's partition) reads those weeks
// through the partitioned table: the answers are whole, and Postgres is never
// asked for a partition that does not exist, which it would log as an ERROR.
func TestWeeksWithoutAPartitionAreReadWithoutAnError(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	// Only the weeks of 60 and 1 days ago, and whatever ingest creates now.
	for _, daysAgo := range []int{60, 1} {
		at := time.Now().AddDate(0, 0, -daysAgo)
		if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', $1)`, at); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
			VALUES ('fay', $1, 't', 'c', 'p', $2, $2, $2)`, at, fmt.Sprintf("%d days ago", daysAgo)); err != nil {
			t.Fatal(err)
		}
	}
	seed(t, pool, "fay", "now", 1, 1)
	missing := 0
	for w := range 4 {
		var exists bool
		name := weekly.Partition("notifications", weekly.Start(time.Now().AddDate(0, 0, -7*w)))
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if !exists {
			missing++
		}
	}
	if missing == 0 {
		t.Fatal("every one of the last four weeks has a partition; the test needs some missing")
	}
	db := &errorRecorder{Pool: pool}
	store := feed.NewStore(db, nil)
	if got := fmt.Sprint(allTitles(t, store, feed.Query{UserID: "fay", Limit: 1})); got != "[n 0 1 days ago 60 days ago]" {
		t.Errorf("fay's feed = %s; want all three, newest first", got)
	}
	if n, _, err := store.UnreadCount(ctx, "fay"); err != nil || n != 3 {
		t.Errorf("unread = %d, %v; want 3", n, err)
	}
	if len(db.errs) != 0 {
		t.Errorf("Postgres answered with errors: %v", db.errs)
	}
}

// statementCounter passes every statement to Postgres and counts the
// feed's reads: the partition lookups, made once and remembered, apart.
type statementCounter struct {
	*pgxpool.Pool
	n atomic.Int64
}

func (c *statementCounter) count(sql string) {
	if !strings.Contains(sql, "to_regclass") {
		c.n.Add(1)
	}
}

func (c *statementCounter) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.count(sql)
	return c.Pool.Query(ctx, sql, args...)
}

func (c *statementCounter) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.count(sql)
	return c.Pool.QueryRow(ctx, sql, args...)
}

// statements runs read and returns how many statements it sent.
func (c *statementCounter) statements(t *testing.T, read func() error) int64 {
	t.Helper()
	before := c.n.Load()
	if err := read(); err != nil {
		t.Fatal(err)
	}
	return c.n.Load() - before
}

// Reads of a feed whose watermarks and changes by item lie in its newest
// weeks read those weeks alone, one statement each, and so does each change.
func TestPagesAndUnreadCountsOfARecentFeedAreOneStatementEach(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	seed(t, pool, "gus", "g", 150, 50)
	db := &statementCounter{Pool: pool}
	store := feed.NewStore(db, nil)
	var first feed.Page
	for _, tc := range []struct {
		name string
		read func() error
		want int64
	}{
		{"a first page and its refresh cursor", func() (err error) {
			first, err = store.Page(ctx, feed.Query{UserID: "gus", Refresh: true})
			return err
		}, 1},
		{"the page after it", func() error { _, err := store.Page(ctx, feed.Query{UserID: "gus", After: &first.Next}); return err }, 1},
		{"an unread page", func() error { _, err := store.Page(ctx, feed.Query{UserID: "gus", Status: feed.Unread}); return err }, 1},
		{"a capped unread count", func() error { _, _, err := store.UnreadCount(ctx, "gus"); return err }, 1},
		{"read-all", func() error { _, _, err := store.MarkAllRead(ctx, "gus"); return err }, 1},
		{"an unread count after read-all", func() error { _, _, err := store.UnreadCount(ctx, "gus"); return err }, 1},
		{"a mark unread", func() error { return store.MarkUnread(ctx, "gus", first.Items[3].PublicID()) }, 1},
		{"an archive", func() error { return store.Archive(ctx, "gus", first.Items[4].PublicID()) }, 1},
		{"an unread page after them", func() error { _, err := store.Page(ctx, feed.Query{UserID: "gus", Status: feed.Unread}); return err }, 1},
		{"an archived page", func() error { _, err := store.Page(ctx, feed.Query{UserID: "gus", Status: feed.Archived}); return err }, 1},
		{"the counts with archived", func() error { _, err := store.Counts(ctx, "gus", true); return err }, 1},
		{"archive-all", func() error { _, _, err := store.MarkAllArchived(ctx, "gus"); return err }, 1},
		{"an unarchive", func() error { return store.Unarchive(ctx, "gus", first.Items[5].PublicID()) }, 1},
		{"a page of the inbox after them", func() error { _, err := store.Page(ctx, feed.Query{UserID: "gus"}); return err }, 1},
		{"the counts after them", func() error { _, err := store.Counts(ctx, "gus", true); return err }, 1},
		// Without a read-all, fewer unread rows than the cap in the newest
		// weeks: the rest of the feed is counted too.
		{"the unread count of a small feed never read", func() error { _, _, err := store.UnreadCount(ctx, "nobody"); return err }, 2},
	} {
		if got := db.statements(t, tc.read); got != tc.want {
			t.Errorf("%s: %d statements, want %d", tc.name, got, tc.want)
		}
	}
	if first.Refresh == nil || len(first.Items) != feed.DefaultLimit || !first.HasMore {
		t.Errorf("first page = %d items, has_more %v, refresh %+v", len(first.Items), first.HasMore, first.Refresh)
	}
}

// The newest weeks are counted first; the weeks before them, from the
// read-all on (only those partitions are planned).
func TestAnUnreadCountAfterAReadAllWeeksAgoCountsWhatCameSince(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	insert := func(daysAgo int) {
		t.Helper()
		at := time.Now().AddDate(0, 0, -daysAgo)
		if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', $1)`, at); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
			VALUES ('hana', $1, 't', 'c', 'p', $2, $2, $2)`, at, fmt.Sprintf("%d days ago", daysAgo)); err != nil {
			t.Fatal(err)
		}
	}
	store := feed.NewStore(pool, nil)
	insert(60)
	insert(40)
	if _, _, err := store.MarkAllRead(ctx, "hana"); err != nil { // through the one of 40 days ago
		t.Fatal(err)
	}
	insert(30)
	insert(20)
	insert(1)
	if n, capped, err := store.UnreadCount(ctx, "hana"); err != nil || n != 3 || capped {
		t.Errorf("unread = %d capped=%v %v; want the three since read-all", n, capped, err)
	}
}

func TestPreparedReadsAnswerAsUnnamedOnesAndArePlannedOnce(t *testing.T) {
	t.Parallel()
	// One connection, to see what it holds prepared, opened as central
	// opens its pools: straight to Postgres, it may hold named statements.
	ctx := context.Background()
	pool, err := pgpool.New(ctx, pgpool.Config{URL: pgtest.DB(t), MaxConns: 1, PrepareOnFirstRun: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	seed(t, pool, "kim", "old", 60, 20)
	if _, _, err := feed.NewStore(pool, nil).MarkAllRead(ctx, "kim"); err != nil {
		t.Fatal(err)
	}
	seed(t, pool, "kim", "new", 5, 5)
	unnamed := feed.NewStore(pool, nil)
	prepared := unnamed.WithPreparedReads(pgpool.PrepareWhereAllowed)
	ids := func(p feed.Page) string {
		var out []int64
		for _, n := range p.Items {
			out = append(out, n.ID)
		}
		return fmt.Sprint(out, p.HasMore, p.Next)
	}
	for range 8 { // past the custom plans Postgres tries first
		for _, q := range []feed.Query{{UserID: "kim", Refresh: true}, {UserID: "kim", Limit: 7, Status: feed.Unread}} {
			a, errA := unnamed.Page(ctx, q)
			b, errB := prepared.Page(ctx, q)
			if errA != nil || errB != nil || ids(a) != ids(b) {
				t.Fatalf("%+v: unnamed %s, %v; prepared %s, %v", q, ids(a), errA, ids(b), errB)
			}
			next, after := q, a.Next
			next.Refresh, next.After = false, &after
			a, errA = unnamed.Page(ctx, next)
			b, errB = prepared.Page(ctx, next)
			if errA != nil || errB != nil || ids(a) != ids(b) {
				t.Fatalf("next page: unnamed %s, %v; prepared %s, %v", ids(a), errA, ids(b), errB)
			}
		}
		n, capped, err := prepared.UnreadCount(ctx, "kim")
		if err != nil || n != 5 || capped {
			t.Fatalf("prepared unread count = %d %v %v; want 5", n, capped, err)
		}
	}
	var statements, generic int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE generic_plans > 0) FROM pg_prepared_statements`).Scan(&statements, &generic); err != nil {
		t.Fatal(err)
	}
	if statements < 4 || generic < 4 {
		t.Errorf("the connection holds %d prepared statements, %d of them on a generic plan; want the reads', planned once", statements, generic)
	}
}

func TestAPartitionDroppedAfterItWasReadIsNotReadAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgpool.New(ctx, pgpool.Config{URL: pgtest.DB(t), MaxConns: 2, PrepareOnFirstRun: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	old := weekly.Start(time.Now()).Add(-12 * time.Hour) // last week's, read by name
	if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', $1)`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
		VALUES ('lou', $1, 't', 'c', 'p', 'old', 'old', 'old')`, old); err != nil {
		t.Fatal(err)
	}
	seed(t, pool, "lou", "now", 1, 1)
	db := &errorRecorder{Pool: pool}
	stores := []*feed.Store{feed.NewStore(db, nil), feed.NewStore(db, nil).WithPreparedReads(pgpool.PrepareWhereAllowed)}
	for _, store := range stores {
		for range 2 {
			if got := fmt.Sprint(allTitles(t, store, feed.Query{UserID: "lou", Limit: 5})); got != "[n 0 old]" {
				t.Fatalf("lou's feed = %s; want both", got)
			}
		}
	}
	// Retention drops the old week, which both stores know as present.
	if _, err := pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{weekly.Partition("notifications", old)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	for i, store := range stores {
		if i == 0 { // the count first: it finds the partition gone
			if n, _, err := store.UnreadCount(ctx, "lou"); err != nil || n != 1 {
				t.Errorf("unread after the drop = %d, %v; want 1", n, err)
			}
		}
		if got := fmt.Sprint(allTitles(t, store, feed.Query{UserID: "lou", Limit: 5})); got != "[n 0]" {
			t.Errorf("lou's feed after the drop = %s; want the newest alone", got)
		}
		if n, _, err := store.UnreadCount(ctx, "lou"); err != nil || n != 1 {
			t.Errorf("unread after the drop = %d, %v; want 1", n, err)
		}
	}
}
