package push_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/expo/expotest"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// stack is a database, a fake Expo over HTTP, and push's parts wired to them.
type stack struct {
	t             *testing.T
	clock         clock.Clock // of the dispatchers and the reconciler; nil: the wall clock
	dbURL         string
	pool          *pgxpool.Pool
	fake          *expotest.Server
	expoURL       string // the fake's API base
	client        *expo.Client
	reg           *prometheus.Registry
	metrics       *push.Metrics
	prefsMetrics  *preferences.Metrics
	deviceMetrics *devices.Metrics
	devices       *devices.Store
	prefs         *preferences.Builtin
	dispatcher    *push.Dispatcher
	receipts      *push.ReceiptReconciler
}

func newStack(t *testing.T) *stack {
	t.Helper()
	return newStackOn(t, nil)
}

// newStackOn is newStack with its dispatchers and reconciler on clk (nil: the wall clock).
func newStackOn(t *testing.T, clk clock.Clock) *stack {
	t.Helper()
	s := &stack{t: t, clock: clk, dbURL: pgtest.DB(t), fake: expotest.New(), reg: prometheus.NewRegistry()}
	s.pool = s.connect()
	ts := httptest.NewServer(s.fake)
	t.Cleanup(ts.Close)
	s.expoURL = ts.URL + "/--/api/v2/push"
	s.client = s.expoClient(expo.Config{RatePerSecond: -1, Retries: 2, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	var err error
	s.metrics = push.NewMetrics(s.reg)
	s.deviceMetrics = devices.NewMetrics(s.reg)
	s.devices = devices.New(s.pool, s.deviceMetrics)
	s.prefsMetrics = preferences.NewMetrics(s.reg)
	s.prefs = preferences.NewBuiltin(s.pool, s.prefsMetrics, slog.New(slog.DiscardHandler))
	s.dispatcher = s.newDispatcher(s.pool, s.prefs)
	if s.receipts, err = push.NewReceiptReconciler(push.ReceiptReconcilerConfig{DB: s.pool, Receipter: s.client, Devices: s.devices, Clock: s.clock, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *stack) connect() *pgxpool.Pool {
	s.t.Helper()
	pool, err := pgxpool.New(context.Background(), s.dbURL)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(pool.Close)
	return pool
}

// expoClient is a client of the stack's fake Expo configured by cfg.
func (s *stack) expoClient(cfg expo.Config) *expo.Client {
	s.t.Helper()
	cfg.URL = s.expoURL
	c, err := expo.New(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

func (s *stack) newDispatcher(pool *pgxpool.Pool, prefs preferences.Source) *push.Dispatcher {
	s.t.Helper()
	return s.newDispatcherWith(pool, prefs, s.client)
}

// newDispatcherWith is newDispatcher sending through sender.
func (s *stack) newDispatcherWith(pool *pgxpool.Pool, prefs preferences.Source, sender push.Sender) *push.Dispatcher {
	s.t.Helper()
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: pool, Sender: sender, Preferences: prefs, Devices: devices.New(pool, s.deviceMetrics),
		Interval: 20 * time.Millisecond, Clock: s.clock, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		s.t.Fatal(err)
	}
	return d
}

func (s *stack) register(user string, tokens ...string) {
	s.t.Helper()
	for _, tok := range tokens {
		if _, err := s.devices.Register(context.Background(), user, tok, devices.IOS); err != nil {
			s.t.Fatal(err)
		}
	}
}

func (s *stack) ingest(key, category string, users ...string) {
	s.t.Helper()
	body := fmt.Sprintf(`{"idempotency_key":%q,"type":"t","category":%q,"recipients":["%s"],"title":"Title %s","body":"Body"}`, key, category, strings.Join(users, `","`), key)
	ev, err := event.Decode([]byte(body), "")
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := ingest.Ingest(context.Background(), s.pool, []ingest.Item{{Producer: "p", Event: ev}}); err != nil {
		s.t.Fatal(err)
	}
}

// drain runs dispatch passes until the queue is empty.
func (s *stack) drain() {
	s.t.Helper()
	for range 100 {
		n, err := s.dispatcher.Pass(context.Background())
		if err != nil {
			s.t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
	s.t.Fatal("the push queue did not drain")
}

func (s *stack) states() map[string]int {
	s.t.Helper()
	rows, err := s.pool.Query(context.Background(), `SELECT state, count(*) FROM push_dispatches GROUP BY state`)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		_ = rows.Scan(&st, &n)
		out[st] = n
	}
	return out
}

func (s *stack) enabled(token string) bool {
	s.t.Helper()
	var on bool
	if err := s.pool.QueryRow(context.Background(), `SELECT enabled FROM devices WHERE token = $1`, token).Scan(&on); err != nil {
		s.t.Fatal(err)
	}
	return on
}

func (s *stack) counter(name string, labels ...string) float64 {
	s.t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() != labels[i+1] {
						continue metric
					}
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func TestAnEventPostedToARelayReachesEachDeviceAndIsDelivered(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[phone]", "ExpoPushToken[tablet]")
	// A real relay subprocess, forwarding to the same database.
	addr := proctest.FreeAddr(t)
	relay := proctest.Start(t, nil, "relay", "--producer", "p", "--listen", addr, "--spool", filepath.Join(t.TempDir(), "spool.db"),
		"--database-url", s.dbURL, "--log-level", "warn")
	relay.WaitHealthy("http://" + addr)
	resp, err := http.Post("http://"+addr+"/v1/events", "application/json",
		strings.NewReader(`{"idempotency_key":"meeting:1","type":"t","category":"meetings","recipients":["u1"],"title":"Title meeting:1","body":"Body"}`))
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("post to the relay: %v %v", resp, err)
	}
	resp.Body.Close()
	testsignal.Eventually(t, "the event to reach the push queue", 30*time.Second, func() bool {
		n, _ := s.dispatcher.Pass(context.Background())
		return n > 0
	})
	msgs := s.fake.Messages()
	if len(msgs) != 2 {
		t.Fatalf("the fake Expo got %d messages, want one per device", len(msgs))
	}
	page, err := feed.NewStore(s.pool, nil).Page(context.Background(), feed.Query{UserID: "u1"})
	if err != nil || len(page.Items) != 1 {
		t.Fatalf("feed = %v, %v", page.Items, err)
	}
	for _, m := range msgs {
		if m.Title != "Title meeting:1" || m.Data["notification_id"] != page.Items[0].PublicID().String() {
			t.Errorf("message %+v; want the title and the feed row's id", m)
		}
	}
	if got := s.states(); got[push.StateSent] != 2 {
		t.Fatalf("states after sending = %v; want 2 sent", got)
	}
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.states(); got[push.StateDelivered] != 2 {
		t.Errorf("states after receipts = %v; want 2 delivered", got)
	}
	log, err := push.Deliveries(context.Background(), s.pool, push.DeliveryQuery{UserID: "u1"})
	if err != nil || len(log.Data) != 2 || log.Data[0].State != push.StateDelivered || log.Data[0].Title != "Title meeting:1" {
		t.Fatalf("delivery log = %+v, %v", log.Data, err)
	}
	for _, d := range log.Data {
		if d.Token == nil || *d.Token == "ExponentPushToken[phone]" || *d.Token == "ExpoPushToken[tablet]" {
			t.Errorf("delivery log shows token %v; want it masked", d.Token)
		}
	}
	relay.Stop()
}

func TestConcurrentIdenticalEventsPushOncePerDevice(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]", "ExponentPushToken[b]", "ExponentPushToken[c]")
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() { s.ingest("same-event", "general", "u1") })
	}
	wg.Wait()
	s.drain()
	if n := len(s.fake.Messages()); n != 3 {
		t.Errorf("100 identical events made %d pushes; want one per device (3)", n)
	}
}

func TestTwoReplicasPushEveryNotificationExactlyOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	const users, events = 20, 300
	for u := range users {
		s.register(fmt.Sprintf("u%d", u), fmt.Sprintf("ExponentPushToken[u%d-a]", u), fmt.Sprintf("ExponentPushToken[u%d-b]", u))
	}
	a, b := s.newDispatcher(s.connect(), s.prefs), s.newDispatcher(s.connect(), s.prefs)
	ctx := context.Background()
	a.Start(ctx)
	b.Start(ctx)
	defer a.Stop(ctx)
	defer b.Stop(ctx)
	for i := range events {
		s.ingest(fmt.Sprintf("e%d", i), "general", fmt.Sprintf("u%d", i%users))
	}
	testsignal.Eventually(t, "every push sent", 60*time.Second, func() bool { return len(s.fake.Messages()) >= 2*events })
	_ = a.Stop(ctx)
	_ = b.Stop(ctx)
	seen := map[string]int{}
	for _, m := range s.fake.Messages() {
		seen[m.To+" "+fmt.Sprint(m.Data["notification_id"])]++
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s pushed %d times", k, n)
		}
	}
	if len(seen) != 2*events {
		t.Errorf("%d distinct pushes; want %d (every notification to each device, once)", len(seen), 2*events)
	}
}

func TestAPreferenceServiceThatIsDownFailsOpen(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	defer down.Close()
	ext, err := preferences.NewExternal(preferences.ExternalConfig{URL: down.URL, Token: func() (string, error) { return "t", nil }, Metrics: s.prefsMetrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.dispatcher = s.newDispatcher(s.pool, ext)
	s.register("u1", "ExponentPushToken[a]")
	s.ingest("e1", "billing", "u1")
	s.drain()
	if n := len(s.fake.Messages()); n != 1 {
		t.Errorf("pushes with the preference service down = %d, want 1 (fail open)", n)
	}
	if got := s.counter("spoolcast_prefs_lookups_total", "result", "fail_open"); got != 1 {
		t.Errorf("fail_open lookups = %v, want 1", got)
	}
	// A failure is never cached: the service back up is asked again.
	s.ingest("e2", "billing", "u1")
	s.drain()
	if got := s.counter("spoolcast_prefs_lookups_total", "result", "fail_open"); got != 2 {
		t.Errorf("fail_open lookups = %v, want 2: a failure was cached", got)
	}
}

func TestAnExternalPreferenceServiceIsAskedWithItsOwnScopeAndCached(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	var asked []string
	var mu sync.Mutex
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"categories":{"billing":{"push":false}}}`)
	}))
	defer svc.Close()
	ext, err := preferences.NewExternal(preferences.ExternalConfig{URL: svc.URL + "/prefs", Token: func() (string, error) { return "prefs-token", nil }, Metrics: s.prefsMetrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.dispatcher = s.newDispatcher(s.pool, ext)
	s.register("u1", "ExponentPushToken[a]")
	s.ingest("bill", "billing", "u1")
	s.ingest("meet", "meetings", "u1")
	s.drain()
	if n := len(s.fake.Messages()); n != 1 || s.fake.Messages()[0].Title != "Title meet" {
		t.Errorf("pushes = %+v; want only the meetings one", s.fake.Messages())
	}
	if len(asked) != 1 || asked[0] != "/prefs/u1 Bearer prefs-token" {
		t.Errorf("the service was asked %q; want once for u1 with the token", asked)
	}
}

func TestADisabledCategoryKeepsTheFeedRowAndSkipsThePush(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]")
	if _, err := s.prefs.Merge(context.Background(), "u1", preferences.Update{Categories: map[string]preferences.CategorySetting{"marketing": {Push: false}}}); err != nil {
		t.Fatal(err)
	}
	s.ingest("promo", "marketing", "u1")
	s.drain()
	if n := len(s.fake.Messages()); n != 0 {
		t.Errorf("%d pushes for a category turned off", n)
	}
	if page, _ := feed.NewStore(s.pool, nil).Page(context.Background(), feed.Query{UserID: "u1"}); len(page.Items) != 1 {
		t.Errorf("feed rows = %d, want the notification kept", len(page.Items))
	}
	if got := s.states(); got[push.StateSkipped] != 1 {
		t.Errorf("states = %v; want it recorded skipped", got)
	}
}

func TestAnUnregisteredDeviceIsDisabledAndRegisteringItAgainTurnsItOn(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[at-ticket]", "ExponentPushToken[at-receipt]", "ExponentPushToken[fine]")
	s.fake.Unregister("ExponentPushToken[at-ticket]")
	s.fake.UnregisterAtReceipt("ExponentPushToken[at-receipt]")
	s.ingest("e1", "general", "u1")
	s.drain()
	if s.enabled("ExponentPushToken[at-ticket]") {
		t.Error("a token whose ticket said DeviceNotRegistered is still enabled")
	}
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.enabled("ExponentPushToken[at-receipt]") || !s.enabled("ExponentPushToken[fine]") {
		t.Error("the token whose receipt said DeviceNotRegistered is enabled, or the fine one is not")
	}
	if got := s.states(); got[push.StateFailed] != 1 || got[push.StateReceiptError] != 1 || got[push.StateDelivered] != 1 {
		t.Errorf("states = %v; want one failed, one receipt_error, one delivered", got)
	}
	before := len(s.fake.Messages())
	s.ingest("e2", "general", "u1")
	s.drain()
	if sent := s.fake.Messages()[before:]; len(sent) != 1 || sent[0].To != "ExponentPushToken[fine]" {
		t.Errorf("the next event pushed to %+v; want only the fine device", sent)
	}
	s.register("u1", "ExponentPushToken[at-receipt]")
	if !s.enabled("ExponentPushToken[at-receipt]") {
		t.Error("registering a disabled token again did not turn it on")
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", devices.DisabledUnreachable); got != 2 {
		t.Errorf("tokens disabled as unreachable = %v, want 2", got)
	}
}

// Expo's documentation asks for a 5xx to be retried with backoff: it took
// nothing. The push is sent again, taken once, and delivered.
func TestAPushExpoAnswered5xxIsSentAgainAndDeliveredOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]")
	s.fake.Fail(1, http.StatusInternalServerError, "")
	s.ingest("e1", "general", "u1")
	s.drain()
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.states(); got[push.StateDelivered] != 1 || len(got) != 1 {
		t.Errorf("states after a 500, then ok = %v; want delivered", got)
	}
	if n, m := s.fake.Requests("send"), s.fake.Accepted(); n != 2 || m != 1 {
		t.Errorf("%d sends and %d messages taken; want 2 and 1", n, m)
	}
}

// Expo answering 5xx for longer than a dispatch's lease ends it failed,
// saying Expo took nothing; ingest is unaffected.
func TestExpoFailingPastTheLeaseEndsDispatchesFailedAndIngestGoesOn(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	client := s.expoClient(expo.Config{HTTP: &http.Client{Timeout: 100 * time.Millisecond}, RatePerSecond: -1, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: client, Preferences: s.prefs, Devices: s.devices,
		Lease: time.Second, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.dispatcher = d
	s.register("u1", "ExponentPushToken[a]")
	s.fake.SetFailing(http.StatusInternalServerError, "")
	start := time.Now()
	s.ingest("e1", "general", "u1")
	s.drain()
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the pass took %s with a lease of 1s", took)
	}
	log, err := push.Deliveries(context.Background(), s.pool, push.DeliveryQuery{UserID: "u1"})
	if err != nil || len(log.Data) != 1 {
		t.Fatalf("delivery log = %+v, %v; want the one dispatch", log.Data, err)
	}
	if dl := log.Data[0]; dl.State != push.StateFailed || dl.Error == nil || !strings.Contains(*dl.Error, "expo: 500") || !strings.Contains(*dl.Error, "took nothing") {
		t.Errorf("the dispatch is %s, error %v; want failed, saying Expo took nothing", dl.State, dl.Error)
	}
	if n := s.fake.Requests("send"); n < 3 {
		t.Errorf("sends = %d; want it tried again within the lease", n)
	}
	s.ingest("e2", "general", "u1") // ingest is unaffected
	if page, _ := feed.NewStore(s.pool, nil).Page(context.Background(), feed.Query{UserID: "u1"}); len(page.Items) != 2 {
		t.Errorf("feed rows = %d, want 2", len(page.Items))
	}
}

func TestAReceiptNotReadyStaysSentForALaterPass(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]")
	s.ingest("e1", "general", "u1")
	s.drain()
	s.fake.HoldReceipts(1)
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.states(); got[push.StateSent] != 1 {
		t.Fatalf("states with the receipt not ready = %v; want still sent", got)
	}
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.states(); got[push.StateDelivered] != 1 {
		t.Errorf("states on the next pass = %v; want delivered", got)
	}
}

func TestATicketWithNoReceiptAfterTheReceiptWindowEndsReceiptMissing(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now()) // Postgres stamps sent_at with its own now(): start there
	s := newStackOn(t, clk)
	s.register("u1", "ExponentPushToken[a]")
	s.fake.HoldReceipts(math.MaxInt) // Expo never has this receipt ready
	s.ingest("e1", "general", "u1")
	s.drain()
	if got := s.states(); got[push.StateSent] != 1 {
		t.Fatalf("states after sending = %v; want 1 sent", got)
	}
	ctx := context.Background()
	s.receipts.Start(ctx)
	t.Cleanup(func() {
		if err := s.receipts.Stop(ctx); err != nil {
			t.Errorf("stop the reconciler: %v", err)
		}
	})
	// The reconciler's only timer is its wait for the next pass: each new one
	// says the pass before it has ended.
	waitForTheNextPass := func() {
		t.Helper()
		select {
		case <-clk.TimerAdded():
		case <-time.After(30 * time.Second):
			t.Fatal("the reconciler is not waiting for a pass")
		}
	}
	waitForTheNextPass() // the first pass waits an interval
	for elapsed := time.Hour; elapsed < 24*time.Hour; elapsed += time.Hour {
		clk.Advance(time.Hour) // past the interval: one pass
		waitForTheNextPass()
		if got := s.states(); got[push.StateSent] != 1 {
			t.Fatalf("states %s after sending = %v; want still sent within the receipt window", elapsed, got)
		}
	}
	if n := s.fake.Requests("getReceipts"); n != 23 {
		t.Errorf("receipt requests within the window = %d; want one a pass (23)", n)
	}
	clk.Advance(time.Hour + time.Minute) // 24h01m after sending
	waitForTheNextPass()
	log, err := push.Deliveries(ctx, s.pool, push.DeliveryQuery{UserID: "u1"})
	if err != nil || len(log.Data) != 1 {
		t.Fatalf("delivery log = %+v, %v; want the one dispatch", log.Data, err)
	}
	if d := log.Data[0]; d.State != push.StateReceiptMissing || d.Error == nil || *d.Error != "no receipt within the receipt window" {
		t.Errorf("after the receipt window the dispatch is %s (error %v); want receipt_missing, no receipt within the receipt window", d.State, d.Error)
	}
	if got := s.counter("spoolcast_push_receipts_total", "status", "missing"); got != 1 {
		t.Errorf("missing receipts counted = %v, want 1", got)
	}
}

func TestDevicesAreValidatedSoftDisabledAndFollowTheirOwner(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	for _, bad := range []string{"", "abc", "ExponentPushToken[]", "ExponentPushToken[a b]", "FCM:xyz"} {
		if _, err := s.devices.Register(ctx, "u1", bad, devices.IOS); err == nil {
			t.Errorf("token %q was accepted", bad)
		}
	}
	s.register("u1", "ExponentPushToken[phone]")
	if err := s.devices.Disable(ctx, "u2", "ExponentPushToken[phone]"); err == nil {
		t.Error("another user disabled u1's token")
	}
	if err := s.devices.Disable(ctx, "u1", "ExponentPushToken[phone]"); err != nil {
		t.Fatal(err)
	}
	devs, _ := s.devices.List(ctx, "u1")
	if len(devs) != 1 || devs[0].Enabled || devs[0].DisabledReason == nil || *devs[0].DisabledReason != devices.DisabledByUser {
		t.Fatalf("u1's devices = %+v; want the token kept, disabled, with its reason", devs)
	}
	s.register("u2", "ExponentPushToken[phone]") // the phone changed hands
	if devs, _ := s.devices.List(ctx, "u1"); len(devs) != 0 {
		t.Errorf("u1 still lists a phone now u2's: %+v", devs)
	}
	if devs, _ := s.devices.List(ctx, "u2"); len(devs) != 1 || !devs[0].Enabled {
		t.Errorf("u2's devices = %+v; want the phone, enabled", devs)
	}
}

func TestMessagesOverExposLimitAreShortenedNotLost(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[a]")
	long := strings.Repeat("é", 2000) // 4,000 bytes
	ev, err := event.Decode([]byte(`{"idempotency_key":"long","type":"t","recipients":["u1"],"title":"`+strings.Repeat("t", 1000)+`","body":"`+long+`"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.Ingest(context.Background(), s.pool, []ingest.Item{{Producer: "p", Event: ev}}); err != nil {
		t.Fatal(err)
	}
	s.drain()
	msgs := s.fake.Messages()
	if len(msgs) != 1 {
		t.Fatalf("pushes = %d, want 1", len(msgs))
	}
	if size, _ := expo.Size(msgs[0]); size > expo.MaxMessageBytes || !strings.HasSuffix(msgs[0].Body, "…") {
		t.Errorf("message of %d bytes, body ending %q; want it shortened under 4096 bytes", size, msgs[0].Body[len(msgs[0].Body)-6:])
	}
}
