package push_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
)

// pushedOnce fails the test unless the fake Expo got each of want (device,
// notification) pairs exactly once.
func (s *stack) pushedOnce(want int) {
	s.t.Helper()
	seen := map[string]int{}
	for _, m := range s.fake.Messages() {
		seen[m.To+" "+fmt.Sprint(m.Data["notification_id"])]++
	}
	for k, n := range seen {
		if n != 1 {
			s.t.Errorf("%s pushed %d times", k, n)
		}
	}
	if len(seen) != want {
		s.t.Errorf("%d distinct pushes reached the fake Expo; want %d, each once", len(seen), want)
	}
}

// settled reports whether nothing waits in the push queue and no dispatch is
// left queued (written and not answered).
func (s *stack) settled() bool {
	s.t.Helper()
	return pgtest.Count(s.t, s.pool, `SELECT count(*) FROM push_queue`) == 0 &&
		pgtest.Count(s.t, s.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'queued'`) == 0
}

func TestAGracefulStopOfCentralFinishesItsSendsAndHandsTheRestToAnotherReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("runs central as a subprocess")
	}
	t.Parallel()
	s := newStack(t)
	const users, events = 25, 250
	for u := range users {
		s.register(fmt.Sprintf("u%d", u), fmt.Sprintf("ExponentPushToken[u%d]", u))
	}
	for i := range events {
		s.ingest(fmt.Sprintf("e%d", i), "general", fmt.Sprintf("u%d", i%users))
	}
	s.fake.SetDelay(time.Second) // each request is in flight for a second

	// Replica A is a real central. Its rate limit (1 message a second, bursts
	// of 100) lets one request go at once and holds the others for a minute
	// or more: the SIGTERM finds one send in flight and others not started.
	addr := proctest.FreeAddr(t)
	a := proctest.Start(t, nil, "central", "--database-url", s.dbURL, "--listen", addr,
		"--oidc-issuer", "https://issuer.invalid", "--oidc-audience", "spoolcast", "--jwks-url", "http://"+proctest.FreeAddr(t)+"/jwks",
		"--expo-url", s.expoURL, "--expo-rate", "1", "--receipt-interval", "1h", "--maintenance-interval", "0",
		"--shutdown-timeout", "6s", "--log-level", "warn")
	a.WaitHealthy("http://" + addr)
	testsignal.Eventually(t, "replica A to be mid-send", 30*time.Second, func() bool { return s.fake.Requests("send") > 0 })

	// Replica B shares the queue; everything in it is leased to A for now.
	ctx := context.Background()
	b := s.newDispatcher(s.connect(), s.prefs)
	b.Start(ctx)
	t.Cleanup(func() { _ = b.Stop(ctx) })

	start := time.Now()
	a.Stop() // SIGTERM, and a clean exit
	testsignal.Eventually(t, "every notification to be dispatched", 30*time.Second, s.settled)
	if took := time.Since(start); took > time.Minute {
		t.Errorf("the hand-over took %s: it waited for A's lease (2m)", took)
	}
	s.pushedOnce(events)
	if got := s.states(); got[push.StateFailed] != 0 || got[push.StateSent] != events {
		t.Errorf("states = %v; want all %d sent and none failed by the stop", got, events)
	}
	if got := s.counter("spoolcast_push_sent_total", "result", push.SentOK); got == 0 {
		t.Error("replica B sent nothing: A handed back none of what it had not sent")
	}
}

func TestAStoppedDispatcherGivesBackWhatItHasNotSentAndNoDeviceGetsItTwice(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	// One notification to 150 devices: two requests to Expo, of 100 and 50.
	tokens := make([]string, 150)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("ExponentPushToken[d%03d]", i)
	}
	s.devices.MaxEnabledPerUser = len(tokens) // past the default cap of 20
	s.register("u1", tokens...)
	s.ingest("e1", "general", "u1")
	s.fake.SetDelay(300 * time.Millisecond)

	// Replica A may send 100 messages at once and the rest a minute later or
	// more: the stop finds one request in flight and one not started.
	ctx := context.Background()
	a := s.newDispatcherWith(s.connect(), s.prefs, s.expoClient(expo.Config{RatePerSecond: 1}))
	a.Start(ctx)
	testsignal.Eventually(t, "the first request to reach Expo", 30*time.Second, func() bool { return s.fake.Requests("send") > 0 })
	stopCtx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	if err := a.Stop(stopCtx); err != nil {
		t.Fatalf("a graceful stop within its timeout = %v", err)
	}
	if s.fake.Accepted() == 0 {
		t.Fatal("the request in flight at the stop did not finish")
	}
	s.drain() // replica B takes what A gave back
	if !s.settled() {
		t.Fatal("dispatches are left queued, or notifications in the queue")
	}
	s.pushedOnce(len(tokens))
	if got := s.states(); got[push.StateFailed] != 0 || got[push.StateSent] != len(tokens) {
		t.Errorf("states = %v; want one sent dispatch per device and none failed", got)
	}
}

func TestASendThatMayHaveBeenAcceptedIsNeverSentAgain(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]")
	// Expo takes the message, and its answer comes after the client gave up.
	s.fake.SetAnswerDelay(time.Minute)
	impatient := s.expoClient(expo.Config{HTTP: &http.Client{Timeout: 300 * time.Millisecond}, RatePerSecond: -1, Retries: 3, MinBackoff: time.Millisecond})
	s.dispatcher = s.newDispatcherWith(s.pool, s.prefs, impatient)
	s.ingest("e1", "general", "u1")
	s.drain()
	if n := s.fake.Accepted(); n != 1 {
		t.Errorf("Expo accepted the message %d times; want once: a send that timed out after it was written is not tried again", n)
	}
	log, err := push.Deliveries(context.Background(), s.pool, push.DeliveryQuery{UserID: "u1"})
	if err != nil || len(log.Data) != 1 {
		t.Fatalf("delivery log = %+v, %v; want the one dispatch", log.Data, err)
	}
	d := log.Data[0]
	if d.State != push.StateFailed || d.Error == nil || !strings.Contains(*d.Error, "outcome unknown") || !strings.Contains(*d.Error, "a retry could deliver twice") {
		t.Errorf("the dispatch is %s, error %v; want failed, saying the outcome is unknown and why it was not retried", d.State, d.Error)
	}
}

// Expo took the send whole and the connection dropped before its answer:
// the push may be on the phone, so it is not sent again.
func TestAPushExpoTookAndWhoseConnectionDroppedIsNeverSentAgain(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]")
	s.fake.DropAnswers(1)
	s.ingest("e1", "general", "u1")
	s.drain()
	if n, m := s.fake.Requests("send"), s.fake.Accepted(); n != 1 || m != 1 {
		t.Errorf("%d sends and %d messages taken; want 1 and 1", n, m)
	}
	log, err := push.Deliveries(context.Background(), s.pool, push.DeliveryQuery{UserID: "u1"})
	if err != nil || len(log.Data) != 1 {
		t.Fatalf("delivery log = %+v, %v; want the one dispatch", log.Data, err)
	}
	if d := log.Data[0]; d.State != push.StateFailed || d.Error == nil || !strings.Contains(*d.Error, "outcome unknown") {
		t.Errorf("the dispatch is %s, error %v; want failed, outcome unknown", d.State, d.Error)
	}
}

// A connection to Expo refused took nothing: the send is tried again.
func TestAPushWhoseConnectionToExpoWasRefusedIsSentAgain(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	var dials atomic.Int32
	var d net.Dialer
	transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		return d.DialContext(ctx, network, addr)
	}}
	s.dispatcher = s.newDispatcherWith(s.pool, s.prefs, s.expoClient(expo.Config{HTTP: &http.Client{Transport: transport}, RatePerSecond: -1, MinBackoff: time.Millisecond}))
	s.register("u1", "ExponentPushToken[a]")
	s.ingest("e1", "general", "u1")
	s.drain()
	if got := s.states(); got[push.StateSent] != 1 {
		t.Errorf("states = %v; want sent", got)
	}
	if n := s.fake.Accepted(); n != 1 {
		t.Errorf("%d messages taken, want 1", n)
	}
}

// Expo's ticket MessageRateExceeded says the device was sent too much and
// asks for the message to be retried slowly: it is deferred, sent again
// once a minute later, and taken once.
func TestAPushExpoSaysExceedsItsDevicesRateIsSentAgainAMinuteLater(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newStackOn(t, clk)
	s.register("u1", "ExponentPushToken[a]", "ExponentPushToken[b]")
	s.fake.ExceedRate("ExponentPushToken[a]", 1)
	s.ingest("e1", "general", "u1")
	s.drain()
	if got := s.states(); got[push.StateDeferred] != 1 || got[push.StateSent] != 1 {
		t.Fatalf("states = %v; want a's push deferred and b's sent", got)
	}
	clk.Advance(59 * time.Second)
	s.drain()
	if n := s.fake.Accepted(); n != 1 {
		t.Fatalf("%d messages taken before the minute passed, want 1 (b's)", n)
	}
	clk.Advance(2 * time.Second)
	s.drain()
	got := map[string]int{}
	for _, m := range s.fake.Messages() {
		got[m.To]++
	}
	if got["ExponentPushToken[a]"] != 1 || got["ExponentPushToken[b]"] != 1 {
		t.Errorf("Expo took %v, want each device's push once", got)
	}
	if st := s.states(); st[push.StateDeferred] != 1 || st[push.StateSent] != 2 {
		t.Errorf("states = %v; want the deferral and two sent", st)
	}
}

// gatedPreferences holds the first lookup until open is closed.
type gatedPreferences struct {
	preferences.Source
	entered chan struct{}
	open    chan struct{}
	first   atomic.Bool
}

func (g *gatedPreferences) PushOff(ctx context.Context, users []string) map[string]map[string]bool {
	if g.first.CompareAndSwap(false, true) {
		close(g.entered)
		<-g.open
	}
	return g.Source.PushOff(ctx, users)
}

func TestALeaseLeftByAWritePostgresLostIsGivenBackButNotOneAPassHolds(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newStackOn(t, clk)
	prefs := &gatedPreferences{Source: s.prefs, entered: make(chan struct{}), open: make(chan struct{})}
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: prefs, Devices: s.devices,
		Replica: "r1", Clock: clk, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.register("u1", "ExponentPushToken[a]")
	ctx := context.Background()

	// Pass 1 takes k1 and is held before it writes.
	s.ingest("k1", "c", "u1")
	held := make(chan error, 1)
	go func() {
		_, err := d.Pass(ctx)
		held <- err
	}()
	<-prefs.entered
	if n, err := d.Pass(ctx); err != nil || n != 0 { // pass 2
		t.Fatalf("pass 2 took %d (%v) with k1 leased to pass 1", n, err)
	}
	// k2 was leased by this replica's pass 2, which ended but whose write
	// Postgres lost (as an asynchronous standby's promotion loses it); k3
	// by another replica.
	s.ingest("k2", "c", "u1")
	s.ingest("k3", "c", "u1")
	lease := func(key, token string) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, `UPDATE push_queue q SET claimed_by = $2, claimed_until = now() + interval '2 minutes'
			FROM notifications n WHERE n.id = q.notification_id AND n.idempotency_key = $1`, key, token); err != nil {
			t.Fatal(err)
		}
	}
	lease("k2", "r1/2")
	lease("k3", "r2/1")

	clk.Advance(15 * time.Second)
	if n, err := d.Pass(ctx); err != nil || n != 1 { // pass 3: the sweep, then k2
		t.Fatalf("pass 3 took %d (%v), want k2 only", n, err)
	}
	if n := s.counter("spoolcast_push_orphans_released_total"); n != 1 {
		t.Errorf("spoolcast_push_orphans_released_total = %v, want 1", n)
	}
	close(prefs.open)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	var left []string
	rows, _ := s.pool.Query(ctx, `SELECT n.idempotency_key || ' ' || q.claimed_by FROM push_queue q JOIN notifications n ON n.id = q.notification_id WHERE q.claimed_until > now()`)
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		left = append(left, k)
	}
	if rows.Close(); len(left) != 1 || left[0] != "k3 r2/1" {
		t.Errorf("leased after the sweep: %v, want only k3's by the other replica", left)
	}
	// k1 by the held pass and k2 after the sweep, each once.
	if got := len(s.fake.Messages()); got != 2 {
		t.Errorf("Expo got %d messages, want 2 (k1 and k2)", got)
	}
	if got := pgtest.Count(t, s.pool, `SELECT count(*) FROM push_dispatches`); got != 2 {
		t.Errorf("%d dispatches, want 2", got)
	}
}

// A dispatch given back while a pass holds its notification's queue row
// (the row another device's give-back put there) takes the row from that
// pass, which read the dispatch as done: the next pass sends to both.
func TestADispatchGivenBackWhileAPassHoldsItsNotificationIsNotLost(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]", "ExponentPushToken[b]")
	s.ingest("k1", "c", "u1")
	ctx := context.Background()
	// A pass wrote both dispatches and took the notification off the queue.
	if _, err := s.pool.Exec(ctx, `WITH q AS (DELETE FROM push_queue RETURNING notification_id, notification_created_at, user_id)
		INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state)
		SELECT q.notification_id, q.notification_created_at, q.user_id, t, 'queued' FROM q, unnest(ARRAY['ExponentPushToken[a]', 'ExponentPushToken[b]']) t`); err != nil {
		t.Fatal(err)
	}
	id := func(token string) int64 {
		var id int64
		if err := s.pool.QueryRow(ctx, `SELECT id FROM push_dispatches WHERE token = $1`, token).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, b := id("ExponentPushToken[a]"), id("ExponentPushToken[b]")
	// a's send never reached Expo: given back. Another replica's pass takes
	// the notification and reads b's dispatch, still queued, as done.
	if err := push.GiveBack(ctx, s.dispatcher, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE push_queue SET claimed_by = 'r2/7', claimed_until = now() + interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	// Then b's send is given back too.
	if err := push.GiveBack(ctx, s.dispatcher, b); err != nil {
		t.Fatal(err)
	}
	s.drain()
	got := map[string]int{}
	for _, m := range s.fake.Messages() {
		got[m.To]++
	}
	if got["ExponentPushToken[a]"] != 1 || got["ExponentPushToken[b]"] != 1 {
		t.Errorf("pushes after both give-backs: %v, want each device once", got)
	}
}

// askedPreferences records the users each lookup names.
type askedPreferences struct {
	preferences.Source
	mu    sync.Mutex
	asked []string
}

func (a *askedPreferences) PushOff(ctx context.Context, users []string) map[string]map[string]bool {
	a.mu.Lock()
	a.asked = append(a.asked, users...)
	a.mu.Unlock()
	return a.Source.PushOff(ctx, users)
}

// A broadcast reaches many users without a device: their pushes are
// skipped without asking the preferences (a request each to --prefs-url).
func TestPreferencesAreAskedOnlyForUsersWithADevice(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newStackOn(t, clk)
	prefs := &askedPreferences{Source: s.prefs}
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: prefs, Devices: s.devices,
		Replica: "r1", Clock: clk, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.register("u1", "ExponentPushToken[a]")
	s.ingest("k1", "c", "u1", "u2", "u3")
	if _, err := d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(prefs.asked) != "[u1]" {
		t.Errorf("preferences asked for %v; want only u1, the one with a device", prefs.asked)
	}
	if st := s.states(); st[push.StateSkipped] != 2 || st[push.StateSent] != 1 {
		t.Errorf("states = %v; want 1 sent, 2 skipped", st)
	}
}
