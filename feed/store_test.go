package feed_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/weekly"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// seed ingests n events for user in transactions of batch events each, so rows
// of one transaction share created_at.
func seed(t testing.TB, pool *pgxpool.Pool, user, prefix string, n, batch int) {
	t.Helper()
	for lo := 0; lo < n; lo += batch {
		if err := trySeed(pool, user, fmt.Sprintf("%s-%d", prefix, lo), min(batch, n-lo)); err != nil {
			t.Fatal(err)
		}
	}
}

// trySeed ingests n events for user in one transaction.
func trySeed(pool *pgxpool.Pool, user, prefix string, n int) error {
	var items []ingest.Item
	for i := range n {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"%s-%d","type":"t","recipients":[%q],"title":"n %d"}`, prefix, i, user, i), "")
		if err != nil {
			return err
		}
		items = append(items, ingest.Item{Producer: "p", Event: ev})
	}
	_, err := ingest.Ingest(context.Background(), pool, items)
	return err
}

func TestPagingSeesEveryRowOnceWhileNewRowsArrive(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	seed(t, pool, "alice", "old", 5000, 500) // ten transactions of 500 equal created_at
	seed(t, pool, "bob", "bob", 300, 300)

	existing := map[int64]bool{}
	rows, err := pool.Query(ctx, "SELECT id FROM notifications WHERE user_id = 'alice'")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		_ = rows.Scan(&id)
		existing[id] = true
	}
	rows.Close()

	store := feed.NewStore(pool, nil)
	inserted := make(chan struct{})
	go func() {
		defer close(inserted)
		for i := range 10 {
			if err := trySeed(pool, "alice", fmt.Sprintf("new%d", i), 50); err != nil {
				t.Error(err) // Fatal may not be called off the test's goroutine
				return
			}
		}
	}()
	seen := map[int64]int{}
	var after *feed.Cursor
	var prev *feed.Notification
	pages := 0
	for {
		p, err := store.Page(ctx, feed.Query{UserID: "alice", Limit: 37, After: after})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for i := range p.Items {
			n := p.Items[i]
			seen[n.ID]++
			if prev != nil && (n.CreatedAt.After(prev.CreatedAt) || (n.CreatedAt.Equal(prev.CreatedAt) && n.ID >= prev.ID)) {
				t.Fatalf("row %d is out of feed order after %d", n.ID, prev.ID)
			}
			prev = &n
		}
		if !p.HasMore {
			break
		}
		after = &p.Next
	}
	<-inserted
	for id := range existing {
		if seen[id] != 1 {
			t.Fatalf("row %d that existed before paging was seen %d times", id, seen[id])
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("row %d seen %d times", id, n)
		}
	}
	t.Logf("%d pages, %d rows seen, %d existed before", pages, len(seen), len(existing))
}

func TestAUserSeesAndMarksOnlyTheirOwnRows(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	seed(t, pool, "alice", "a", 3, 3)
	seed(t, pool, "bob", "b", 2, 2)
	store := feed.NewStore(pool, nil)
	bobs, err := store.Page(ctx, feed.Query{UserID: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if len(bobs.Items) != 2 || bobs.HasMore {
		t.Fatalf("bob's feed = %d rows, has_more %v", len(bobs.Items), bobs.HasMore)
	}
	bobsFirst := bobs.Items[0].PublicID()
	if err := store.MarkRead(ctx, "alice", bobsFirst); !errors.Is(err, feed.ErrNotFound) {
		t.Errorf("alice marking bob's row = %v; want ErrNotFound", err)
	}
	if err := store.MarkRead(ctx, "bob", bobsFirst); err != nil {
		t.Fatal(err)
	}
	if err := store.MarkRead(ctx, "bob", bobsFirst); err != nil {
		t.Errorf("marking a read row again = %v; want nil", err)
	}
	if n, capped, _ := store.UnreadCount(ctx, "bob"); n != 1 || capped {
		t.Errorf("bob unread = %d capped=%v; want 1", n, capped)
	}
	unread, _ := store.Page(ctx, feed.Query{UserID: "bob", Status: feed.Unread})
	if len(unread.Items) != 1 || unread.Items[0].ID == bobs.Items[0].ID {
		t.Errorf("bob's unread page = %+v", unread.Items)
	}
	alices, _ := store.Page(ctx, feed.Query{UserID: "alice"})
	if through, ok, err := store.MarkAllRead(ctx, "alice"); err != nil || !ok || through != alices.Items[0].PublicID() {
		t.Errorf("alice mark-all = %v %v, %v; want through her newest %v", through, ok, err, alices.Items[0].PublicID())
	}
	if n, _, _ := store.UnreadCount(ctx, "alice"); n != 0 {
		t.Errorf("alice unread after mark-all = %d, want 0", n)
	}
	if n, _, _ := store.UnreadCount(ctx, "bob"); n != 1 {
		t.Errorf("alice's mark-all touched bob: unread %d", n)
	}
	if _, ok, err := store.MarkAllRead(ctx, "nobody"); err != nil || ok {
		t.Errorf("mark-all of an empty feed = %v, %v; want nothing to mark", ok, err)
	}
}

func TestUnreadCountIsCapped(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	seed(t, pool, "carol", "c", 150, 150)
	n, capped, err := feed.NewStore(pool, nil).UnreadCount(context.Background(), "carol")
	if err != nil || n != feed.UnreadCap || !capped {
		t.Errorf("unread = %d capped=%v %v; want %d capped", n, capped, err, feed.UnreadCap)
	}
}

func TestReadAllIsAWatermarkThatLaterRowsStayAbove(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	store := feed.NewStore(pool, nil)
	seed(t, pool, "dave", "before", 500, 100)
	if _, ok, err := store.MarkAllRead(ctx, "dave"); err != nil || !ok {
		t.Fatal(err)
	}
	// Read-all wrote one row, not 500.
	var updated int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE user_id = 'dave' AND read_at IS NOT NULL`).Scan(&updated); err != nil || updated != 0 {
		t.Errorf("read-all updated %d notification rows (%v); want a watermark alone", updated, err)
	}
	page, _ := store.Page(ctx, feed.Query{UserID: "dave", Limit: 100})
	for _, n := range page.Items {
		if n.ReadAt == nil {
			t.Fatalf("row %d under the watermark shows unread", n.ID)
		}
	}
	seed(t, pool, "dave", "after", 3, 3)
	if n, capped, err := store.UnreadCount(ctx, "dave"); err != nil || n != 3 || capped {
		t.Errorf("unread after 3 new = %d capped=%v %v; want 3", n, capped, err)
	}
	unread, _ := store.Page(ctx, feed.Query{UserID: "dave", Status: feed.Unread})
	if len(unread.Items) != 3 || unread.HasMore {
		t.Errorf("unread page = %d rows, has_more %v; want the 3 new", len(unread.Items), unread.HasMore)
	}
	if err := store.MarkRead(ctx, "dave", page.Items[0].PublicID()); err != nil {
		t.Errorf("marking a row under the watermark = %v; want nil, a no-op", err)
	}
}

