package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/push"
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

// passUntilNone runs f's passes until one moves nothing; safe in a goroutine.
func passUntilNone(t *testing.T, f *schedule.Firer) {
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
	if n := e.fire(); n != 2 {
		t.Fatalf("moved %d scheduled rows at send_at; want the 2 of the event not cancelled", n)
	}
	if n := e.count(`SELECT count(*) FROM notifications WHERE idempotency_key = 'cancel-me'`); n != 0 {
		t.Errorf("a cancelled event made %d notifications", n)
	}
	if n := e.count(`SELECT count(*) FROM notifications WHERE idempotency_key = 'fires'`); n != 2 {
		t.Errorf("the other scheduled event made %d notifications, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM scheduled_notifications WHERE cancelled_at IS NULL`); n != 0 {
		t.Errorf("%d scheduled rows not cancelled kept after send_at", n)
	}
	if r, _ := ingest.Cancel(ctx, e.pool, "p", "fires", e.clock.Now()); r.Outcome != ingest.CancelTooLate {
		t.Errorf("cancel after it fired: %v, want already sent", r.Outcome)
	}
}

// A producer retrying a cancel that timed out, or a relay forwarding its
// DELETE again after a crash, may land after send_at: it is answered what
// the first was (cancelled, nothing more stopped, the first time), for as
// long as the key is kept, not "already sent" for an event nothing sent.
func TestARepeatedCancelAfterSendAtAnswersTheFirstCancellation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	at := e.clock.Now().Add(time.Minute)
	e.ingest("retried", sendAt(at))
	first, err := ingest.Cancel(ctx, e.pool, "p", "retried", e.clock.Now())
	if err != nil || first.Outcome != ingest.Cancelled || first.Stopped != 2 {
		t.Fatalf("first cancel: %+v, %v; want cancelled stopping 2", first, err)
	}
	e.clock.Advance(2 * time.Minute)
	e.fire()
	for range 2 {
		again, err := ingest.Cancel(ctx, e.pool, "p", "retried", e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		if again.Outcome != ingest.Cancelled || again.Stopped != 0 || !again.Cancelled.Equal(first.Cancelled) {
			t.Errorf("cancel again after send_at: %v stopping %d at %v; want cancelled stopping 0 at the first time %v",
				again.Outcome, again.Stopped, again.Cancelled, first.Cancelled)
		}
	}
	if n := e.count(`SELECT count(*) FROM notifications`); n != 0 {
		t.Errorf("%d notifications of a cancelled event", n)
	}
	if n := e.count(`SELECT count(*) FROM push_dispatches WHERE state = 'cancelled'`); n != 2 {
		t.Errorf("%d cancelled rows in the delivery log; want one per recipient, once", n)
	}
}

// ingestMany ingests one scheduled event for n recipients.
func (e *env) ingestMany(key string, n int, at time.Time) {
	e.t.Helper()
	rcpt := make([]string, n)
	for i := range rcpt {
		rcpt[i] = fmt.Sprintf("%q", fmt.Sprint("u", i))
	}
	ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"t","recipients":[%s],"title":"Launch",%s}`,
		key, strings.Join(rcpt, ","), sendAt(at)), "")
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := ingest.Ingest(context.Background(), e.pool, []ingest.Item{{Producer: "p", Event: ev}}); err != nil {
		e.t.Fatal(err)
	}
}

// One event's recipients are fired whole or cancelled whole: a cancel
// racing the firers (two replicas, each moving 50 rows a statement) either
// stops every recipient (200 cancelled) or none (409 already sent), and the
// delivery log and the feed agree with its answer.
func TestACancelRacingTheFirersStopsEveryRecipientOrNone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	other := e.newFirer(pgtest.Connect(t, e.url))
	const recipients, races = 1000, 30
	outcomes := map[ingest.CancelOutcome]int{}
	for i := range races {
		key := fmt.Sprint("launch-", i)
		e.ingestMany(key, recipients, e.clock.Now().Add(time.Second))
		e.clock.Advance(time.Second)
		var wg sync.WaitGroup
		for _, f := range []*schedule.Firer{e.firer, other} {
			wg.Go(func() { passUntilNone(t, f) })
		}
		var res ingest.CancelResult
		wg.Go(func() {
			var err error
			if res, err = ingest.Cancel(ctx, e.pool, "p", key, e.clock.Now()); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		e.fire()
		got := e.count(`SELECT count(*) FROM notifications WHERE idempotency_key = $1`, key)
		logged := e.count(`SELECT count(*) FROM push_dispatches d JOIN scheduled_notifications s ON s.id = d.notification_id
			WHERE d.state = 'cancelled' AND s.idempotency_key = $1`, key)
		switch {
		case res.Outcome == ingest.Cancelled && res.Stopped == recipients && got == 0 && logged == recipients:
		case res.Outcome == ingest.CancelTooLate && got == recipients && logged == 0:
		default:
			t.Fatalf("race %d split the event: cancel answered %v stopping %d, %d got it, %d cancelled in the log; want all %d stopped or none",
				i, res.Outcome, res.Stopped, got, logged, recipients)
		}
		outcomes[res.Outcome]++
	}
	t.Logf("%d races: %d cancelled, %d already sent", races, outcomes[ingest.Cancelled], outcomes[ingest.CancelTooLate])
}

// Three events due together (1, 1,000 and 1,000 recipients) with the
// default batch of 2,000: the firer moves whole events, so the third is not
// split at the batch's edge, and a cancel of it afterwards finds it sent.
func TestTheFirerNeverSplitsAnEventAtItsBatchEdge(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	f, err := schedule.New(schedule.Config{DB: e.pool, Clock: e.clock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	at := e.clock.Now().Add(time.Second)
	e.ingestMany("one", 1, at)
	e.ingestMany("first-thousand", 1000, at)
	e.ingestMany("second-thousand", 1000, at)
	e.clock.Advance(time.Second)
	n, _, err := f.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2001 {
		t.Errorf("the first pass moved %d rows; want all 2,001, whole events", n)
	}
	for key, want := range map[string]int{"one": 1, "first-thousand": 1000, "second-thousand": 1000} {
		if got := e.count(`SELECT count(*) FROM notifications WHERE idempotency_key = $1`, key); got != want {
			t.Errorf("%s: %d notifications after one pass; want %d", key, got, want)
		}
	}
	if r, _ := ingest.Cancel(ctx, e.pool, "p", "second-thousand", e.clock.Now()); r.Outcome != ingest.CancelTooLate {
		t.Errorf("cancel after the pass: %v; want already sent", r.Outcome)
	}
}

// A push.cancelled webhook names the event it stopped (producer, key,
// user), and no notification (a cancelled one never existed); the delivery
// log shows its title and category.
func TestACancelledPushSaysWhichEventWasCancelled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, events, secret) VALUES ('ep', 'https://hooks.example.com/', '{push.cancelled}', 'whsec_x')`); err != nil {
		t.Fatal(err)
	}
	e.ingest("to-cancel", sendAt(e.clock.Now().Add(time.Hour)))
	if r, err := ingest.Cancel(ctx, e.pool, "p", "to-cancel", e.clock.Now()); err != nil || r.Stopped != 2 {
		t.Fatalf("cancel: %+v, %v", r, err)
	}
	rows, err := e.pool.Query(ctx, `SELECT payload->'data' FROM webhook_deliveries WHERE type = 'push.cancelled' ORDER BY payload->'data'->>'user_id'`)
	if err != nil {
		t.Fatal(err)
	}
	bodies, err := pgx.CollectRows(rows, pgx.RowTo[map[string]any])
	if err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 2 {
		t.Fatalf("%d push.cancelled deliveries; want one per recipient", len(bodies))
	}
	for i, b := range bodies {
		want := map[string]any{"producer": "p", "idempotency_key": "to-cancel", "user_id": fmt.Sprint("u", i+1), "state": "cancelled", "notification_id": nil}
		for k, v := range want {
			if got, ok := b[k]; !ok || got != v {
				t.Errorf("push.cancelled %s = %v (present %v); want %v", k, got, ok, v)
			}
		}
	}
	page, err := push.Deliveries(ctx, e.pool, push.DeliveryQuery{State: push.StateCancelled})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 2 {
		t.Fatalf("%d cancelled rows in the delivery log; want 2", len(page.Data))
	}
	for _, d := range page.Data {
		if d.Title != "Reminder" || d.Category == "" || d.NotificationID != nil {
			t.Errorf("delivery log row: title %q, category %q, notification id %v; want the event's title and category and no id", d.Title, d.Category, d.NotificationID)
		}
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
		wg.Go(func() { passUntilNone(t, f) })
	}
	wg.Wait()
	if n := e.count(`SELECT count(*) FROM notifications`); n != 600 {
		t.Errorf("%d notifications; want 600, each once", n)
	}
	if n := e.count(`SELECT count(*) FROM (SELECT notification_key FROM notifications GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d notification keys fired twice", n)
	}
}
