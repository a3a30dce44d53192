package forward_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/forward"
)

// TestForwardingAndTheFeedWorkThroughPgBouncerInTransactionMode runs the
// forward path and feed reads through PgBouncer 1.18-style transaction pooling,
// where a named prepared statement would not survive between transactions.
func TestForwardingAndTheFeedWorkThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.DB(t)
	bounced := pgtest.PgBouncer(t, dbURL)
	ctx := context.Background()
	pool, err := pgpool.New(ctx, pgpool.Config{URL: bounced, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	direct := pgtest.Connect(t, dbURL)

	sp, err := spool.Open(ctx, spool.Config{Path: filepath.Join(t.TempDir(), "spool.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close(ctx)
	for i := range 1500 {
		ev := eventtest.Event(t, fmt.Sprintf("bounced-%d", i), "alice")
		if _, err := sp.Claim(ctx, spool.Entry{Producer: "p", Key: ev.IdempotencyKey, Hash: ev.Hash(), Payload: ev.Canonical()}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := forward.New(forward.Config{Spool: sp, DB: pool, BatchSize: 100, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx)
	testsignal.Eventually(t, "the spool to drain through PgBouncer", 60*time.Second, func() bool {
		next, err := sp.NextBatch(ctx, 0, spool.BatchLimit{Rows: 1})
		return err == nil && len(next) == 0
	})
	if err := f.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, direct, "SELECT count(*) FROM notifications"); n != 1500 {
		t.Errorf("notifications = %d, want 1500", n)
	}

	store := feed.NewStore(pool, nil)
	seen := 0
	var after *feed.Cursor
	for {
		page, err := store.Page(ctx, feed.Query{UserID: "alice", Limit: 100, After: after})
		if err != nil {
			t.Fatalf("feed page through PgBouncer: %v", err)
		}
		seen += len(page.Items)
		if !page.HasMore {
			break
		}
		after = &page.Next
	}
	if seen != 1500 {
		t.Errorf("paged %d notifications through PgBouncer, want 1500", seen)
	}
	if n, _, err := store.UnreadCount(ctx, "alice"); err != nil || n != 100 {
		t.Errorf("unread count through PgBouncer = %d, %v", n, err)
	}
}