func TestIDsAreOpaqueAndStrict(t *testing.T) {
	t.Parallel()
	id := feed.ID{CreatedAt: time.Date(2026, 11, 30, 9, 0, 0, 123456000, time.UTC), Seq: 1042}
	back, err := feed.ParseID(id.String())
	if err != nil || back != id {
		t.Fatalf("ParseID(%q) = %v, %v; want %v", id.String(), back, err, id)
	}
	for _, bad := range []string{"", "1042", id.String() + "A", id.String()[:21], "AAAAAAAAAAAAAAAAAAAAAA"} {
		if _, err := feed.ParseID(bad); !errors.Is(err, feed.ErrNotFound) {
			t.Errorf("ParseID(%q) = %v; want ErrNotFound", bad, err)
		}
	}
}

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

// Read-all marks read what had committed when it was asked. A notification
// whose transaction was open meanwhile commits later, with an older
// created_at than the newest one read-all covered: it is unread in the
// page, in the unread count and in the unread-only page, and can be marked
// read on its own. Its transaction may take its id before the newest
// one's (read-all's snapshot lists it as running) or after (the newest
// id, at or above the snapshot's xmax): either way.
func TestANotificationCommittedAfterReadAllIsUnreadThoughOlder(t *testing.T) {
	t.Parallel()
	for _, idLast := range []bool{false, true} {
		t.Run(fmt.Sprintf("id last %v", idLast), func(t *testing.T) {
			t.Parallel()
			lateUnreadAfterReadAll(t, "dana"+strconv.FormatBool(idLast), idLast)
		})
	}
}

