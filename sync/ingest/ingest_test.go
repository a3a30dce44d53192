package ingest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestIngestPersistsOneNotificationPerRecipientOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	received := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	items := []ingest.Item{
		{Producer: "billing", Event: eventtest.Event(t, "inv:1", "u1", "u2"), ReceivedAt: received},
		{Producer: "billing", Event: eventtest.Event(t, "inv:2", "u1")},
		{Producer: "search", Event: eventtest.Event(t, "inv:1", "u1")}, // same key, other producer: its own notification
	}
	res, err := ingest.Ingest(ctx, pool, items)
	if err != nil {
		t.Fatal(err)
	}
	want := []ingest.Result{{Outcome: event.Accepted, Created: 2}, {Outcome: event.Accepted, Created: 1}, {Outcome: event.Accepted, Created: 1}}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("result %d = %+v, want %+v", i, res[i], want[i])
		}
	}
	again, err := ingest.Ingest(ctx, pool, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again {
		if r.Outcome != event.Duplicate || r.Created != 0 {
			t.Errorf("re-sent event %d = %+v, want duplicate", i, r)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 4 {
		t.Errorf("notifications = %d, want 4", n)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM push_queue"); n != 4 {
		t.Errorf("push_queue = %d, want 4", n)
	}
	var title, category, producer, key string
	var data map[string]any
	var gotReceived time.Time
	err = pool.QueryRow(ctx, `SELECT title, category, producer, idempotency_key, data, received_at FROM notifications WHERE user_id = 'u2'`).
		Scan(&title, &category, &producer, &key, &data, &gotReceived)
	if err != nil {
		t.Fatal(err)
	}
	if title != "Export ready" || category != "jobs" || producer != "billing" || key != "inv:1" || data["rows"] != float64(12345) || !gotReceived.Equal(received) {
		t.Errorf("row = %q %q %q %q %v %v", title, category, producer, key, data, gotReceived)
	}
}

func TestIngestOfAReusedKeyWithAnotherRequestWritesNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if _, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "k", "u1")}}); err != nil {
		t.Fatal(err)
	}
	other := eventtest.Event(t, "k", "u1", "u2") // same key, another request (one more recipient)
	res, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "p", Event: other}, {Producer: "p", Event: eventtest.Event(t, "k2", "u1")}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != event.Conflict || res[1].Outcome != event.Accepted {
		t.Fatalf("results = %+v; want conflict, then new", res)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications WHERE user_id = 'u2'"); n != 0 {
		t.Errorf("the conflicting event wrote %d notifications for its new recipient", n)
	}
}

func TestAReusedKeyIsAConflictWhateverItsRecipients(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if _, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "k", "u1")}}); err != nil {
		t.Fatal(err)
	}
	res, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, "k", "u2")}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != event.Conflict {
		t.Errorf("same key, disjoint recipients = %v; want conflict", res[0].Outcome)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications WHERE user_id = 'u2'"); n != 0 {
		t.Errorf("the conflicting event wrote %d notifications", n)
	}
}

func TestRacingRequestsForOneKeyMakeOneWinnerAndConflicts(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for round := range 20 {
		key := fmt.Sprintf("race-%d", round)
		results := make([]event.Outcome, 4)
		var wg sync.WaitGroup
		for i := range results {
			wg.Go(func() {
				// Four different requests under one key, each to its own recipient.
				res, err := ingest.Ingest(context.Background(), pool, []ingest.Item{{Producer: "p", Event: eventtest.Event(t, key, fmt.Sprintf("u%d", i))}})
				if err != nil {
					t.Error(err)
					return
				}
				results[i] = res[0].Outcome
			})
		}
		wg.Wait()
		var news, conflicts int
		for _, o := range results {
			switch o {
			case event.Accepted:
				news++
			case event.Conflict:
				conflicts++
			}
		}
		if news != 1 || conflicts != 3 {
			t.Fatalf("round %d: outcomes %v; want one new and three conflicts", round, results)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 20 {
		t.Errorf("notifications = %d, want one per key", n)
	}
}

func TestAKeyTwiceInOneBatchIsAnsweredAgainstItsFirstRequest(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	same := eventtest.Event(t, "twice", "u1", "u2")
	other := eventtest.Event(t, "twice", "u2", "u3")
	res, err := ingest.Ingest(context.Background(), pool, []ingest.Item{{Producer: "p", Event: same}, {Producer: "p", Event: same}, {Producer: "p", Event: other}})
	if err != nil {
		t.Fatal(err)
	}
	want := []event.Outcome{event.Accepted, event.Duplicate, event.Conflict}
	for i := range want {
		if res[i].Outcome != want[i] {
			t.Errorf("item %d = %v, want %v", i, res[i].Outcome, want[i])
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 2 {
		t.Errorf("notifications = %d, want the first request's 2", n)
	}
}

func TestConcurrentOverlappingBatchesMakeOneRowPerKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	const events = 300
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			var items []ingest.Item
			for i := range events {
				// Each worker sends every event, in its own order.
				j := (i*7 + w*53) % events
				items = append(items, ingest.Item{Producer: "p", Event: eventtest.Event(t, fmt.Sprintf("k%d", j), "u1", fmt.Sprintf("u%d", j%5+2))})
				if len(items) == 50 {
					if _, err := ingest.Ingest(context.Background(), pool, items); err != nil {
						t.Error(err)
						return
					}
					items = nil
				}
			}
		})
	}
	wg.Wait()
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != events*2 {
		t.Errorf("notifications = %d, want %d", n, events*2)
	}
}

func TestIngestOfAnEmptyBatchDoesNothing(t *testing.T) {
	t.Parallel()
	res, err := ingest.Ingest(context.Background(), nil, nil)
	if err != nil || res != nil {
		t.Errorf("Ingest(nil) = %v, %v", res, err)
	}
}

var _ ingest.DB = (*pgx.Conn)(nil)
