package lifecycle_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/lifecycle"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ingestEvents(t *testing.T, pool *pgxpool.Pool, prefix string, n int) []ingest.Result {
	t.Helper()
	var items []ingest.Item
	for i := range n {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"%s-%d","type":"t","recipients":["u1","u2"]}`, prefix, i), "")
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, ingest.Item{Producer: "p", Event: ev})
	}
	res, err := ingest.Ingest(context.Background(), pool, items)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func pass(t *testing.T, pool *pgxpool.Pool, at time.Time) lifecycle.Report {
	t.Helper()
	rep, err := lifecycle.Run(context.Background(), lifecycle.Config{DB: pool, Retention: 90 * 24 * time.Hour, Clock: clock.Frozen(at)})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Ran {
		t.Fatal("the pass was skipped")
	}
	return rep
}

func TestAPassDropsWhatIsPastRetentionAndNothingElse(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ingestEvents(t, pool, "today", 10)
	now := time.Now()

	soon := pass(t, pool, now.AddDate(0, 0, 3))
	if len(soon.Dropped) != 0 || soon.KeysExpired != 0 {
		t.Errorf("a pass 3 days on dropped %v and expired %d keys; want nothing", soon.Dropped, soon.KeysExpired)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 20 {
		t.Errorf("notifications after a pass 3 days on = %d, want 20", n)
	}
	// Inside the key window a re-sent batch is still a duplicate.
	for _, r := range ingestEvents(t, pool, "today", 10) {
		if r.Outcome != event.Duplicate {
			t.Fatalf("re-sent event = %v, want duplicate", r.Outcome)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 20 {
		t.Errorf("notifications after the re-send = %d, want 20", n)
	}

	later := pass(t, pool, now.AddDate(0, 0, 100))
	thisWeek := "notifications_" + weekStart(now).Format("20060102")
	if !contains(later.Dropped, thisWeek) || later.RowsDropped < 0 {
		t.Errorf("a pass 100 days on dropped %v; want this week's %s", later.Dropped, thisWeek)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 0 {
		t.Errorf("notifications after a pass 100 days on = %d, want 0", n)
	}
	if later.KeysExpired != 30 { // 10 event keys and 20 recipient keys
		t.Errorf("keys expired = %d, want 30", later.KeysExpired)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Errorf("keys left = %d, want 0", n)
	}
	ahead := weekStart(now.AddDate(0, 0, 100+28))
	if !contains(later.Created, "notifications_"+ahead.Format("20060102")) {
		t.Errorf("created %v; want partitions ahead of the pass's time up to %s", later.Created, ahead.Format(time.DateOnly))
	}
	var window string
	if err := pool.QueryRow(context.Background(), `SELECT value FROM spoolcast_settings WHERE name = 'key_window'`).Scan(&window); err != nil || window != (7*24*time.Hour).String() {
		t.Errorf("recorded key window = %q, %v", window, err)
	}
}

func TestIngestNeverFailsForLackOfAPartition(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	// As if maintenance had not run for weeks: no partition holds today.
	parts, err := lifecycle.Partitions(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if _, err := pool.Exec(context.Background(), "DROP TABLE "+p.Name); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	ingestEvents(t, pool, "orphan", 5)
	first := time.Since(start)
	start = time.Now()
	ingestEvents(t, pool, "next", 5)
	t.Logf("ingest that created its partition: %s; the next: %s", first.Round(time.Microsecond), time.Since(start).Round(time.Microsecond))
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 20 {
		t.Errorf("notifications = %d, want 20", n)
	}
	if parts, _ := lifecycle.Partitions(context.Background(), pool); len(parts) != 1 || parts[0].Table != "notifications" {
		t.Errorf("partitions = %v; want this week's, created on demand", parts)
	}
}

func TestReplicasPassingAtOnceMakeOnePass(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ingestEvents(t, pool, "k", 5)
	// Measured from the week's start, not from now: 90 days' retention
	// then ends inside next week on any weekday, so exactly this week's
	// partition of each table is past it.
	at := weekStart(time.Now()).AddDate(0, 0, 98).Add(12 * time.Hour)
	var wg sync.WaitGroup
	reps := make([]lifecycle.Report, 4)
	errs := make([]error, 4)
	hold := make(chan struct{})
	for i := range reps {
		wg.Go(func() {
			<-hold
			reps[i], errs[i] = lifecycle.Run(context.Background(), lifecycle.Config{DB: pool, Retention: 90 * 24 * time.Hour, Clock: clock.Frozen(at)})
		})
	}
	close(hold)
	wg.Wait()
	ran, expired, dropped := 0, int64(0), 0
	for i := range reps {
		if errs[i] != nil {
			t.Errorf("replica %d: %v", i, errs[i])
		}
		if reps[i].Ran {
			ran++
		}
		expired += reps[i].KeysExpired
		dropped += len(reps[i].Dropped)
	}
	if ran < 1 || expired != 15 || dropped != len(lifecycle.Partitioned) {
		t.Errorf("%d passes ran, %d keys expired, %d partitions dropped in all; want the 15 keys and this week's partition of each table once", ran, expired, dropped)
	}
}

func weekStart(t time.Time) time.Time {
	t = t.UTC()
	d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// A cancelled scheduled event's rows are kept while the delivery log keeps
// its cancelled rows (retention, here 90 days), then deleted; rows still
// waiting for their send_at are never touched.
func TestAPassDeletesCancelledScheduledRowsOnlyPastRetention(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	now := time.Now()
	for _, key := range []string{"cancelled", "waiting"} {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"t","recipients":["a","b"],"topics":["later"],"title":"Later","send_at":%q}`,
			key, now.Add(time.Hour).UTC().Format(time.RFC3339Nano)), "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "p", Event: ev}}); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := ingest.Cancel(ctx, pool, "p", "cancelled", now); err != nil || r.Stopped != 2 {
		t.Fatalf("cancel: %+v, %v", r, err)
	}
	if rep := pass(t, pool, now.AddDate(0, 0, 30)); rep.CancelledExpired != 0 || rep.FanoutsExpired != 0 {
		t.Errorf("a pass 30 days on deleted %d cancelled rows and %d fan-outs; want none inside retention", rep.CancelledExpired, rep.FanoutsExpired)
	}
	if rep := pass(t, pool, now.AddDate(0, 0, 100)); rep.CancelledExpired != 2 || rep.FanoutsExpired != 1 {
		t.Errorf("a pass 100 days on deleted %d cancelled rows and %d fan-outs; want 2 and the cancelled event's one", rep.CancelledExpired, rep.FanoutsExpired)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM topic_fanouts WHERE idempotency_key = 'waiting'`); n != 1 {
		t.Errorf("%d fan-outs of the event still waiting; want 1, untouched", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM scheduled_notifications WHERE idempotency_key = 'waiting'`); n != 2 {
		t.Errorf("%d rows of the event still waiting; want 2, untouched", n)
	}
}

// A stream ticket never used is deleted once it has expired; one still
// valid is kept for its use.
func TestAPassDeletesStreamTicketsThatExpiredUnused(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	now := time.Now()
	// Two tickets issued now, valid 30 s (as live.Tickets issues them).
	if _, err := pool.Exec(context.Background(), `INSERT INTO stream_tickets (hash, user_id, expires_at)
		VALUES ('\x01', 'u1', $1), ('\x02', 'u2', $1)`, now.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if rep := pass(t, pool, now.Add(15*time.Second)); rep.StreamTicketsExpired != 0 {
		t.Errorf("a pass while the tickets are valid deleted %d; want none", rep.StreamTicketsExpired)
	}
	if rep := pass(t, pool, now.Add(31*time.Second)); rep.StreamTicketsExpired != 2 {
		t.Errorf("a pass after the tickets expired deleted %d; want 2", rep.StreamTicketsExpired)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM stream_tickets`); n != 0 {
		t.Errorf("%d tickets left", n)
	}
}
