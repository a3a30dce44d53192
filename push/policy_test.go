package push_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/push/policy"
	"github.com/spoolcast/spoolcast/schedule"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestQuietHoursEndAtTheUsersWallClockAcrossDSTAndMidnight(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	q, err := policy.ParseQuietHours(policy.QuietHours{Start: "22:00", End: "07:00", TimeZone: "Europe/Berlin"})
	if err != nil {
		t.Fatal(err)
	}
	day, err := policy.ParseQuietHours(policy.QuietHours{Start: "09:30", End: "17:00", TimeZone: "America/New_York"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		q      policy.QuietHours
		now    time.Time
		inside bool
		end    time.Time
	}{
		{"before midnight", q, time.Date(2026, 12, 1, 23, 15, 0, 0, berlin), true, time.Date(2026, 12, 2, 7, 0, 0, 0, berlin)},
		{"after midnight", q, time.Date(2026, 12, 2, 3, 0, 0, 0, berlin), true, time.Date(2026, 12, 2, 7, 0, 0, 0, berlin)},
		{"at the start", q, time.Date(2026, 12, 1, 22, 0, 0, 0, berlin), true, time.Date(2026, 12, 2, 7, 0, 0, 0, berlin)},
		{"at the end", q, time.Date(2026, 12, 2, 7, 0, 0, 0, berlin), false, time.Time{}},
		{"daytime", q, time.Date(2026, 12, 2, 12, 0, 0, 0, berlin), false, time.Time{}},
		// Clocks go forward at 02:00 on 28 March 2027: 07:00 is 05:00 UTC, not 06:00.
		{"spring forward", q, time.Date(2027, 3, 27, 23, 0, 0, 0, berlin), true, time.Date(2027, 3, 28, 5, 0, 0, 0, time.UTC)},
		// Clocks go back at 03:00 on 25 October 2026: 07:00 is 06:00 UTC, not 05:00.
		{"fall back", q, time.Date(2026, 10, 24, 23, 0, 0, 0, berlin), true, time.Date(2026, 10, 25, 6, 0, 0, 0, time.UTC)},
		{"a window within the day", day, time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC), true, time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)},
		{"before a window within the day", day, time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC), false, time.Time{}},
	} {
		end, inside := tc.q.Until(tc.now)
		if inside != tc.inside || !end.Equal(tc.end) {
			t.Errorf("%s: Until(%s) = %s, %v; want %s, %v", tc.name, tc.now, end, inside, tc.end, tc.inside)
		}
	}
	for _, bad := range []policy.QuietHours{
		{Start: "22:00", End: "22:00", TimeZone: "UTC"},
		{Start: "24:00", End: "07:00", TimeZone: "UTC"},
		{Start: "7:00", End: "08:00", TimeZone: "UTC"},
		{Start: "22:00", End: "07:00", TimeZone: "Mars/Olympus"},
		{Start: "22:00", End: "07:00", TimeZone: "Local"},
		{Start: "22:00", End: "07:00"},
	} {
		if _, err := policy.ParseQuietHours(bad); err == nil {
			t.Errorf("ParseQuietHours(%+v) took it", bad)
		}
	}
}

// policyStack is a stack whose dispatchers and firers share a fake clock
// set to the wall clock's time, so that Postgres's own times agree with it.
type policyStack struct {
	*stack
	clk *clock.Fake
}

func newPolicyStack(t *testing.T, throttle policy.Throttle) *policyStack {
	t.Helper()
	fc := clock.NewFake(time.Now())
	p := &policyStack{stack: newStackOn(t, fc), clk: fc}
	p.dispatcher = p.policyDispatcher(p.pool, throttle)
	return p
}

func (p *policyStack) policyDispatcher(pool *pgxpool.Pool, throttle policy.Throttle) *push.Dispatcher {
	return p.policyDispatcherWith(pool, throttle, p.client)
}

func (p *policyStack) policyDispatcherWith(pool *pgxpool.Pool, throttle policy.Throttle, sender push.Sender) *push.Dispatcher {
	p.t.Helper()
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: pool, Sender: sender, Preferences: p.prefs, Devices: devices.New(pool, nil),
		Clock: p.clk, Metrics: p.metrics, Logger: slog.New(slog.DiscardHandler), Throttle: throttle})
	if err != nil {
		p.t.Fatal(err)
	}
	return d
}

