package push_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/webpush"
	"github.com/spoolcast/spoolcast/channel/webpush/webpushtest"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/push/policy"
	"github.com/spoolcast/spoolcast/schedule"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// webStack is a stack whose dispatcher also sends Web Push, signed with key.
type webStack struct {
	*stack
	key *webpush.VAPIDKey
}

func newWebStack(t *testing.T, clk clock.Clock) *webStack {
	t.Helper()
	return newWebStackWith(t, clk, nil)
}

// newWebStackWith is newWebStack with its dispatcher's config changed by set.
func newWebStackWith(t *testing.T, clk clock.Clock, set func(*push.DispatcherConfig)) *webStack {
	t.Helper()
	s := newStackOn(t, clk)
	sender, key := newWebSender(t, nil)
	cfg := push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		WebPush: sender, WebTimeout: 5 * time.Second, Interval: 20 * time.Millisecond, Clock: clk, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)}
	if set != nil {
		set(&cfg)
	}
	var err error
	if s.dispatcher, err = push.NewDispatcher(cfg); err != nil {
		t.Fatal(err)
	}
	return &webStack{stack: s, key: key}
}

// newWebSender is a Web Push sender with a fresh VAPID key, over client
// (nil: the sender's default).
func newWebSender(t *testing.T, client *http.Client) (*webpush.Sender, *webpush.VAPIDKey) {
	t.Helper()
	pem, err := webpush.GenerateVAPIDKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	key, err := webpush.LoadVAPIDKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	sender, err := webpush.NewSender(key, "mailto:ops@example.com", client)
	if err != nil {
		t.Fatal(err)
	}
	return sender, key
}

// subscribe registers a browser subscription (PushSubscription.toJSON()) for user.
func (s *webStack) subscribe(user string, raw []byte) devices.Device {
	s.t.Helper()
	sub, err := webpush.ParseSubscription(raw)
	if err != nil {
		s.t.Fatal(err)
	}
	dev, err := s.devices.RegisterWeb(context.Background(), user, sub)
	if err != nil {
		s.t.Fatal(err)
	}
	return dev
}

// emit ingests one event as JSON.
func (s *webStack) emit(body string) {
	s.t.Helper()
	ev, err := event.Decode([]byte(body), "")
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := ingest.Ingest(context.Background(), s.pool, []ingest.Item{{Producer: "p", Event: ev}}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *webStack) stateOf(token string) (state, errText string) {
	s.t.Helper()
	var e *string
	err := s.pool.QueryRow(context.Background(), `SELECT state, error FROM push_dispatches WHERE token = $1 ORDER BY id DESC LIMIT 1`, token).Scan(&state, &e)
	if err != nil {
		return "", err.Error()
	}
	if e != nil {
		errText = *e
	}
	return state, errText
}

// waitForState waits until the newest dispatch to token is in one of states.
func (s *webStack) waitForState(what, token string, states ...string) {
	s.t.Helper()
	testsignal.Eventually(s.t, what, 10*time.Second, func() bool {
		st, _ := s.stateOf(token)
		return slices.Contains(states, st)
	})
}

// fakeSubscription is what a browser would give for endpoint, with real keys.
func fakeSubscription(t *testing.T, endpoint string) []byte {
	t.Helper()
	// Any valid P-256 point and 16 bytes serve a push service stand-in that
	// does not decrypt.
	return fmt.Appendf(nil, `{"endpoint":%q,"expirationTime":null,"keys":{"p256dh":"BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM","auth":"tBHItJI5svbpez7KI4CCXg"}}`, endpoint)
}

func TestABrowserGetsEachPushEncryptedBesideThePhones(t *testing.T) {
	t.Parallel()
	s := newWebStack(t, nil)
	svc := webpushtest.Start(t)
	raw, hash := svc.Subscribe(t, s.key.PublicKey())
	dev := s.subscribe("u1", raw)
	if dev.Platform != devices.Web || !devices.IsWebToken(dev.Token) || strings.Contains(dev.Token, "127.0.0.1") {
		t.Fatalf("registered %+v: want platform web and a WebPush[…] token that hides the endpoint", dev)
	}
	if again := s.subscribe("u1", raw); again.Token != dev.Token {
		t.Errorf("the same subscription registered again is %s, was %s", again.Token, dev.Token)
	}
	s.register("u1", "ExponentPushToken[phone]")
	s.emit(`{"idempotency_key":"k1","type":"t","category":"builds","recipients":["u1"],"title":"Build finished","body":"spoolcast#1234 passed","priority":"critical"}`)
	s.drain()
	s.waitForState("the web push to be recorded", dev.Token, push.StateDelivered)
	msgs := svc.Messages(t, hash)
	if len(msgs) != 1 {
		t.Fatalf("the push service decrypted %d messages, want 1", len(msgs))
	}
	var p struct {
		Title, Body string
		Data        map[string]any
	}
	if err := json.Unmarshal([]byte(msgs[0]), &p); err != nil || p.Title != "Build finished" || p.Body != "spoolcast#1234 passed" || p.Data["category"] != "builds" || p.Data["notification_id"] == "" {
		t.Errorf("decrypted payload %s (%v)", msgs[0], err)
	}
	if n := len(s.fake.Messages()); n != 1 {
		t.Errorf("Expo got %d messages, want the phone's 1", n)
	}
	if n := s.counter("spoolcast_webpush_sent_total", "outcome", "delivered"); n != 1 {
		t.Errorf("spoolcast_webpush_sent_total{outcome=delivered} = %v", n)
	}

	// The browser unsubscribed: the push service answers 410, and the
	// subscription is disabled with its own reason.
	svc.Expire(t, hash)
	s.emit(`{"idempotency_key":"k2","type":"t","category":"builds","recipients":["u1"],"title":"Again"}`)
	s.drain()
	testsignal.Eventually(t, "the gone subscription to be disabled", 10*time.Second, func() bool { return !s.enabled(dev.Token) })
	var reason string
	if err := s.pool.QueryRow(context.Background(), `SELECT disabled_reason FROM devices WHERE token = $1`, dev.Token).Scan(&reason); err != nil || reason != devices.DisabledGone {
		t.Errorf("disabled_reason = %q (%v), want %s", reason, err, devices.DisabledGone)
	}
	if st, why := s.stateOf(dev.Token); st != push.StateFailed || !strings.Contains(why, "gone") {
		t.Errorf("the push to a gone subscription: %s %q", st, why)
	}
}

// pushService is a Web Push service stand-in for failure modes: it answers
// each request with the next of its answers (the last repeats), after stall.
type pushService struct {
	*httptest.Server
	mu       sync.Mutex
	answers  []int
	stall    time.Duration
	requests []http.Header
}

func newPushService(t *testing.T, stall time.Duration, answers ...int) *pushService {
	p := &pushService{answers: answers, stall: stall}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.requests = append(p.requests, r.Header.Clone())
		code := p.answers[min(len(p.requests), len(p.answers))-1]
		p.mu.Unlock()
		// Read whole, so that the server sees the client go away while it stalls.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(p.stall):
		case <-r.Context().Done():
			return
		}
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "60")
		}
		if code == http.StatusCreated {
			w.Header().Set("Location", p.URL+"/m/1")
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *pushService) got() []http.Header {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]http.Header(nil), p.requests...)
}

