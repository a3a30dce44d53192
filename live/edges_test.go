package live_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// outlast waits until Postgres's clock is past every created_at of user's
// notifications by more than d: the hold has lasted longer than the reads'
// look-back.
func outlast(t *testing.T, pool *pgxpool.Pool, user string, d time.Duration) {
	t.Helper()
	testsignal.Eventually(t, "the hold to outlast the look-back", 30*time.Second, func() bool {
		var past bool
		err := pool.QueryRow(context.Background(), `SELECT now() - max(created_at) > $2::interval FROM notifications WHERE user_id = $1`, user, d).Scan(&past)
		return err == nil && past
	})
}

// While a foreign transaction holds the horizon for longer than the reads
// look back, rows that committed at the start of the hold are still
// streamed when it ends, live and to a resume whose cursor was made during
// the hold; and the reads while it holds fetch nothing they drop. Not
// parallel: the hold is cluster-wide and would delay the other tests' frames.
func TestRowsCommittedDuringALongForeignTransactionAreStreamedWhenItEnds(t *testing.T) {
	const slack = 2 * time.Second
	counted := &countingDB{}
	s := newStack(t, func(c *live.Config) {
		live.SetTxSlack(c, slack)
		counted.DB = c.DB
		c.DB = counted
	})
	c := s.dial("u1", "")
	_, before := s.ready(c)

	release := pgtest.HoldOpen(t, s.url, `SELECT pg_current_xact_id()`) // a forgotten session holding an xid
	s.ingest(s.pool, items(t, "held", "u1", 50))
	outlast(t, s.pool, "u1", 2*slack)
	// A resume during the hold: nothing yet, and a cursor that must still
	// find the held rows later.
	during := s.dial("u1", before)
	resumed, duringCursor := s.ready(during)
	if len(resumed) != 0 {
		t.Fatalf("a resume during the hold sent %d rows; they wait behind the open transaction", len(resumed))
	}
	during.Close()
	quiet(t, c, 300*time.Millisecond)
	counted.reset()
	quiet(t, c, 500*time.Millisecond) // ten polls while held
	if rows, reads := counted.rows.Load(), counted.reads.Load(); reads == 0 || rows > reads {
		t.Errorf("while held, %d reads fetched %d rows; want one state row a read, no held row fetched", reads, rows)
	}

	release()
	_ = ingest.WakeUp(context.Background(), s.pool)
	if got := next(t, c, "notification", 50); len(got) != 50 {
		t.Fatalf("live after the hold: %d of 50", len(got))
	}
	late := s.dial("u1", duringCursor)
	resumed, _ = s.ready(late)
	if len(resumed) != 50 {
		t.Errorf("a resume from the cursor made during the hold sent %d of 50", len(resumed))
	}
}

// countingDB counts the reads on the notifications table and the rows they
// fetched.
type countingDB struct {
	live.DB
	reads, rows atomic.Int64
}

func (c *countingDB) reset() { c.reads.Store(0); c.rows.Store(0) }

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := c.DB.Query(ctx, sql, args...)
	if err != nil || !strings.Contains(sql, "FROM notifications n") || strings.Contains(sql, "n.user_id = $1") {
		return rows, err
	}
	c.reads.Add(1)
	return &countingRows{Rows: rows, n: &c.rows}, nil
}

type countingRows struct {
	pgx.Rows
	n *atomic.Int64
}

func (r *countingRows) Next() bool {
	ok := r.Rows.Next()
	if ok {
		r.n.Add(1)
	}
	return ok
}

// A cursor from another cluster (a restore, a new cluster) is refused
// before the upgrade with invalid-cursor, which apps answer by starting over;
// so is a cursor naming a transaction this cluster never had. A fresh
// socket works.
func TestACursorFromAnotherClusterIsRefusedNotSilent(t *testing.T) {
	t.Parallel()
	a := newStack(t, nil)
	c := a.dial("u1", "")
	_, cursor := a.ready(c)
	a.ingest(a.pool, items(t, "a", "u1", 3))
	frame := next(t, c, "notification", 3)[2].Cursor

	other := pgtest.Cluster(t)
	if _, err := migrations.Up(context.Background(), other.URL, nil); err != nil {
		t.Fatal(err)
	}
	b := newStackOn(t, other.URL, nil)
	for _, after := range []string{cursor, frame} {
		if _, err := wsclient.Dial(context.Background(), b.base, "u1", after); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
			t.Errorf("a cursor of another cluster: %v; want HTTP 400 before the upgrade", err)
		}
	}
	parsed, err := live.ParseCursor(frame)
	if err != nil {
		t.Fatal(err)
	}
	// The version 1 form carries no history: the transaction id is checked.
	beyond := live.Cursor{Position: live.Position{Tx: parsed.Tx + 1<<32}, At: parsed.At}.String()
	if _, err := wsclient.Dial(context.Background(), b.base, "u1", beyond); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("a cursor beyond the cluster's transactions: %v; want HTTP 400", err)
	}
	if _, err := live.Since(context.Background(), b.pool, "u1", parsed, 10); err != live.ErrOtherHistory {
		t.Errorf("Since with a cursor of another cluster = %v, want ErrOtherHistory", err)
	}
	fresh := b.dial("u1", "")
	b.ready(fresh)
	b.ingest(b.pool, items(t, "b", "u1", 1))
	next(t, fresh, "notification", 1)
}

// switchableDB is one database, then another: a restore behind the same
// address.
type switchableDB struct{ cur atomic.Pointer[pgxpool.Pool] }

func (d *switchableDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.cur.Load().Query(ctx, sql, args...)
}

func (d *switchableDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.cur.Load().QueryRow(ctx, sql, args...)
}

