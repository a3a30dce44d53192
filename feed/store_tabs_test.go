package feed_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

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
