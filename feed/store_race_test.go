package feed_test

import (
	"context"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

// A mark unread (unarchive) that comes after a read-all (archive-all) in
// the stream, though its statement ran while the read-all waited to record
// its watermark, leaves the notification unread (unarchived) in the tab
// and the count, as in its row: the later change decides everywhere
// (api.md, "Which change wins"). The tabs reach into older weeks for such
// rows by the watermark's hint, which the change wrote only when the
// watermark its snapshot saw covered the row: here none did, the read-all
// that does dropped no hint, and the notification, two weeks old, vanished
// from the unread tab and the count.
func TestAnUnreadRacingAReadAllStaysInTheUnreadTabAndCount(t *testing.T) {
	t.Parallel()
	for _, archive := range []bool{false, true} {
		pool := pgtest.Pool(t)
		ctx := context.Background()
		store := feed.NewStore(pool, nil)
		const user = "racer"
		markAll, markOne, unmarkOne, table := store.MarkAllRead, store.MarkRead, store.MarkUnread, "read_marks"
		if archive {
			markAll, markOne, unmarkOne, table = store.MarkAllArchived, store.Archive, store.Unarchive, "archive_marks"
		}
		// A first watermark over a notification of three weeks ago: it
		// does not cover the old one, a week newer.
		insert := func(key string, at time.Time) feed.ID {
			t.Helper()
			if _, err := weekly.Ensure(ctx, pool, "notifications", at); err != nil {
				t.Fatal(err)
			}
			var id feed.ID
			if err := pool.QueryRow(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
				VALUES ($1, $2, 't', 'c', 'p', $3, $3, $3) RETURNING created_at, id`, user, at, key).Scan(&id.CreatedAt, &id.Seq); err != nil {
				t.Fatal(err)
			}
			return id
		}
		insert("ancient", time.Now().Add(-22*24*time.Hour))
		if _, _, err := markAll(ctx, user); err != nil {
			t.Fatal(err)
		}
		x := insert("old", time.Now().Add(-15*24*time.Hour))
		if err := markOne(ctx, user, x); err != nil {
			t.Fatal(err)
		}

		// The watermark's row held: the second mark-all takes its place in
		// the stream, then waits to record itself.
		hold, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hold.Exec(ctx, `SELECT 1 FROM `+table+` WHERE user_id = $1 FOR UPDATE`, user); err != nil {
			t.Fatal(err)
		}
		marked := make(chan error, 1)
		go func() { _, _, err := markAll(ctx, user); marked <- err }()
		testsignal.Eventually(t, "the mark-all to wait for its watermark", 10*time.Second, func() bool {
			return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO `+table+`%'`) > 0
		})
		// After it in the stream: marked unread (unarchived).
		unmarked := make(chan error, 1)
		go func() { unmarked <- unmarkOne(ctx, user, x) }()
		time.Sleep(200 * time.Millisecond) // the change runs as far as it can before the watermark is written
		if err := hold.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-marked; err != nil {
			t.Fatal(err)
		}
		if err := <-unmarked; err != nil {
			t.Fatal(err)
		}

		status := feed.Unread
		if archive {
			status = feed.All
		}
		page, err := store.Page(ctx, feed.Query{UserID: user, Status: status})
		if err != nil {
			t.Fatal(err)
		}
		listed := false
		for _, n := range page.Items {
			listed = listed || n.ID == x.Seq
		}
		if !listed {
			t.Errorf("archive %v: the notification changed back after the mark-all is not in the %s tab (%d items)", archive, status, len(page.Items))
		}
		counts, err := store.Counts(ctx, user, true)
		if err != nil {
			t.Fatal(err)
		}
		if !archive && counts.Unread.N != 1 {
			t.Errorf("the unread count is %d; want 1, the notification marked unread after the read-all", counts.Unread.N)
		}
		if archive && counts.Archived.N != 1 {
			t.Errorf("the archived count is %d; want 1, all but the notification unarchived after the archive-all", counts.Archived.N)
		}
	}
}
