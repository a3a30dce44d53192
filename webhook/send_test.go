package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/webhook"
)

// A Retry-After holds the next attempt whatever failed answer carries it:
// Standard Webhooks names 503 only as an example, and RFC 9110 gives it a
// meaning on 3xx too.
func TestARetryAfterOnAnyFailedAnswerHoldsTheNextAttempt(t *testing.T) {
	for _, status := range []int{http.StatusMovedPermanently, http.StatusBadRequest, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			e := newEnv(t, webhook.DelivererConfig{})
			r := newReceiver(t)
			r.set(status, 0)
			r.mu.Lock()
			r.headers = http.Header{"Retry-After": {"7200"}}
			r.mu.Unlock()
			e.endpoint(r.URL, webhook.NotificationCreated)
			e.ingest("k", "alice")
			e.pass()
			var wait time.Duration
			if err := e.pool.QueryRow(context.Background(),
				`SELECT next_attempt_at - last_attempt_at FROM webhook_deliveries`).Scan(&wait); err != nil {
				t.Fatal(err)
			}
			if wait < 2*time.Hour {
				t.Errorf("a %d with Retry-After: 7200 is due again after %s, want 2h", status, wait)
			}
		})
	}
}

// A 410 Gone disables its endpoint even when another attempt recorded with
// it succeeded: the receiver said it wants no more, whatever it answered a
// moment before (a receiver being retired behind a load balancer answers
// both at once).
func TestGoneDisablesEvenBesideASuccess(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	var mu sync.Mutex
	answered := 0
	r.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		answered++
		first := answered == 1
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusGone)
	})
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice", "bob") // two deliveries, recorded together
	e.pass()
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 2 {
		t.Fatalf("%d attempts recorded, want both in one pass", n)
	}
	got, err := e.store.Get(context.Background(), ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Enabled || got.DisabledReason == nil || !strings.Contains(*got.DisabledReason, "410") {
		t.Errorf("after a 204 and a 410: enabled %v, reason %v; want disabled for the 410", got.Enabled, got.DisabledReason)
	}
}

// passOnce runs one pass and waits for its attempts.
func (e *env) passOnce() {
	e.t.Helper()
	if _, err := e.d.Pass(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.d.Wait()
}

// A receiver that says it is overloaded (429, or a gateway's 502, 503, 504)
// gets no more requests from this replica until its Retry-After, or a few
// seconds without one, as Standard Webhooks asks ("throttle additional
// requests"); every other endpoint is sent to meanwhile.
func TestAnOverloadedReceiverIsSentNothingMoreUntilItsRetryAfter(t *testing.T) {
	for _, c := range []struct {
		status     int
		retryAfter string
		hold       time.Duration
	}{
		{http.StatusTooManyRequests, "60", time.Minute},
		{http.StatusTooManyRequests, "", 5 * time.Second},
		{http.StatusServiceUnavailable, "60", time.Minute},
		{http.StatusBadGateway, "30", 30 * time.Second},
		{http.StatusGatewayTimeout, "30", 30 * time.Second},
	} {
		t.Run(fmt.Sprint(c.status, " Retry-After ", c.retryAfter), func(t *testing.T) {
			e := newEnv(t, webhook.DelivererConfig{Concurrency: 8, PerEndpoint: 2})
			busy, other := newReceiver(t), newReceiver(t)
			busy.set(c.status, 0)
			if c.retryAfter != "" {
				busy.mu.Lock()
				busy.headers = http.Header{"Retry-After": {c.retryAfter}}
				busy.mu.Unlock()
			}
			e.endpoint(busy.URL, webhook.NotificationCreated)
			e.endpoint(other.URL, webhook.NotificationCreated)
			for i := range 3 {
				e.ingest(fmt.Sprintf("k%d", i), "alice", "bob") // 6 deliveries to each
			}
			e.passOnce()
			if n := busy.requested(); n != 2 {
				t.Fatalf("the first pass sent the busy receiver %d, want its share of 2", n)
			}
			e.passOnce()
			e.clk.Advance(c.hold - time.Second)
			e.passOnce()
			if n := busy.requested(); n != 2 {
				t.Errorf("the busy receiver got %d requests before its hold of %s ended, want still 2", n, c.hold)
			}
			if n := len(other.deliveries()); n != 6 {
				t.Errorf("the other receiver got %d of its 6 meanwhile", n)
			}
			e.clk.Advance(time.Second)
			e.passOnce()
			if n := busy.requested(); n != 4 {
				t.Errorf("the busy receiver got %d requests after its hold, want 2 more", n)
			}
		})
	}
}

// A 502, 503 or 504 without a Retry-After puts off its own delivery only:
// the endpoint's other deliveries are sent at the next pass. A receiver
// that fails a few requests in a hundred is not held most of the time.
func TestAGatewayErrorWithoutRetryAfterDoesNotHoldTheEndpoint(t *testing.T) {
	for _, status := range []int{http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			e := newEnv(t, webhook.DelivererConfig{Concurrency: 8, PerEndpoint: 2})
			r := newReceiver(t)
			r.set(status, 0)
			e.endpoint(r.URL, webhook.NotificationCreated)
			for i := range 3 {
				e.ingest(fmt.Sprintf("k%d", i), "alice", "bob") // 6 deliveries
			}
			e.passOnce()
			e.passOnce()
			if n := r.requested(); n != 4 {
				t.Errorf("after two passes the receiver got %d requests, want 4: its share at each pass, never held", n)
			}
		})
	}
}

// A receiver that took a delivery but answered after the timeout gets it
// again with the same webhook-id: delivery is at least once, and receivers
// deduplicate on the id.
func TestADeliveryWhoseAnswerCameTooLateIsSentAgainWithTheSameID(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{Timeout: 200 * time.Millisecond})
	r := newReceiver(t)
	var mu sync.Mutex
	var ids []string
	r.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.ReadAll(req.Body) // read whole, so the server notices the sender hang up
		mu.Lock()
		ids = append(ids, req.Header.Get("webhook-id"))
		late := len(ids) == 1
		mu.Unlock()
		if late { // taken, but the answer comes after the sender gave up
			<-req.Context().Done()
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	e.pass()
	e.clk.Advance(time.Minute)
	e.pass()
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 2 || ids[0] != ids[1] || ids[0] == "" {
		t.Errorf("the receiver got webhook-ids %q, want one id twice", ids)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'`); n != 1 {
		t.Errorf("%d deliveries delivered, want 1", n)
	}
}
