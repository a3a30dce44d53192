package push_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/egress"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/webpushtest"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/push/webpush"
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
func (s *webStack) subscribe(user string, raw []byte) push.Device {
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
	if dev.Platform != push.Web || !push.IsWebToken(dev.Token) || strings.Contains(dev.Token, "127.0.0.1") {
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
	if err := s.pool.QueryRow(context.Background(), `SELECT disabled_reason FROM devices WHERE token = $1`, dev.Token).Scan(&reason); err != nil || reason != push.DisabledGone {
		t.Errorf("disabled_reason = %q (%v), want %s", reason, err, push.DisabledGone)
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
	time.Sleep(100 * time.Millisecond) // the slow one's send is in flight
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
	if _, why := s.stateOf(dev.Token); !strings.Contains(why, "unreachable again") {
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
	s := newWebStackWith(t, clk, func(c *push.DispatcherConfig) { c.Throttle = push.Throttle{Limit: 1, Window: time.Hour} })
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
	quiet, err := push.ParseQuietHours(push.QuietHours{Start: start.Format("15:04"), End: start.Add(10 * time.Minute).Format("15:04"), TimeZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.prefs.Merge(context.Background(), "u1", push.PreferencesUpdate{QuietHours: push.QuietHoursSetting{Set: true, Value: &quiet}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute) // past Retry-After, inside quiet hours
	s.drain()
	if n := len(svc.got()); n != 1 {
		t.Fatalf("%d requests to the push service during quiet hours, want the first alone", n)
	}
	if c := s.counter("spoolcast_push_policy_total", "outcome", push.PolicyDeferred); c != 1 {
		t.Errorf("policy deferred = %v, want 1", c)
	}
	clk.Advance(10 * time.Minute) // past their end
	s.drain()
	s.waitForState("the push to be delivered once quiet hours end", dev.Token, push.StateDelivered)
	if n := len(svc.got()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

func TestManySendsToAStalledPushServiceHoldNeitherThePhonesNorOtherBrowsers(t *testing.T) {
	t.Parallel()
	// 8 sends in flight and 16 started or waiting, three quarters of each for one push service origin.
	s := newWebStackWith(t, nil, func(c *push.DispatcherConfig) { c.WebConcurrency = 8 })
	slow := newPushService(t, time.Second, http.StatusCreated)
	fast := newPushService(t, 0, http.StatusCreated)
	const stalled = 16
	var users []string
	for i := range stalled {
		u := fmt.Sprintf("u-slow-%d", i)
		users = append(users, u)
		s.subscribe(u, fakeSubscription(t, fmt.Sprintf("%s/push/%d", slow.URL, i)))
	}
	fastDev := s.subscribe("u-fast", fakeSubscription(t, fast.URL+"/push/fast"))
	s.register("u-fast", "ExponentPushToken[fast-phone]")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.dispatcher.Start(ctx)
	s.emit(fmt.Sprintf(`{"idempotency_key":"s1","type":"t","recipients":["%s"],"title":"Slow"}`, strings.Join(users, `","`)))
	testsignal.Eventually(t, "the stalled push service's share to be in flight", 10*time.Second, func() bool { return len(slow.got()) >= 2 })
	start := time.Now()
	s.emit(`{"idempotency_key":"f1","type":"t","recipients":["u-fast"],"title":"Fast"}`)
	testsignal.Eventually(t, "the fast browser and the phone to get theirs", 10*time.Second, func() bool {
		st, _ := s.stateOf(fastDev.Token)
		return st == push.StateDelivered && len(s.fake.Messages()) == 1
	})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the fast pushes took %s behind %d sends to a push service stalled 1 s each", took, stalled)
	}
	// The stalled service's pushes all go out in the end, each once.
	testsignal.Eventually(t, "every stalled push to be delivered", 30*time.Second, func() bool {
		return pgtest.Count(t, s.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'delivered'`) == stalled+1
	})
	if n := len(slow.got()); n != stalled {
		t.Errorf("the stalled push service got %d requests, want %d (one each)", n, stalled)
	}
	if n := s.counter("spoolcast_webpush_busy_total"); n == 0 {
		t.Error("no dispatch was given back for a busy push service; the test did not reach the bound")
	}
}

func TestAPushEndpointOnAPrivateAddressFailsAtOnce(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	// The deployment's egress client, which refuses private addresses when
	// it connects (the endpoint's name resolved elsewhere when registered).
	s := newWebStackWith(t, clk, func(c *push.DispatcherConfig) {
		c.WebPush, _ = newWebSender(t, egress.Client(5*time.Second, false, 4))
	})
	svc := newPushService(t, 0, http.StatusCreated)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"p1","type":"t","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the push to end", dev.Token, push.StateFailed, push.StateDeferred)
	if st, why := s.stateOf(dev.Token); st != push.StateFailed || !strings.Contains(why, "refused") {
		t.Errorf("a push to a private address: %s %q, want failed at once (it is refused at every try)", st, why)
	}
	if n := len(svc.got()); n != 0 {
		t.Errorf("the push service on a private address got %d requests", n)
	}
}

// A push service that answers 5xx did not take the message (it takes one
// with a 201): it is sent again with backoff, and taken once.
func TestAWebPushAPushServiceAnswered5xxIsSentAgainAndTakenOnce(t *testing.T) {
	t.Parallel()
	s := newWebStack(t, nil)
	svc := newPushService(t, 0, http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusCreated)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"k1","type":"t","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the push to be delivered", dev.Token, push.StateDelivered, push.StateFailed)
	if st, why := s.stateOf(dev.Token); st != push.StateDelivered {
		t.Errorf("the push answered 500 and 503, then 201, ended %s (%s), want delivered", st, why)
	}
	if n := len(svc.got()); n != 3 {
		t.Errorf("%d requests, want 3: two refused, one taken", n)
	}
}

// A push service that took a message whole and dropped the connection
// before answering may have delivered it: it is not sent again.
func TestAWebPushWhoseAnswerWasLostAfterItWasWrittenIsNotSentAgain(t *testing.T) {
	t.Parallel()
	s := newWebStack(t, nil)
	var requests atomic.Int32
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		panic(http.ErrAbortHandler) // the connection is dropped, unanswered
	}))
	t.Cleanup(svc.Close)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"k1","type":"t","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the push to end", dev.Token, push.StateFailed, push.StateDelivered, push.StateDeferred)
	if st, why := s.stateOf(dev.Token); st != push.StateFailed || !strings.Contains(why, "outcome unknown") {
		t.Errorf("the push whose answer was lost is %s (%s), want failed, outcome unknown", st, why)
	}
	for range 3 {
		s.drain()
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

// A connection refused took nothing: the push is sent again (after a pause,
// once), and delivered once.
func TestAWebPushWhoseConnectionWasRefusedIsSentAgain(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	var dials atomic.Int32
	var d net.Dialer
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		return d.DialContext(ctx, network, addr)
	}}}
	s := newWebStackWith(t, clk, func(c *push.DispatcherConfig) { c.WebPush, _ = newWebSender(t, client) })
	svc := newPushService(t, 0, http.StatusCreated)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"k1","type":"t","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the refused push to be deferred", dev.Token, push.StateDeferred)
	clk.Advance(31 * time.Second)
	s.drain()
	s.waitForState("the push sent again to be delivered", dev.Token, push.StateDelivered)
	if n := len(svc.got()); n != 1 {
		t.Errorf("%d requests reached the push service, want 1", n)
	}
}

// One user registers the device cap's 20 subscriptions on two push service
// origins they control, which take every request and never answer: their
// sends wait out the timeout, and their user's share of the sends is all
// they hold. Another user's browser push goes out at once.
func TestAUsersStalledSubscriptionsHoldNoOtherUsersBrowserPush(t *testing.T) {
	t.Parallel()
	s := newWebStack(t, nil) // the default concurrency, a 5 s timeout
	stalledA := newPushService(t, time.Minute, http.StatusCreated)
	stalledB := newPushService(t, time.Minute, http.StatusCreated)
	fast := newPushService(t, 0, http.StatusCreated)
	for i := range 20 {
		origin := []*pushService{stalledA, stalledB}[i%2]
		s.subscribe("u-stall", fakeSubscription(t, fmt.Sprintf("%s/push/%d", origin.URL, i)))
	}
	fastDev := s.subscribe("u-fast", fakeSubscription(t, fast.URL+"/push/fast"))
	for i := range 5 {
		s.emit(fmt.Sprintf(`{"idempotency_key":"s%d","type":"t","recipients":["u-stall"],"title":"Stalled"}`, i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.dispatcher.Start(ctx)
	stalled := func() int { return len(stalledA.got()) + len(stalledB.got()) }
	testsignal.Eventually(t, "the stalled user's sends to be in flight, and some given back as busy", 10*time.Second, func() bool {
		return stalled() > 0 && s.counter("spoolcast_webpush_busy_total") > 0
	})
	start := time.Now()
	s.emit(`{"idempotency_key":"f1","type":"t","recipients":["u-fast"],"title":"Fast"}`)
	var took time.Duration
	testsignal.Eventually(t, "the other user's push to reach its push service", 15*time.Second, func() bool {
		took = time.Since(start)
		return len(fast.got()) > 0
	})
	s.waitForState("the other user's push to be delivered", fastDev.Token, push.StateDelivered)
	t.Logf("the other user's push reached its push service in %s; %d requests to the stalled origins in flight or timed out; %v busy give-backs",
		took.Round(time.Millisecond), stalled(), s.counter("spoolcast_webpush_busy_total"))
	if took > 2*time.Second {
		t.Errorf("the other user's push took %s behind one user's stalled subscriptions", took)
	}
	if n := len(fast.got()); n != 1 {
		t.Errorf("the other user's push service got %d requests, want 1", n)
	}
	// A stop cuts off the stalled sends and waits for them to be recorded.
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer stopCancel()
	_ = s.dispatcher.Stop(stopCtx)
}

// While Expo answers 5xx, one pass keeps trying it, as Expo asks, for as
// long as its lease allows; it holds one worker, never all of them: the
// browsers' pushes of the next notifications go on, and a phone's push
// Expo did not take waits in the queue meanwhile. Once Expo answers again,
// every phone gets its push once.
func TestAnExpoOutageHoldsOneWorkerAndTheBrowsersPushesGoOn(t *testing.T) {
	t.Parallel()
	s := newWebStack(t, nil) // two workers
	fast := newPushService(t, 0, http.StatusCreated)
	s.register("u1", "ExponentPushToken[u1]")
	s.register("u2", "ExponentPushToken[u2]")
	browser2 := s.subscribe("u2", fakeSubscription(t, fast.URL+"/push/u2"))
	browser3 := s.subscribe("u3", fakeSubscription(t, fast.URL+"/push/u3"))
	s.fake.SetFailing(http.StatusInternalServerError, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.dispatcher.Start(ctx)
	s.emit(`{"idempotency_key":"n1","type":"t","recipients":["u1"],"title":"One"}`)
	testsignal.Eventually(t, "a pass to be trying Expo again", 10*time.Second, func() bool { return s.fake.Requests("send") > 5 })
	start := time.Now()
	s.emit(`{"idempotency_key":"n2","type":"t","recipients":["u2"],"title":"Two"}`)
	s.waitForState("u2's browser push to be delivered", browser2.Token, push.StateDelivered)
	s.emit(`{"idempotency_key":"n3","type":"t","recipients":["u3"],"title":"Three"}`)
	s.waitForState("u3's browser push to be delivered", browser3.Token, push.StateDelivered)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the browsers' pushes took %s while Expo failed", took)
	}
	s.fake.SetFailing(0, "")
	testsignal.Eventually(t, "every phone's push to be taken", 20*time.Second, func() bool { return s.fake.Accepted() >= 2 })
	seen := map[string]int{}
	for _, m := range s.fake.Messages() {
		seen[m.To]++
	}
	if seen["ExponentPushToken[u1]"] != 1 || seen["ExponentPushToken[u2]"] != 1 || len(seen) != 2 {
		t.Errorf("Expo took %v, want each phone's push once", seen)
	}
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer stopCancel()
	_ = s.dispatcher.Stop(stopCtx)
}
