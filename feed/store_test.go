package feed_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
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
