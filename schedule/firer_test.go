package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/schedule"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type env struct {
	t     *testing.T
	url   string
	pool  *pgxpool.Pool
	clock *clock.Fake
	firer *schedule.Firer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, url: pgtest.DB(t), clock: clock.NewFake(time.Now())}
	e.pool = pgtest.Connect(t, e.url)
	e.firer = e.newFirer(e.pool)
	return e
}

func (e *env) newFirer(pool *pgxpool.Pool) *schedule.Firer {
	e.t.Helper()
	f, err := schedule.New(schedule.Config{DB: pool, Clock: e.clock, BatchSize: 50, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		e.t.Fatal(err)
	}
	return f
}

func (e *env) ingest(key, members string) event.Outcome {
	e.t.Helper()
	ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"t","recipients":["u1","u2"],"title":"Reminder",%s}`, key, members), "")
	if err != nil {
		e.t.Fatal(err)
	}
	res, err := ingest.Ingest(context.Background(), e.pool, []ingest.Item{{Producer: "p", Event: ev}})
	if err != nil {
		e.t.Fatal(err)
	}
	return res[0].Outcome
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	return pgtest.Count(e.t, e.pool, query, args...)
}

func (e *env) fire() int {
	e.t.Helper()
	total := 0
	for {
		n, _, err := e.firer.Pass(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		total += n
		if n == 0 {
			return total
		}
	}
}

func sendAt(t time.Time) string {
	return fmt.Sprintf(`"send_at":%q`, t.UTC().Format(time.RFC3339Nano))
}

func TestAScheduledNotificationExistsOnlyFromItsSendAtAndOnlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	at := e.clock.Now().Add(2 * time.Hour)
	if o := e.ingest("reminder", sendAt(at)); o != event.Accepted {
		t.Fatalf("scheduled event: %v, want accepted", o)
	}
	if n := e.count(`SELECT count(*) FROM notifications`); n != 0 {
		t.Fatalf("%d notifications before send_at; want none", n)
	}
	if n := e.count(`SELECT count(*) FROM push_queue`); n != 0 {
		t.Fatalf("%d pushes queued before send_at; want none", n)
	}
	// A retry before send_at is a duplicate.
	if o := e.ingest("reminder", sendAt(at)); o != event.Duplicate {
		t.Errorf("retry before send_at: %v, want duplicate", o)
	}
	e.clock.Advance(2*time.Hour - time.Second)
	if n := e.fire(); n != 0 {
		t.Fatalf("fired %d a second before send_at", n)
	}
	e.clock.Advance(time.Second)
	if n := e.fire(); n != 2 {
		t.Fatalf("fired %d at send_at; want one per recipient", n)
	}
	if n := e.count(`SELECT count(*) FROM notifications WHERE title = 'Reminder'`); n != 2 {
		t.Errorf("%d notifications after send_at; want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM push_queue`); n != 2 {
		t.Errorf("%d pushes queued after send_at; want 2", n)
	}
	// The notification appears at the top of the feed: created when it fired.
	if n := e.count(`SELECT count(*) FROM notifications WHERE created_at < now() - interval '1 minute'`); n != 0 {
		t.Errorf("%d fired notifications carry an old created_at", n)
	}
	// A retry after send_at, and far past the key window's start, is a duplicate too.
	if o := e.ingest("reminder", sendAt(at)); o != event.Duplicate {
		t.Errorf("retry after send_at: %v, want duplicate", o)
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE claimed_at < $1`, at.Add(-time.Minute)); n != 0 {
		t.Errorf("%d keys of the scheduled event count from ingest; they count from send_at, so they outlive the key window after it", n)
	}
	if n := e.fire(); n != 0 {
		t.Errorf("fired %d again", n)
	}
}

func TestACancellationStopsAScheduledEventAndSaysWhatItFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	at := e.clock.Now().Add(time.Hour)
	e.ingest("cancel-me", sendAt(at))
	e.ingest("immediate", `"title":"Now"`)
	e.ingest("fires", sendAt(at))
	for _, tc := range []struct {
		key     string
		want    ingest.CancelOutcome
		stopped int
	}{
		{"cancel-me", ingest.Cancelled, 2},
		{"cancel-me", ingest.Cancelled, 0}, // again: the same answer, nothing more
		{"immediate", ingest.CancelTooLate, 0},
		{"never-sent", ingest.CancelUnknown, 0},
	} {
		r, err := ingest.Cancel(ctx, e.pool, "p", tc.key, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		if r.Outcome != tc.want || r.Stopped != tc.stopped {
			t.Errorf("cancel %s: %v stopping %d; want %v stopping %d", tc.key, r.Outcome, r.Stopped, tc.want, tc.stopped)
		}
	}
	if r, _ := ingest.Cancel(ctx, e.pool, "other-producer", "cancel-me", e.clock.Now()); r.Outcome != ingest.CancelUnknown {
		t.Errorf("another producer's cancel: %v; keys are scoped per producer", r.Outcome)
	}
	if n := e.count(`SELECT count(*) FROM push_dispatches WHERE state = 'cancelled'`); n != 2 {
		t.Errorf("%d cancelled rows in the delivery log; want one per recipient", n)
	}
	e.clock.Advance(time.Hour)
	if n := e.fire(); n != 4 {
		t.Fatalf("moved %d scheduled rows at send_at; want 4 (2 fired, 2 cancelled dropped)", n)
	}
	if n := e.count(`SELECT count(*) FROM notifications WHERE idempotency_key = 'cancel-me'`); n != 0 {
		t.Errorf("a cancelled event made %d notifications", n)
	}
	if n := e.count(`SELECT count(*) FROM notifications WHERE idempotency_key = 'fires'`); n != 2 {
		t.Errorf("the other scheduled event made %d notifications, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM scheduled_notifications`); n != 0 {
		t.Errorf("%d scheduled rows kept after send_at", n)
	}
	if r, _ := ingest.Cancel(ctx, e.pool, "p", "fires", e.clock.Now()); r.Outcome != ingest.CancelTooLate {
		t.Errorf("cancel after it fired: %v, want already sent", r.Outcome)
	}
}

func TestFirersOnManyReplicasFireEachScheduledNotificationOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	at := e.clock.Now().Add(time.Minute)
	for i := range 300 {
		e.ingest(fmt.Sprint("k", i), sendAt(at))
	}
	e.clock.Advance(time.Minute)
	var wg sync.WaitGroup
	for range 4 {
		f := e.newFirer(pgtest.Connect(t, e.url))
		wg.Go(func() {
			for {
				n, _, err := f.Pass(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if n := e.count(`SELECT count(*) FROM notifications`); n != 600 {
		t.Errorf("%d notifications; want 600, each once", n)
	}
	if n := e.count(`SELECT count(*) FROM (SELECT notification_key FROM notifications GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d notification keys fired twice", n)
	}
}