func lateUnreadAfterReadAll(t *testing.T, user string, idLast bool) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	store := feed.NewStore(pool, nil)
	seed(t, pool, user, "before", 1, 1)
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if idLast {
		if _, err := open.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		seed(t, pool, user, "newest", 1, 1)
	}
	if _, err := ingest.Ingest(ctx, open, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "late", user)}}); err != nil {
		t.Fatal(err)
	}
	if !idLast {
		seed(t, pool, user, "newest", 1, 1)
	}
	through, ok, err := store.MarkAllRead(ctx, user)
	if err != nil || !ok {
		t.Fatalf("mark all read = %v, %v", ok, err)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := store.Page(ctx, feed.Query{UserID: user})
	if err != nil || len(page.Items) != 3 {
		t.Fatalf("page = %+v, %v; want 3 items", page.Items, err)
	}
	if page.Items[0].PublicID() != through {
		t.Errorf("read-all covered %v, want the newest %v", through, page.Items[0].PublicID())
	}
	// Feed order: newest, then the late one (its transaction started before
	// newest's), then the first.
	late := page.Items[1]
	if late.ReadAt != nil || page.Items[0].ReadAt == nil || page.Items[2].ReadAt == nil {
		t.Fatalf("read at: newest %v, late %v, first %v; want only the late one unread", page.Items[0].ReadAt, late.ReadAt, page.Items[2].ReadAt)
	}
	if n, capped, err := store.UnreadCount(ctx, user); n != 1 || capped || err != nil {
		t.Errorf("unread count = %d %v %v; want 1", n, capped, err)
	}
	unread, err := store.Page(ctx, feed.Query{UserID: user, Status: feed.Unread})
	if err != nil || len(unread.Items) != 1 || unread.Items[0].ID != late.ID {
		t.Errorf("unread page = %+v, %v; want the late one alone", unread.Items, err)
	}
	if err := store.MarkRead(ctx, user, late.PublicID()); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := store.UnreadCount(ctx, user); n != 0 {
		t.Errorf("unread after marking the late one = %d, want 0", n)
	}
	// A later read-all covers what committed since.
	open2, _ := pool.Begin(ctx)
	defer open2.Rollback(ctx)
	if _, err := ingest.Ingest(ctx, open2, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "late2", user)}}); err != nil {
		t.Fatal(err)
	}
	_ = open2.Commit(ctx)
	if n, _, _ := store.UnreadCount(ctx, user); n != 1 {
		t.Errorf("unread with a second late one = %d, want 1", n)
	}
	if _, _, err := store.MarkAllRead(ctx, user); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := store.UnreadCount(ctx, user); n != 0 {
		t.Errorf("unread after the second read-all = %d, want 0", n)
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

func TestTheRefreshCursorIsWhereLiveNowStands(t *testing.T) {
	// Not parallel: a transaction another test holds open moves the horizon
	// of both reads.
	pool := pgtest.Pool(t)
	ctx := context.Background()
	store := feed.NewStore(pool, nil)
	seed(t, pool, "ivy", "i", 30, 10)
	for _, user := range []string{"ivy", "nobody"} {
		page, err := store.Page(ctx, feed.Query{UserID: user, Refresh: true})
		if err != nil || page.Refresh == nil {
			t.Fatalf("%s's first page = %v, %v", user, page.Refresh, err)
		}
		want, err := live.Now(ctx, pool, user)
		if err != nil {
			t.Fatal(err)
		}
		r := page.Refresh
		got := live.Cursor{Position: live.Position{Tx: r.Tx, ID: r.ID}, At: r.At, History: r.History, WAL: r.WAL, Synchronous: r.Synchronous}
		if got.Position != want.Position || got.History != want.History || got.Synchronous != want.Synchronous ||
			got.WAL == 0 || got.WAL > want.WAL || got.At.After(want.At) || want.At.Sub(got.At) > time.Minute {
			t.Errorf("%s: the page's refresh cursor %+v; live.Now's right after %+v", user, got, want)
		}
	}
	if _, err := store.Page(ctx, feed.Query{UserID: "ivy", Refresh: true, After: &feed.Cursor{CreatedAt: time.Now(), ID: 1}}); err == nil {
		t.Error("a refresh cursor after a cursor was read; want an error: it belongs to a first page")
	}
}

func TestARowCommittedAfterAFirstPageIsReturnedSinceItsRefreshCursor(t *testing.T) {
	// Not parallel: it holds a transaction open, which holds back what
	// another test's since read returns.
	pool := pgtest.Pool(t)
	ctx := context.Background()
	store := feed.NewStore(pool, nil)
	seed(t, pool, "jo", "before", 3, 3)
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := ingest.Ingest(ctx, open, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "late", "jo")}}); err != nil {
		t.Fatal(err)
	}
	page, err := store.Page(ctx, feed.Query{UserID: "jo", Refresh: true})
	if err != nil || len(page.Items) != 3 {
		t.Fatalf("first page = %d items, %v; want the three committed", len(page.Items), err)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	seed(t, pool, "jo", "after", 1, 1)
	r := page.Refresh
	changes, err := live.Since(ctx, pool, "jo", live.Cursor{Position: live.Position{Tx: r.Tx, ID: r.ID}, At: r.At, History: r.History, WAL: r.WAL, Synchronous: r.Synchronous}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var titles []string
	for _, n := range changes.Items {
		titles = append(titles, n.Title)
	}
	if fmt.Sprint(titles) != "[Export ready n 0]" { // the late one, then the one after
		t.Errorf("since the first page's refresh cursor: %v; want what it did not show, in commit order", titles)
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

// The tabs' pages and the counts read a few index ranges each, the weeks
// before the newest only where the watermarks leave rows of theirs; they
// must list exactly what the states' definitions select. Rows spread over
// twelve weeks, the watermarks asked while the newest lay weeks back, and
// random changes by item against them, some on rows of the oldest weeks:
// after every step each tab, paged through by 7, and each count, are
// those of the definition, read over every row.
func TestTabsAndCountsListExactlyWhatTheStatesDefine(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	store := feed.NewStore(pool, nil)
	const user = "ivy"
	var ids []feed.ID
	insert := func(at time.Time, title string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', $1)`, at); err != nil {
			t.Fatal(err)
		}
		var id feed.ID
		if err := pool.QueryRow(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
			VALUES ($1, $2, 't', 'c', 'p', $3, $3, $3) RETURNING created_at, id`, user, at, title).Scan(&id.CreatedAt, &id.Seq); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	now := time.Now()
	for i := range 120 { // twelve weeks back, ten a week
		insert(now.Add(-time.Duration(120-i)*17*time.Hour), fmt.Sprintf("old %d", i))
	}
	listed := func(sql string) []feed.ID {
		t.Helper()
		rows, err := pool.Query(ctx, sql, user)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (feed.ID, error) {
			var id feed.ID
			return id, r.Scan(&id.CreatedAt, &id.Seq)
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// check compares what store reads with the definitions.
	checkWith := func(step string, store *feed.Store) {
		t.Helper()
		for _, st := range []feed.Status{feed.All, feed.Unread, feed.Archived} {
			want := listed(feed.ReferenceTab[st])
			var got []feed.ID
			q := feed.Query{UserID: user, Status: st, Limit: 7}
			for {
				p, err := store.Page(ctx, q)
				if err != nil {
					t.Fatalf("%s: page of %s: %v", step, st, err)
				}
				for _, n := range p.Items {
					got = append(got, n.PublicID())
				}
				if !p.HasMore {
					break
				}
				q.After = &p.Next
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: tab %s lists %d rows, its definition %d:\n got %v\nwant %v", step, st, len(got), len(want), got, want)
			}
		}
		c, err := store.Counts(ctx, user, true)
		if err != nil {
			t.Fatalf("%s: counts: %v", step, err)
		}
		capped := func(n int) feed.Count { return feed.Count{N: min(n, feed.UnreadCap), Capped: n > feed.UnreadCap} }
		want := feed.Counts{Unread: capped(len(listed(feed.ReferenceTab[feed.Unread]))), Unseen: capped(len(listed(feed.ReferenceUnseen)))}
		archived := capped(len(listed(feed.ReferenceTab[feed.Archived])))
		if c.Unread != want.Unread || c.Unseen != want.Unseen || c.Archived == nil || *c.Archived != archived {
			t.Errorf("%s: counts %+v archived %+v; want %+v archived %+v", step, c, c.Archived, want, archived)
		}
	}
	// The same reads by a store whose clock stands weeks ahead: every row
	// and every watermark lies before the weeks it names, and is read
	// through the partitioned table.
	ahead := feed.NewStore(pool, clock.Frozen(time.Now().AddDate(0, 0, 30)))
	check := func(step string) {
		t.Helper()
		checkWith(step, store)
		checkWith(step+", read weeks ahead", ahead)
	}
	rnd := rand.New(rand.NewPCG(19, 32))
	check("before any change")
	ops := []struct {
		name string
		do   func(feed.ID) error
	}{
		{"read", func(id feed.ID) error { return store.MarkRead(ctx, user, id) }},
		{"unread", func(id feed.ID) error { return store.MarkUnread(ctx, user, id) }},
		{"archive", func(id feed.ID) error { return store.Archive(ctx, user, id) }},
		{"unarchive", func(id feed.ID) error { return store.Unarchive(ctx, user, id) }},
	}
	for step := range 60 {
		name := ""
		switch r := rnd.IntN(20); {
		case r == 0:
			_, _, err := store.MarkAllRead(ctx, user)
			if err != nil {
				t.Fatal(err)
			}
			name = "read-all"
		case r == 1:
			if _, _, err := store.MarkAllArchived(ctx, user); err != nil {
				t.Fatal(err)
			}
			name = "archive-all"
		case r == 2:
			insert(time.Now(), fmt.Sprintf("new %d", step))
			name = "a new one"
		case r == 4:
			// A row whose transaction began before a watermark and commits after it.
			open, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var id feed.ID
			if err := open.QueryRow(ctx, `INSERT INTO notifications (user_id, type, category, producer, idempotency_key, notification_key, title)
				VALUES ($1, 't', 'c', 'p', $2, $2, $2) RETURNING created_at, id`, user, fmt.Sprintf("late %d", step)).Scan(&id.CreatedAt, &id.Seq); err != nil {
				t.Fatal(err)
			}
			insert(time.Now(), fmt.Sprintf("newer %d", step))
			mark := store.MarkAllRead
			if rnd.IntN(2) == 0 {
				mark = store.MarkAllArchived
			}
			if _, _, err := mark(ctx, user); err != nil {
				t.Fatal(err)
			}
			if err := open.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
			name = "a late one"
		case r == 3:
			// The seen position at a random row's place in commit order.
			id := ids[rnd.IntN(len(ids))]
			if _, err := pool.Exec(ctx, `INSERT INTO stream_seen (user_id, through_tx, through_id, through_at)
				SELECT user_id, tx, id, created_at FROM notifications WHERE created_at = $1 AND id = $2
				ON CONFLICT (user_id) DO UPDATE SET through_tx = EXCLUDED.through_tx, through_id = EXCLUDED.through_id, through_at = EXCLUDED.through_at`, id.CreatedAt, id.Seq); err != nil {
				t.Fatal(err)
			}
			name = "seen"
		default:
			op := ops[rnd.IntN(len(ops))]
			// Most changes on the oldest weeks, the rest anywhere.
			i := rnd.IntN(len(ids))
			if rnd.IntN(2) == 0 {
				i = rnd.IntN(20)
			}
			if err := op.do(ids[i]); err != nil {
				t.Fatal(err)
			}
			name = fmt.Sprintf("%s of row %d", op.name, i)
		}
		check(fmt.Sprintf("step %d (%s)", step, name))
	}
}