func (p *policyStack) firer(pool *pgxpool.Pool) *schedule.Firer {
	p.t.Helper()
	f, err := schedule.New(schedule.Config{DB: pool, Clock: p.clk, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		p.t.Fatal(err)
	}
	return f
}

// emit ingests one event given as the JSON members after its key.
func (p *policyStack) emit(key, members string) {
	p.t.Helper()
	ev, err := event.Decode([]byte(fmt.Sprintf(`{"idempotency_key":%q,"type":"t",%s}`, key, members)), "")
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := ingest.Ingest(context.Background(), p.pool, []ingest.Item{{Producer: "p", Event: ev}}); err != nil {
		p.t.Fatal(err)
	}
}

func (p *policyStack) quietHours(user string, q policy.QuietHours) {
	p.t.Helper()
	parsed, err := policy.ParseQuietHours(q)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.prefs.Merge(context.Background(), user, preferences.Update{QuietHours: policy.QuietHoursSetting{Set: true, Value: &parsed}}); err != nil {
		p.t.Fatal(err)
	}
}

func titles(msgs []expo.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.Title)
	}
	return out
}

func TestAPushInQuietHoursIsDeferredToTheirEndNeverDroppedAndCriticalPasses(t *testing.T) {
	t.Parallel()
	p := newPolicyStack(t, policy.Throttle{})
	p.register("u1", "ExponentPushToken[a]")
	now := p.clk.Now().UTC()
	// Quiet from an hour ago to two hours from now, in UTC.
	start, end := now.Add(-time.Hour), now.Add(2*time.Hour)
	p.quietHours("u1", policy.QuietHours{Start: start.Format("15:04"), End: end.Format("15:04"), TimeZone: "UTC"})
	p.emit("night", `"recipients":["u1"],"title":"Nightly report"`)
	p.emit("outage", `"recipients":["u1"],"title":"Site down","priority":"critical"`)
	p.drain()
	msgs := p.stack.fake.Messages()
	if len(msgs) != 1 || msgs[0].Title != "Site down" || msgs[0].Priority != "high" {
		t.Fatalf("during quiet hours Expo got %+v; want only the critical push, at high priority", msgs)
	}
	if st := p.states(); st[push.StateDeferred] != 1 || st[push.StateQueued]+st[push.StateSent] != 1 {
		t.Errorf("states %v; want one deferred and one sent", st)
	}
	if n := pgtest.Count(t, p.pool, `SELECT count(*) FROM notifications WHERE user_id = 'u1'`); n != 2 {
		t.Errorf("%d notifications in the feed; quiet hours never hold the feed", n)
	}
	// Just before the end nothing is due; at the end it is pushed once.
	p.clk.Advance(end.Truncate(time.Minute).Sub(now) - time.Second)
	p.drain()
	if n := len(p.stack.fake.Messages()); n != 1 {
		t.Fatalf("%d pushes before quiet hours ended; want still 1", n)
	}
	p.clk.Advance(time.Second)
	p.drain()
	if got := titles(p.stack.fake.Messages()); len(got) != 2 || got[1] != "Nightly report" {
		t.Errorf("after quiet hours Expo has %q; want the deferred push too", got)
	}
	if c := p.counter("spoolcast_push_policy_total", "outcome", policy.Deferred); c != 1 {
		t.Errorf("policy deferred = %v, want 1", c)
	}
	if c := p.counter("spoolcast_push_policy_total", "outcome", policy.Critical); c != 1 {
		t.Errorf("policy critical = %v, want 1", c)
	}
}