func (d *switchableDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.cur.Load().Exec(ctx, sql, args...)
}

// When the database behind the reader changes history, the reader starts
// again at the new horizon and closes every socket; the app's cursor from
// before is refused, it starts over, and frames flow from the new database.
func TestTheReaderFollowsAChangeOfHistory(t *testing.T) {
	t.Parallel()
	first := pgtest.Pool(t)
	other := pgtest.Cluster(t)
	if _, err := migrations.Up(context.Background(), other.URL, nil); err != nil {
		t.Fatal(err)
	}
	second := pgtest.Connect(t, other.URL)
	db := &switchableDB{}
	db.cur.Store(first)
	s := newStackOn(t, pgtest.DB(t), func(c *live.Config) { c.DB = db })
	c := s.dial("u1", "")
	s.ready(c)
	s.ingest(first, items(t, "before", "u1", 1))
	cursor := next(t, c, "notification", 1)[0].Cursor

	db.cur.Store(second)
	for {
		if _, err := c.Next(10 * time.Second); err != nil {
			if code, ok := wsclient.Closed(err); !ok || code != live.StatusTryAgainLater {
				t.Fatalf("after the switch: %v; want the socket closed 1013", err)
			}
			break
		}
	}
	if _, err := wsclient.Dial(context.Background(), s.base, "u1", cursor); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("the old cursor after the switch: %v; want HTTP 400 (start over)", err)
	}
	fresh := s.dial("u1", "")
	s.ready(fresh)
	if _, err := ingest.Ingest(context.Background(), second, items(t, "after", "u1", 2)); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(context.Background(), second)
	if got := titles(t, next(t, fresh, "notification", 2)); got[0] != "after-0" || got[1] != "after-1" {
		t.Errorf("frames from the new database: %v", got)
	}
}

// Read-all marks read what had committed when it was asked. A notification
// whose transaction was open meanwhile arrives unread on the stream, and the
// read-all frame says it left it unread; a resume agrees.
func TestANotificationCommittedAfterReadAllStreamsUnread(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	ctx := context.Background()
	c := s.dial("u1", "")
	_, start := s.ready(c)
	// Begun first (older in feed order), it takes its transaction id last:
	// the newest, at or above the read-all snapshot's xmax.
	open, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := open.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	s.ingest(s.pool, items(t, "newest", "u1", 1))
	if _, err := ingest.Ingest(ctx, open, items(t, "late", "u1", 1)); err != nil {
		t.Fatal(err)
	}
	through, _, err := feed.NewStore(s.pool, nil).MarkAllRead(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, s.pool)
	got := next(t, c, "notification", 2)
	late, _ := got[1].Item()
	if late.Title != "late-0" || late.ReadAt != nil {
		t.Errorf("second frame %s; want the late one, unread", got[1].Raw)
	}
	read := next(t, c, "read", 1)[0]
	if read.Through != through.String() || len(read.Unread) != 1 || read.Unread[0] != late.ID {
		t.Errorf("read-all frame %s; want through %s leaving %s unread", read.Raw, through, late.ID)
	}
	again := s.dial("u1", start)
	resumed, _ := s.ready(again)
	var types []string
	for _, m := range resumed {
		types = append(types, m.Type)
		if m.Type == "read" {
			// The same place in the stream; the WAL position a cursor also
			// carries is that of the read that made it, and the cluster's
			// other writers move it between the live read and the resume.
			if m.Through != through.String() || !slices.Equal(m.Unread, []string{late.ID}) || streamPlace(t, m.Cursor) != streamPlace(t, read.Cursor) {
				t.Errorf("resumed read-all frame %s; want the live one's place, %s", m.Raw, read.Raw)
			}
			continue
		}
		it, _ := m.Item()
		if (it.ID == late.ID) != (it.ReadAt == nil) {
			t.Errorf("resumed %s: read at %v; want only the late one unread", it.Title, it.ReadAt)
		}
	}
	if !slices.Equal(types, []string{"notification", "notification", "read"}) {
		t.Errorf("resumed %v; want the two notifications, then the read-all, as they came live", types)
	}
}

// streamPlace is the place in the stream a cursor names: its position and
// the time of the row there.
func streamPlace(t *testing.T, cursor string) string {
	t.Helper()
	c, err := live.ParseCursor(cursor)
	if err != nil {
		t.Fatalf("cursor %q: %v", cursor, err)
	}
	return fmt.Sprintf("%d/%d@%s", c.Tx, c.ID, c.At.Format(time.RFC3339Nano))
}

// A burst to one user larger than a socket's queue no longer closes a
// socket that reads: it catches up from Postgres, and gets every
// notification once, in order.
func TestABurstLargerThanTheQueueCatchesUpInsteadOfClosing(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) { c.QueueFrames = 16 })
	c := s.dial("u1", "")
	s.ready(c)
	const n = 300
	for lo := 0; lo < n; lo += 100 {
		s.ingest(s.pool, items(t, "burst"+string(rune('a'+lo/100)), "u1", 100))
	}
	got := titles(t, next(t, c, "notification", n))
	seen := map[string]bool{}
	for _, title := range got {
		if seen[title] {
			t.Fatalf("%s twice", title)
		}
		seen[title] = true
	}
	if testutil.ToFloat64(s.metrics.SlowClosed()) != 0 {
		t.Error("a socket that reads was closed as slow")
	}
	if testutil.ToFloat64(s.metrics.CatchUps()) == 0 {
		t.Error("spoolcast_ws_catchups_total = 0; the burst overflowed a 16-frame queue")
	}
	quiet(t, c, 300*time.Millisecond)
}