func TestARateLimitedWebPushIsSentAgainAfterRetryAfterOnce(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newWebStack(t, clk)
	svc := newPushService(t, 0, http.StatusTooManyRequests, http.StatusCreated)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"r1","type":"t","category":"c","recipients":["u1"],"title":"Hi","digest":{"key":"room-1","window":"10s"}}`)
	// The digest's window, then its push.
	s.drain()
	clk.Advance(11 * time.Second)
	if _, _, err := newFirer(t, s.pool, clk).Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.drain()
	s.waitForState("the 429 to defer the push", dev.Token, push.StateDeferred)
	if _, why := s.stateOf(dev.Token); !strings.Contains(why, "429") {
		t.Errorf("deferred because %q", why)
	}
	// Not before Retry-After.
	clk.Advance(30 * time.Second)
	s.drain()
	if n := len(svc.got()); n != 1 {
		t.Fatalf("%d requests before Retry-After passed, want 1", n)
	}
	clk.Advance(31 * time.Second)
	s.drain()
	s.waitForState("the push sent again to be delivered", dev.Token, push.StateDelivered)
	reqs := svc.got()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	h := reqs[1]
	if h.Get("TTL") != fmt.Sprint(int(push.DefaultWebTTL.Seconds())) || h.Get("Urgency") != "normal" || h.Get("Topic") == "" ||
		h.Get("Content-Encoding") != "aes128gcm" || !strings.HasPrefix(h.Get("Authorization"), "vapid t=") {
		t.Errorf("headers of the digest's push: %v", h)
	}
}

func TestASlowPushServiceHoldsOnlyItsOwnSends(t *testing.T) {
	t.Parallel()
	s := newWebStack(t, nil)
	slow := newPushService(t, 3*time.Second, http.StatusCreated)
	fast := newPushService(t, 0, http.StatusCreated)
	slowDev := s.subscribe("u-slow", fakeSubscription(t, slow.URL+"/push/slow"))
	fastDev := s.subscribe("u-fast", fakeSubscription(t, fast.URL+"/push/fast"))
	s.register("u-fast", "ExponentPushToken[fast-phone]")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.dispatcher.Start(ctx)
	s.emit(`{"idempotency_key":"s1","type":"t","recipients":["u-slow"],"title":"Slow"}`)
	testsignal.Eventually(t, "the slow push's send to be in flight", 10*time.Second, func() bool {
		st, _ := s.stateOf(slowDev.Token)
		return st == push.StateQueued
	})
	var fastAt atomic.Int64
	start := time.Now()
	s.emit(`{"idempotency_key":"f1","type":"t","recipients":["u-fast"],"title":"Fast"}`)
	testsignal.Eventually(t, "the fast browser and phone to get theirs", 10*time.Second, func() bool {
		st, _ := s.stateOf(fastDev.Token)
		if st == push.StateDelivered && len(s.fake.Messages()) == 1 {
			fastAt.Store(int64(time.Since(start)))
			return true
		}
		return false
	})
	if st, _ := s.stateOf(slowDev.Token); st != push.StateQueued {
		t.Errorf("the slow push is %s already; the test did not hold it", st)
	}
	if took := time.Duration(fastAt.Load()); took > 2*time.Second {
		t.Errorf("the fast pushes took %s behind a push service stalled 3 s", took)
	}
	// A graceful stop waits for the slow send and records it.
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer stopCancel()
	if err := s.dispatcher.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.stateOf(slowDev.Token); st != push.StateDelivered {
		t.Errorf("after a graceful stop the slow push is %s, want delivered", st)
	}
}

func newFirer(t *testing.T, pool schedule.DB, clk clock.Clock) *schedule.Firer {
	t.Helper()
	f, err := schedule.New(schedule.Config{DB: pool, Clock: clk, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestAnUnreachablePushServiceIsTriedOnceMoreAfterAPauseThenFailed(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newWebStack(t, clk)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // connections refused: the request never reaches it
	dev := s.subscribe("u1", fakeSubscription(t, closed.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"u1","type":"t","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the unreachable push to be deferred", dev.Token, push.StateDeferred)
	if _, why := s.stateOf(dev.Token); !strings.Contains(why, "unreachable") {
		t.Errorf("deferred because %q", why)
	}
	// Not tried again at every pass.
	for range 5 {
		s.drain()
	}
	clk.Advance(10 * time.Second)
	s.drain()
	if n := s.counter("spoolcast_webpush_sent_total", "outcome", "not_sent"); n != 1 {
		t.Fatalf("%v tries before the pause ended, want 1", n)
	}
	clk.Advance(21 * time.Second)
	s.drain()
	s.waitForState("the second try to end failed", dev.Token, push.StateFailed)
	if _, why := s.stateOf(dev.Token); !strings.Contains(why, "unreachable") || !strings.Contains(why, "deferred once already") {
		t.Errorf("failed because %q", why)
	}
	if n := s.counter("spoolcast_webpush_sent_total", "outcome", "not_sent"); n != 2 {
		t.Errorf("%v tries in all, want 2", n)
	}
	if !s.enabled(dev.Token) {
		t.Error("an unreachable push service disabled the subscription; only 404/410 say it is gone")
	}
}

func TestAPushSentAgainAfterA429IsNotThrottledByItsOwnFirstTry(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newWebStackWith(t, clk, func(c *push.DispatcherConfig) { c.Throttle = policy.Throttle{Limit: 1, Window: time.Hour} })
	svc := newPushService(t, 0, http.StatusTooManyRequests, http.StatusCreated)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"t1","type":"t","category":"c","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the 429 to defer the push", dev.Token, push.StateDeferred)
	clk.Advance(61 * time.Second)
	s.drain()
	s.waitForState("the push sent again to be delivered", dev.Token, push.StateDelivered, push.StateThrottled)
	if st, why := s.stateOf(dev.Token); st != push.StateDelivered {
		t.Errorf("the push sent again after Retry-After ended %s (%s), want delivered: one notification is one push under the throttle", st, why)
	}
	if n := len(svc.got()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

// A push decided, then deferred by a 429, that comes again in quiet hours
// which began meanwhile waits for them to end: its policies are not decided
// again (the throttle counted it once), but quiet hours still hold it.
func TestAPushSentAgainAfterA429WaitsOutQuietHoursThatBeganMeanwhile(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now().UTC().Truncate(time.Minute).Add(30 * time.Second))
	s := newWebStackWith(t, clk, nil)
	svc := newPushService(t, 0, http.StatusTooManyRequests, http.StatusCreated)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"q1","type":"t","category":"c","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the 429 to defer the push", dev.Token, push.StateDeferred)
	// Quiet from the next minute, for ten minutes: they begin during the
	// 429's minute.
	start := clk.Now().Truncate(time.Minute).Add(time.Minute)
	quiet, err := policy.ParseQuietHours(policy.QuietHours{Start: start.Format("15:04"), End: start.Add(10 * time.Minute).Format("15:04"), TimeZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.prefs.Merge(context.Background(), "u1", preferences.Update{QuietHours: policy.QuietHoursSetting{Set: true, Value: &quiet}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute) // past Retry-After, inside quiet hours
	s.drain()
	if n := len(svc.got()); n != 1 {
		t.Fatalf("%d requests to the push service during quiet hours, want the first alone", n)
	}
	if c := s.counter("spoolcast_push_policy_total", "outcome", policy.Deferred); c != 1 {
		t.Errorf("policy deferred = %v, want 1", c)
	}
	clk.Advance(10 * time.Minute) // past their end
	s.drain()
	s.waitForState("the push to be delivered once quiet hours end", dev.Token, push.StateDelivered)
	if n := len(svc.got()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}