func TestAThrottleSendsTheFirstPushesOfItsWindowAndRecordsTheRestThrottled(t *testing.T) {
	t.Parallel()
	p := newPolicyStack(t, policy.Throttle{Limit: 2, Window: time.Hour})
	p.register("u1", "ExponentPushToken[a]")
	for i := range 5 {
		p.emit(fmt.Sprint("chat", i), fmt.Sprintf(`"recipients":["u1"],"category":"chat","title":"m%d"`, i))
		if i == 2 { // a second pass in the same window counts what the first did
			p.drain()
		}
	}
	p.emit("alarm", `"recipients":["u1"],"category":"chat","title":"alarm","priority":"critical"`)
	p.emit("billing", `"recipients":["u1"],"category":"billing","title":"invoice"`)
	p.drain()
	got := titles(p.stack.fake.Messages())
	if len(got) != 4 || got[0] != "m0" || got[1] != "m1" {
		t.Fatalf("Expo got %q; want m0, m1, the critical alarm and the other category's invoice", got)
	}
	if st := p.states(); st[push.StateThrottled] != 3 {
		t.Errorf("states %v; want 3 throttled", st)
	}
	// The next window starts afresh.
	p.clk.Advance(time.Hour)
	p.emit("chat-next", `"recipients":["u1"],"category":"chat","title":"next window"`)
	p.drain()
	if got := titles(p.stack.fake.Messages()); len(got) != 5 || got[4] != "next window" {
		t.Errorf("Expo got %q; want the next window's push", got)
	}
	// The past window's counters are deleted by the running dispatchers.
	if n := pgtest.Count(t, p.pool, `SELECT count(*) FROM push_throttles`); n != 3 {
		t.Fatalf("%d throttle counters; want the past window's two and the current one's", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.dispatcher.Start(ctx)
	testsignal.Eventually(t, "the past window's counter to be deleted", 10*time.Second, func() bool {
		p.clk.Advance(time.Second)
		return pgtest.Count(t, p.pool, `SELECT count(*) FROM push_throttles`) == 1
	})
	if g := p.gauge("spoolcast_dispatches", "state", push.StateThrottled); g != 3 {
		t.Errorf("spoolcast_dispatches{state=throttled} = %v, want 3", g)
	}
}

// gauge reads the one gauge of name with the label value given.
func (p *policyStack) gauge(name, label, value string) float64 {
	p.t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		p.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// hangingSender sends to Expo and then never answers: the replica died
// between the push and its mark.
type hangingSender struct {
	inner push.Sender
	hang  chan struct{}
	sent  chan struct{}
}

func (h *hangingSender) Send(ctx context.Context, msgs []expo.Message) ([]expo.Ticket, error) {
	t, err := h.inner.Send(ctx, msgs)
	close(h.sent)
	<-h.hang
	return t, err
}

func TestOneDigestPushForAHundredEventsInASecondAcrossTwoReplicasEvenWithOneKilledAfterThePush(t *testing.T) {
	t.Parallel()
	p := newPolicyStack(t, policy.Throttle{})
	p.register("u1", "ExponentPushToken[a]", "ExponentPushToken[b]")
	p.register("u2", "ExponentPushToken[c]")
	second := p.connect()
	dispatchers := []*push.Dispatcher{p.dispatcher, p.policyDispatcher(second, policy.Throttle{})}
	firers := []*schedule.Firer{p.firer(p.pool), p.firer(second)}
	// 100 events inside one second, ingested concurrently through both
	// replicas' pools while both dispatch.
	ctx := context.Background()
	stop := make(chan struct{})
	var dispatching sync.WaitGroup
	for _, d := range dispatchers {
		dispatching.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := d.Pass(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var ingesting sync.WaitGroup
	for i := range 100 {
		pool := []*pgxpool.Pool{p.pool, second}[i%2]
		ingesting.Go(func() {
			ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"msg%d","type":"chat.message","recipients":["u1","u2"],"title":"message %03d","digest":{"key":"chat:room42","window":"5m"}}`, i, i), "")
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "p", Event: ev}}); err != nil {
				t.Error(err)
			}
		})
	}
	ingesting.Wait()
	for pgtest.Count(t, p.pool, `SELECT count(*) FROM push_queue`) > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	dispatching.Wait()
	if n := len(p.stack.fake.Messages()); n != 0 {
		t.Fatalf("%d pushes inside the window; want none before it ends", n)
	}
	if n := pgtest.Count(t, p.pool, `SELECT count(*) FROM push_digests WHERE digest_key = 'chat:room42' AND count = 100`); n != 2 {
		t.Fatalf("%d digests of 100; want one per recipient", n)
	}
	if st := p.states(); st[push.StateDigested] != 200 {
		t.Errorf("states %v; want 200 digested", st)
	}
	// Before the window ends nothing fires.
	for _, f := range firers {
		if _, d, err := f.Pass(ctx); err != nil || d != 0 {
			t.Fatalf("fired %d digests, %v, before the window ended", d, err)
		}
	}
	p.clk.Advance(5 * time.Minute)
	var firing sync.WaitGroup
	fired := make([]int, 2)
	for i, f := range firers {
		firing.Go(func() {
			_, d, err := f.Pass(ctx)
			if err != nil {
				t.Error(err)
			}
			fired[i] = d
		})
	}
	firing.Wait()
	if fired[0]+fired[1] != 2 {
		t.Fatalf("firers queued %v digest pushes; want 2 in all", fired)
	}
	// The first replica pushes and dies before it records the tickets.
	hang := &hangingSender{inner: p.client, hang: make(chan struct{}), sent: make(chan struct{})}
	dying, err := push.NewDispatcher(push.DispatcherConfig{DB: p.connect(), Sender: hang, Preferences: p.prefs, Devices: p.devices,
		Lease: time.Second, Metrics: p.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	died := make(chan struct{})
	go func() { defer close(died); _, _ = dying.Pass(ctx) }()
	t.Cleanup(func() { close(hang.hang); <-died })
	<-hang.sent
	// The other replica goes on; the firers find nothing more.
	p.clk.Advance(10 * time.Minute) // past the dying replica's lease
	for _, f := range firers {
		if _, d, err := f.Pass(ctx); err != nil || d != 0 {
			t.Errorf("fired %d digests again, %v", d, err)
		}
	}
	for range 3 {
		if _, err := dispatchers[1].Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	msgs := p.stack.fake.Messages()
	byToken := map[string][]expo.Message{}
	for _, m := range msgs {
		byToken[m.To] = append(byToken[m.To], m)
	}
	if len(msgs) != 3 || len(byToken) != 3 {
		t.Fatalf("Expo got %d pushes for %d devices; want one digest push per device", len(msgs), len(byToken))
	}
	latest := map[string]string{}
	for _, u := range []string{"u1", "u2"} {
		var title string
		if err := p.pool.QueryRow(ctx, `SELECT title FROM notifications WHERE user_id = $1 ORDER BY id DESC LIMIT 1`, u).Scan(&title); err != nil {
			t.Fatal(err)
		}
		latest[u] = title
	}
	for tok, ms := range byToken {
		m := ms[0]
		user := "u1"
		if strings.HasSuffix(tok, "[c]") {
			user = "u2"
		}
		if m.Title != "100 new in chat:room42" || m.Body != latest[user] {
			t.Errorf("%s got %q / %q; want the count and the latest title, %q", tok, m.Title, m.Body, latest[user])
		}
		if dg, _ := m.Data["digest"].(map[string]any); dg["key"] != "chat:room42" || dg["count"] != 100.0 {
			t.Errorf("%s's push data %v; want the digest's key and count", tok, m.Data)
		}
	}
}

func TestAPushWaitsForAUserWithAnOpenStreamAndIsSuppressedOnlyIfSeenOrRead(t *testing.T) {
	t.Parallel()
	p := newPolicyStack(t, policy.Throttle{})
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: p.pool, Sender: p.client, Preferences: p.prefs, Devices: p.devices,
		Clock: p.clk, Metrics: p.metrics, Logger: slog.New(slog.DiscardHandler), SuppressIfSeen: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p.dispatcher = d
	for _, u := range []string{"reader", "watcher", "away", "ignorer", "boss"} {
		p.register(u, "ExponentPushToken["+u+"]")
	}
	ctx := context.Background()
	// Everyone but "away" holds a stream open on some replica.
	if _, err := p.pool.Exec(ctx, `INSERT INTO stream_presence (user_id, replica, expires_at)
		SELECT u, 'replica-a', now() + interval '1 hour' FROM unnest(ARRAY['reader','watcher','ignorer','boss']) AS u`); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"reader", "watcher", "away", "ignorer"} {
		p.emit("hello-"+u, fmt.Sprintf(`"recipients":[%q],"title":"for %s"`, u, u))
	}
	p.emit("boss-alert", `"recipients":["boss"],"title":"critical","priority":"critical"`)
	p.drain()
	if got := titles(p.stack.fake.Messages()); len(got) != 2 {
		t.Fatalf("at once Expo got %q; want only the absent user's push and the critical one", got)
	}
	// Within the hold: one user reads it in the feed, another's app says
	// it has seen the stream up to it.
	if _, err := p.pool.Exec(ctx, `UPDATE notifications SET read_at = now() WHERE user_id = 'reader'`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, `INSERT INTO stream_seen (user_id, through_tx, through_id)
		SELECT user_id, tx, id FROM notifications WHERE user_id = 'watcher'`); err != nil {
		t.Fatal(err)
	}
	// The hold counts from the notifications' creation, on Postgres's clock.
	var created time.Time
	if err := p.pool.QueryRow(ctx, `SELECT max(created_at) FROM notifications`).Scan(&created); err != nil {
		t.Fatal(err)
	}
	p.clk.Advance(created.Add(29 * time.Second).Sub(p.clk.Now()))
	p.drain()
	if n := len(p.stack.fake.Messages()); n != 2 {
		t.Fatalf("%d pushes before the hold ended; want still 2", n)
	}
	p.clk.Advance(2 * time.Second)
	p.drain()
	got := titles(p.stack.fake.Messages())
	if len(got) != 3 || got[2] != "for ignorer" {
		t.Fatalf("after the hold Expo got %q; want the unseen push sent", got)
	}
	var suppressed []string
	rows, _ := p.pool.Query(ctx, `SELECT user_id FROM push_dispatches WHERE state = 'suppressed' ORDER BY user_id`)
	for rows.Next() {
		var u string
		_ = rows.Scan(&u)
		suppressed = append(suppressed, u)
	}
	rows.Close()
	if fmt.Sprint(suppressed) != "[reader watcher]" {
		t.Errorf("suppressed for %v; want the reader and the watcher", suppressed)
	}
	if c := p.counter("spoolcast_push_policy_total", "outcome", policy.Suppressed); c != 2 {
		t.Errorf("policy suppressed = %v, want 2", c)
	}
}
