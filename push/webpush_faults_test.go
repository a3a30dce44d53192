package push_test

// Web Push sends under a push service's faults: stalls, refusals,
// answers lost, an endpoint turned private, and an Expo outage beside them.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/egress"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/push"
)

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

// A gateway's 502 or 504 in front of a push service may hide a message the
// service took: not sent again, as APNs and FCM treat theirs, so that a
// push is shown at most once.
func TestAWebPushAGatewayAnswered502IsNotSentAgain(t *testing.T) {
	t.Parallel()
	s := newWebStack(t, nil)
	svc := newPushService(t, 0, http.StatusBadGateway, http.StatusCreated)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/abc"))
	s.emit(`{"idempotency_key":"k1","type":"t","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the push to end", dev.Token, push.StateDelivered, push.StateFailed)
	if st, why := s.stateOf(dev.Token); st != push.StateFailed || !strings.Contains(why, "outcome unknown") || !strings.Contains(why, "502") {
		t.Errorf("the push answered 502 ended %s (%q), want failed, outcome unknown, naming the 502", st, why)
	}
	if n := len(svc.got()); n != 1 {
		t.Errorf("%d requests, want 1: a 502 is not sent again", n)
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
