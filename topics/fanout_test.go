package topics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

// topicEvent is a valid event with key for recipients and topics; sendAt
// "" sends at once.
func topicEvent(t testing.TB, key string, recipients, topicNames []string, sendAt string) event.Event {
	t.Helper()
	body := map[string]any{"idempotency_key": key, "type": "launch", "title": "We launched", "recipients": recipients, "topics": topicNames}
	if sendAt != "" {
		body["send_at"] = sendAt
	}
	b, _ := json.Marshal(body)
	ev, err := event.Decode(b, "")
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func ingestOne(t testing.TB, pool *pgxpool.Pool, ev event.Event) ingest.Result {
	t.Helper()
	res, err := ingest.Ingest(context.Background(), pool, []ingest.Item{{Producer: "news", Event: ev}})
	if err != nil {
		t.Fatal(err)
	}
	return res[0]
}

func newFanout(t testing.TB, pool *pgxpool.Pool, cfg topics.FanoutConfig) *topics.Fanout {
	t.Helper()
	cfg.DB = pool
	if cfg.BatchTime == 0 {
		cfg.BatchTime = time.Hour // batches of BatchSize: the tests count them
	}
	f, err := topics.NewFanout(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func addMembers(t testing.TB, pool *pgxpool.Pool, topic string, ids []string) {
	t.Helper()
	s := topics.NewStore(pool)
	for len(ids) > 0 {
		n := min(len(ids), topics.MaxChange)
		if _, err := s.ChangeMembers(context.Background(), topic, ids[:n], nil); err != nil {
			t.Fatal(err)
		}
		ids = ids[n:]
	}
}

func fanoutOf(t testing.TB, pool *pgxpool.Pool, key, topic string) topics.FanoutStatus {
	t.Helper()
	list, _, err := topics.NewStore(pool).Fanouts(context.Background(), topics.FanoutFilter{IdempotencyKey: key, Topic: topic})
	if err != nil || len(list) != 1 {
		t.Fatalf("fan-outs of %s/%s: %+v, %v; want one", key, topic, list, err)
	}
	return list[0]
}

func TestATopicEventReachesEveryMemberOnceWithOneWebhook(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "all", users("m", 2500))
	addMembers(t, pool, "eu", users("m", 300)) // the first 300 are in both topics
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, events, secret) VALUES
			('ep_1', 'https://hooks.example/a', '{topic.fanout.completed,notification.created}', 'whsec_x')`); err != nil {
		t.Fatal(err)
	}
	// m00100 has a phone; the other members none.
	if _, err := pool.Exec(ctx, `INSERT INTO devices (token, user_id, platform) VALUES ('ExponentPushToken[m100]', 'm00100', 'ios')`); err != nil {
		t.Fatal(err)
	}
	// m00007 is a recipient as well as a member of both topics.
	ev := topicEvent(t, "launch-1", []string{"m00007", "outsider"}, []string{"all", "eu"}, "")
	if r := ingestOne(t, pool, ev); r.Outcome != event.Accepted || !r.Fanouts || r.Created != 2 {
		t.Fatalf("ingest = %+v; want accepted, 2 created, fan-outs added", r)
	}
	// Sent again: a duplicate, and no second fan-out.
	if r := ingestOne(t, pool, ev); r.Outcome != event.Duplicate || r.Fanouts {
		t.Fatalf("ingest again = %+v; want duplicate", r)
	}
	woken := 0
	f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 300, RangeSize: 1000, Written: func() { woken++ }})
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications WHERE idempotency_key = 'launch-1'`); n != 2501 {
		t.Errorf("%d notifications; want 2,501 (2,500 members and one outsider)", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM (SELECT user_id FROM notifications WHERE idempotency_key = 'launch-1' GROUP BY user_id HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d users got it more than once", n)
	}
	// Push work for the recipients, and of the members only for the one
	// with a device: the others' would go nowhere.
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM push_queue q JOIN notifications n ON n.id = q.notification_id WHERE n.idempotency_key = 'launch-1'`); n != 3 {
		t.Errorf("%d pushes queued; want 3 (two recipients, m00100)", n)
	}
	all, eu := fanoutOf(t, pool, "launch-1", "all"), fanoutOf(t, pool, "launch-1", "eu")
	if all.State != topics.StateCompleted || eu.State != topics.StateCompleted {
		t.Errorf("states %s, %s; want completed", all.State, eu.State)
	}
	if all.Members != 2500 || eu.Members != 300 || all.Ranges != 3 || all.RangesDone != 3 {
		t.Errorf("all: %+v; eu: %+v", all, eu)
	}
	// Whichever topic was written first, each member has one notification:
	// together 2,499 written beside the recipient, the rest skipped.
	if all.Written+eu.Written != 2499 || all.Skipped+eu.Skipped != 301 {
		t.Errorf("written %d+%d, skipped %d+%d; want 2,499 written, 301 skipped", all.Written, eu.Written, all.Skipped, eu.Skipped)
	}
	if woken == 0 {
		t.Error("no wake-up after the batches' commits")
	}
	// One completion webhook per topic, and notification.created only for
	// the recipients.
	var hooks []string
	rows, _ := pool.Query(ctx, `SELECT type || ' ' || coalesce(payload->'data'->>'topic', '') || ' ' || coalesce(payload->'data'->>'written', '')
		FROM webhook_deliveries ORDER BY type, payload->'data'->>'topic'`)
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		hooks = append(hooks, s)
	}
	if len(hooks) != 4 || hooks[0] != "notification.created  " || hooks[2] != fmt.Sprintf("topic.fanout.completed all %d", all.Written) ||
		hooks[3] != fmt.Sprintf("topic.fanout.completed eu %d", eu.Written) {
		t.Errorf("webhooks %q; want two notification.created and one topic.fanout.completed per topic", hooks)
	}
	// A Drain with nothing left does nothing.
	if did, err := f.Step(ctx); did || err != nil {
		t.Errorf("a step after the end: %v, %v", did, err)
	}
}

func TestMembersAreThoseSubscribedAtAcceptanceAndStillWhenWritten(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "club", users("c", 10))
	ev := topicEvent(t, "club-1", nil, []string{"club"}, "")
	ingestOne(t, pool, ev)
	var accepted time.Time
	if err := pool.QueryRow(ctx, `SELECT accepted_at FROM topic_fanouts`).Scan(&accepted); err != nil {
		t.Fatal(err)
	}
	// c00000 subscribed at the very instant of acceptance: a member.
	// c00001 a microsecond after: not one. c00002 left before its batch.
	// late-joiner joined after the event.
	if _, err := pool.Exec(ctx, `UPDATE topic_members SET subscribed_at = CASE user_id WHEN 'c00000' THEN $1::timestamptz ELSE $1::timestamptz + interval '1 microsecond' END
			WHERE topic = 'club' AND user_id IN ('c00000', 'c00001')`, accepted); err != nil {
		t.Fatal(err)
	}
	if _, err := topics.NewStore(pool).ChangeMembers(ctx, "club", []string{"late-joiner"}, []string{"c00002"}); err != nil {
		t.Fatal(err)
	}
	// c00009 leaves after its batch was written: it keeps its notification.
	f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 100})
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := topics.NewStore(pool).ChangeMembers(ctx, "club", nil, []string{"c00009"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, _ := pool.Query(ctx, `SELECT user_id FROM notifications WHERE idempotency_key = 'club-1' ORDER BY user_id`)
	for rows.Next() {
		var u string
		_ = rows.Scan(&u)
		got = append(got, u)
	}
	want := []string{"c00000", "c00003", "c00004", "c00005", "c00006", "c00007", "c00008", "c00009"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("reached %v; want %v", got, want)
	}
}

func TestAFanoutRunAgainFromTheStartWritesNoSecondNotification(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "big", users("b", 1200))
	ingestOne(t, pool, topicEvent(t, "again-1", nil, []string{"big"}, ""))
	f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 500, RangeSize: 700})
	// Two batches, then every range's progress is lost, as after a restore
	// of an older backup: the fan-out runs again from its first member.
	for range 3 {
		if _, err := f.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE topic_fanout_ranges SET after = lo, done = false, written = 0, skipped = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE topic_fanouts SET state = 'running', ended_at = NULL`); err != nil {
		t.Fatal(err)
	}
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications`); n != 1200 {
		t.Errorf("%d notifications; want 1,200", n)
	}
	st := fanoutOf(t, pool, "again-1", "big")
	if st.State != topics.StateCompleted || st.Written != 500 || st.Skipped != 700 {
		t.Errorf("after the rerun: %+v; want completed, 500 written, the 700 written before skipped", st)
	}
}

func TestReplicasShareAFanoutRangeByRange(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "shared", users("s", 6000))
	ingestOne(t, pool, topicEvent(t, "shared-1", nil, []string{"shared"}, ""))
	var wg sync.WaitGroup
	steps := make([]int, 3)
	errs := make([]error, 3)
	for i := range steps {
		f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 250, RangeSize: 1000})
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Until the fan-out ends: a worker that finds nothing free
			// (another is splitting it) looks again, as its interval would.
			for fanoutOf(t, pool, "shared-1", "shared").State != topics.StateCompleted {
				did, err := f.Step(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				if !did {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				steps[i]++
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(DISTINCT user_id) FROM notifications`); n != 6000 {
		t.Errorf("%d users reached; want 6,000", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications`); n != 6000 {
		t.Errorf("%d notifications; want 6,000", n)
	}
	if st := fanoutOf(t, pool, "shared-1", "shared"); st.State != topics.StateCompleted || st.Written != 6000 || st.Skipped != 0 {
		t.Errorf("%+v", st)
	}
	busy := 0
	for _, s := range steps {
		if s > 0 {
			busy++
		}
	}
	if busy < 2 {
		t.Errorf("steps per worker %v: one worker wrote everything", steps)
	}
}

func TestACancelStopsTheMembersNotYetWrittenAndCountsThoseReached(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "oops", users("o", 1000))
	ingestOne(t, pool, topicEvent(t, "oops-1", nil, []string{"oops"}, ""))
	f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 100})
	for range 4 { // the start, then three batches
		if _, err := f.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	res, err := ingest.Cancel(ctx, pool, "news", "oops-1", time.Now())
	if err != nil || res.Outcome != ingest.Cancelled || res.Reached != 300 || res.Stopped != 0 {
		t.Fatalf("cancel = %+v, %v; want cancelled, 300 reached", res, err)
	}
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications`); n != 300 {
		t.Errorf("%d notifications after the cancel; want the 300 written before it", n)
	}
	again, err := ingest.Cancel(ctx, pool, "news", "oops-1", time.Now())
	if err != nil || again.Outcome != ingest.Cancelled || again.Reached != 300 || !again.Cancelled.Equal(res.Cancelled) {
		t.Errorf("a repeated cancel = %+v, %v; want the first's answer", again, err)
	}
	if st := fanoutOf(t, pool, "oops-1", "oops"); st.State != topics.StateCancelled || st.Written != 300 {
		t.Errorf("%+v", st)
	}
	// A completed fan-out is too late to cancel.
	ingestOne(t, pool, topicEvent(t, "done-1", nil, []string{"oops"}, ""))
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := ingest.Cancel(ctx, pool, "news", "done-1", time.Now()); err != nil || res.Outcome != ingest.CancelTooLate {
		t.Errorf("cancel after completion = %+v, %v; want already sent", res, err)
	}
}

func TestAScheduledTopicEventStartsAtItsSendTime(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "later", users("l", 50))
	now := time.Now().UTC()
	clk := clock.NewFake(now)
	sendAt := now.Add(time.Hour).Truncate(time.Second)
	ingestOne(t, pool, topicEvent(t, "later-1", []string{"l00001"}, []string{"later"}, sendAt.Format(time.RFC3339)))
	ingestOne(t, pool, topicEvent(t, "later-2", nil, []string{"later"}, sendAt.Format(time.RFC3339)))
	f := newFanout(t, pool, topics.FanoutConfig{Clock: clk})
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications`); n != 0 {
		t.Fatalf("%d notifications before send_at", n)
	}
	// Cancelled before its time: nobody got it, and the recipient's
	// scheduled row is stopped with it.
	res, err := ingest.Cancel(ctx, pool, "news", "later-1", now)
	if err != nil || res.Outcome != ingest.Cancelled || res.Reached != 0 || res.Stopped != 1 {
		t.Fatalf("cancel before send_at = %+v, %v", res, err)
	}
	clk.Advance(time.Hour + time.Second)
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications WHERE idempotency_key = 'later-2'`); n != 50 {
		t.Errorf("%d notifications of the uncancelled event at its send_at; want 50", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications WHERE idempotency_key = 'later-1'`); n != 0 {
		t.Errorf("%d notifications of the cancelled event", n)
	}
}

// A cancel stops, beside the members not yet written, the pushes of the
// members reached that still wait in the queue (paced), each cancelled in
// the delivery log, and counts them; a push a dispatcher holds goes out.
func TestACancelStopsThePacedPushesOfTheMembersReached(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	members := users("q", 300)
	addMembers(t, pool, "paced-stop", members)
	if _, err := pool.Exec(ctx, `INSERT INTO devices (token, user_id, platform) SELECT 'ExponentPushToken[' || u || ']', u, 'ios' FROM unnest($1::text[]) u`, members); err != nil {
		t.Fatal(err)
	}
	ingestOne(t, pool, topicEvent(t, "paced-stop-1", nil, []string{"paced-stop"}, ""))
	f := newFanout(t, pool, topics.FanoutConfig{PushRate: 10, BatchSize: 100})
	for range 3 { // the start, then two batches: 200 members, their pushes paced over 20 s
		if _, err := f.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A dispatcher holds one of them.
	if _, err := pool.Exec(ctx, `UPDATE push_queue SET claimed_until = now() + interval '1 minute', claimed_by = 'replica-1'
		WHERE notification_id = (SELECT min(notification_id) FROM push_queue)`); err != nil {
		t.Fatal(err)
	}
	res, err := ingest.Cancel(ctx, pool, "news", "paced-stop-1", time.Now())
	if err != nil || res.Outcome != ingest.Cancelled || res.Reached != 200 || res.PushesStopped != 199 {
		t.Fatalf("cancel = %+v, %v; want cancelled, 200 reached, 199 of their pushes stopped", res, err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM push_queue`); n != 1 {
		t.Errorf("%d pushes left in the queue; want the one a dispatcher holds", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM push_dispatches WHERE state = 'cancelled' AND error = 'its event was cancelled before its push was sent'`); n != 199 {
		t.Errorf("%d pushes cancelled in the delivery log; want 199", n)
	}
	again, err := ingest.Cancel(ctx, pool, "news", "paced-stop-1", time.Now())
	if err != nil || again.Outcome != ingest.Cancelled || again.PushesStopped != 0 {
		t.Errorf("a repeat = %+v, %v; want cancelled, stopping nothing more", again, err)
	}
}

func TestTopicPushesArePacedPerDeviceBehindDirectOnes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "paced", users("p", 20))
	// p00000 has two phones, p00001 one, p00002 a disabled one; the rest none.
	if _, err := pool.Exec(ctx, `INSERT INTO devices (token, user_id, platform, enabled) VALUES
			('ExponentPushToken[a]', 'p00000', 'ios', true), ('ExponentPushToken[b]', 'p00000', 'android', true),
			('ExponentPushToken[c]', 'p00001', 'ios', true), ('ExponentPushToken[d]', 'p00002', 'ios', false)`); err != nil {
		t.Fatal(err)
	}
	ingestOne(t, pool, topicEvent(t, "paced-1", nil, []string{"paced"}, ""))
	f := newFanout(t, pool, topics.FanoutConfig{PushRate: 1, BatchSize: 20})
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	due := map[string]float64{}
	rows, _ := pool.Query(ctx, `SELECT user_id, extract(epoch FROM due_at - enqueued_at)::float8 FROM push_queue`)
	for rows.Next() {
		var u string
		var s float64
		_ = rows.Scan(&u, &s)
		due[u] = s
	}
	// One push a second. The first batch's turns start now: p00000 takes
	// two (0 and 1 s), p00001 the third (2 s); those without an enabled
	// device get no push work at all.
	if len(due) != 2 || due["p00000"] > 0.5 || due["p00001"] < 1.5 || due["p00001"] > 2.5 {
		t.Errorf("push due after enqueue (s): %v", due)
	}
	// The next fan-out's batch is paced after this one's 20 turns.
	ingestOne(t, pool, topicEvent(t, "paced-2", nil, []string{"paced"}, ""))
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	var wait float64
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM q.due_at - q.enqueued_at)::float8 FROM push_queue q
			JOIN notifications n ON n.id = q.notification_id WHERE n.idempotency_key = 'paced-2' AND n.user_id = 'p00000'`).Scan(&wait); err != nil {
		t.Fatal(err)
	}
	// The first fan-out took three turns (p00000's two phones, p00001's
	// one), not one per member (20): the second's first push is due when
	// those 3 s end, less the time between the two.
	if wait < 2 || wait > 3.5 {
		t.Errorf("the second fan-out's first push is due %.2fs after it was queued; want after the first fan-out's 3 turns (3 s on)", wait)
	}
}

// A batch that takes longer than BatchTime halves, down to MinBatch: a
// fan-out holds the live stream's commit order back no longer than that.
func TestBatchesShrinkWhileTheyTakeLongerThanTheirTime(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "slow", users("s", 1000))
	ingestOne(t, pool, topicEvent(t, "slow-1", nil, []string{"slow"}, ""))
	f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 400, BatchTime: time.Nanosecond})
	steps := 0
	for {
		did, err := f.Step(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !did {
			break
		}
		steps++
	}
	// The start, batches of 400, 200, 100, then 50s (300 left: 6 full and an
	// empty one that ends the range), and no completion step (the last batch
	// completes it).
	if steps != 1+3+7 {
		t.Errorf("%d steps; want 11: batches of 400, 200, 100 and then 50", steps)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications`); n != 1000 {
		t.Errorf("%d notifications; want 1,000", n)
	}
}

// A cancel that comes while a worker starts the fan-out (its members split
// into ranges, its row locked) waits for the start, then judges the
// fan-out as the start left it: running, nothing written, so it is
// cancelled, and nothing is written after. (Judged in the statement that
// waited, the ranges the start inserted were not in its snapshot: 409 and
// every member written.)
func TestACancelWhileTheFanOutStartsStopsIt(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "starting", users("s", 500))
	ingestOne(t, pool, topicEvent(t, "starting-1", nil, []string{"starting"}, ""))
	f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 100})

	// Members held: the start takes the fan-out's row, then waits to read them.
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if _, err := hold.Exec(ctx, `LOCK TABLE topic_members IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	waiting := func(what, like string) {
		t.Helper()
		testsignal.Eventually(t, what, 10*time.Second, func() bool {
			return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, like) > 0
		})
	}
	started := make(chan error, 1)
	go func() { _, err := f.Step(ctx); started <- err }()
	waiting("the start to wait for the members", "%topic_members%topic_fanout_ranges%")
	cancelled := make(chan ingest.CancelResult, 1)
	go func() {
		res, err := ingest.Cancel(ctx, pool, "news", "starting-1", time.Now())
		if err != nil {
			t.Error(err)
		}
		cancelled <- res
	}()
	waiting("the cancel to wait for the start", "%topic_fanouts%")
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if res := <-cancelled; res.Outcome != ingest.Cancelled || res.Reached != 0 {
		t.Fatalf("a cancel during the start = %+v; want cancelled, 0 reached", res)
	}
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM notifications`); n != 0 {
		t.Errorf("%d notifications written after the cancel; want none", n)
	}
	if st := fanoutOf(t, pool, "starting-1", "starting"); st.State != topics.StateCancelled || st.Written != 0 {
		t.Errorf("the fan-out %+v; want cancelled, nothing written", st)
	}
}

// A cancel that comes after a fan-out's last batch, before its worker
// records it complete, finds every member reached: too late, as after
// completion, and the fan-out completes.
func TestACancelAfterTheLastBatchIsTooLate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "late", users("l", 250))
	ingestOne(t, pool, topicEvent(t, "late-1", nil, []string{"late"}, ""))
	batches := 0
	var res ingest.CancelResult
	var cancelErr error
	f := newFanout(t, pool, topics.FanoutConfig{BatchSize: 100, Written: func() {
		if batches++; batches == 3 { // the last: 50 members, its range done
			res, cancelErr = ingest.Cancel(ctx, pool, "news", "late-1", time.Now())
		}
	}})
	if err := f.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if batches != 3 || cancelErr != nil || res.Outcome != ingest.CancelTooLate {
		t.Errorf("a cancel between the last batch and the completion (batch %d) = %+v, %v; want too late", batches, res, cancelErr)
	}
	if st := fanoutOf(t, pool, "late-1", "late"); st.State != topics.StateCompleted || st.Written != 250 {
		t.Errorf("the fan-out %+v; want completed, 250 written", st)
	}
}
