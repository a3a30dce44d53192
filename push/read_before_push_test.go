package push_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/push"
)

// A push that comes due for a notification the user already read or
// archived (on any device; one by one or by read-all) is not sent: its
// banner would never be cleared, since clears are written for pushes sent
// before the read. One marked unread again after a read-all is unread, and
// pushed.
func TestAPushDueForANotificationReadOrArchivedIsNotSent(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	store := feed.NewStore(s.pool, nil)
	for _, u := range []string{"u-read", "u-archived", "u-read-all", "u-unread-again", "u-fresh"} {
		s.register(u, "ExponentPushToken["+u+"]")
	}
	s.ingest("k1", "news", "u-read", "u-archived", "u-read-all", "u-unread-again", "u-fresh")
	ids := map[string]feed.ID{}
	rows, err := s.pool.Query(ctx, `SELECT user_id, created_at, id FROM notifications`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var u string
		var id feed.ID
		if err := rows.Scan(&u, &id.CreatedAt, &id.Seq); err != nil {
			t.Fatal(err)
		}
		ids[u] = id
	}
	rows.Close()
	// Dealt with on another device before the dispatcher's pass.
	if err := store.MarkRead(ctx, "u-read", ids["u-read"]); err != nil {
		t.Fatal(err)
	}
	if err := store.Archive(ctx, "u-archived", ids["u-archived"]); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"u-read-all", "u-unread-again"} {
		if _, ok, err := store.MarkAllRead(ctx, u); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if err := store.MarkUnread(ctx, "u-unread-again", ids["u-unread-again"]); err != nil {
		t.Fatal(err)
	}
	s.drain()

	pushed := map[string]bool{}
	for _, m := range s.fake.Messages() {
		pushed[m.To] = true
	}
	for u, want := range map[string]bool{"u-read": false, "u-archived": false, "u-read-all": false, "u-unread-again": true, "u-fresh": true} {
		if got := pushed["ExponentPushToken["+u+"]"]; got != want {
			t.Errorf("%s's phone pushed: %v, want %v", u, got, want)
		}
	}
	var why string
	if err := s.pool.QueryRow(ctx, `SELECT error FROM push_dispatches WHERE user_id = 'u-read' AND state = $1`, push.StateSuppressed).Scan(&why); err != nil {
		t.Fatalf("u-read's dispatch: %v; want suppressed, saying why", err)
	}
	if want := "read or archived before its push was due"; len(why) < len(want) || why[:len(want)] != want {
		t.Errorf("u-read's dispatch suppressed because %q", why)
	}
	if got := s.states(); got[push.StateSuppressed] != 3 {
		t.Errorf("states %v; want 3 suppressed", got)
	}
}

// A notification read while its push is on its way to the provider (its
// dispatch not yet recorded sent, so the read's trigger wrote no clear)
// gets its clear from the record of the push: the banner comes down.
func TestAReadWhileThePushIsInFlightStillClearsItsBanner(t *testing.T) {
	t.Parallel()
	s := newClearStack(t, true)
	ctx := context.Background()
	s.emit(`{"idempotency_key":"inflight","type":"t","category":"c","recipients":["u1"],"title":"T"}`)
	id := s.ids()[0]
	var once sync.Once
	s.fake.SetOnAnswer(func(endpoint string) {
		if endpoint == "send" {
			once.Do(func() {
				if err := s.store.MarkRead(ctx, "u1", id); err != nil {
					t.Error(err)
				}
			})
		}
	})
	s.drain()
	testsignal.Eventually(t, "the pushes to be recorded", 10*time.Second, func() bool {
		return pgtest.Count(t, s.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'queued'`) == 0
	})
	racePasses(t, 2, s.dispatcher)
	if got := s.expoClears()[phone]; len(got) != 1 || len(got[0]) != 1 || got[0][0] != id.String() {
		t.Errorf("the phone got clears %v; want one naming %s, read while its push was in flight", got, id)
	}
}
