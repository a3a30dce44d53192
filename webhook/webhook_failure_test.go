package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/webhook"
)

func TestAFailingReceiverIsRetriedWithTheSameIDUntilItRecovers(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{Timeout: 200 * time.Millisecond})
	r := newReceiver(t)
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")

	r.set(500, 0)
	e.pass()
	r.set(0, time.Second) // stalls past the timeout
	e.clk.Advance(time.Hour)
	e.pass()
	r.set(http.StatusTooManyRequests, 0)
	r.mu.Lock()
	r.headers = http.Header{"Retry-After": {"7200"}}
	r.mu.Unlock()
	e.clk.Advance(time.Hour)
	e.pass()
	// Retry-After holds it: an hour on, it is not yet due.
	r.set(0, 0)
	e.clk.Advance(time.Hour)
	e.pass()
	if n := len(r.deliveries()); n != 0 {
		t.Fatalf("delivered %d times while Retry-After held it", n)
	}
	e.clk.Advance(2 * time.Hour)
	e.pass()
	got := r.deliveries()
	if len(got) != 1 {
		t.Fatalf("recovered receiver got %d deliveries, want 1", len(got))
	}
	// Signed at its own attempt's time, hours after the event: the
	// reference library (which allows 5 minutes of skew) checks it against
	// a clock that moved with ours, so only a signature made at send time passes.
	if v := verifyAt(t, ep.Secret, got, e.clk.Now()); !v[0].OK {
		t.Errorf("the recovered delivery does not verify: %s", v[0].Error)
	}
	var outcomes []string
	rows, err := e.pool.Query(context.Background(), `SELECT coalesce(status::text, 'none') || ' ' || coalesce(error, '') FROM webhook_attempts ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		rows.Scan(&s)
		outcomes = append(outcomes, s)
	}
	if len(outcomes) != 4 || !strings.HasPrefix(outcomes[0], "500") || !strings.Contains(outcomes[1], "no answer within") ||
		!strings.HasPrefix(outcomes[2], "429") || !strings.HasPrefix(outcomes[3], "204") {
		t.Errorf("attempt log = %q", outcomes)
	}
	var ids int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT delivery_id) FROM webhook_attempts`).Scan(&ids); err != nil || ids != 1 {
		t.Errorf("attempts span %d deliveries, want 1 (one webhook-id)", ids)
	}
	if n := e.count(`SELECT count(*) FROM webhook_endpoints WHERE failing_since IS NULL`); n != 1 {
		t.Error("a success did not clear the endpoint's failing_since")
	}
}

func TestRetriesEndFailedAfterTheRetryPeriodAndTheEndpointIsDisabledAfterDays(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{RetryFor: 72 * time.Hour, DisableAfter: 120 * time.Hour})
	r := newReceiver(t)
	r.set(503, 0)
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k1", "alice")
	attempts := 0
	for e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`) > 0 {
		e.pass()
		e.clk.Advance(time.Hour)
		if attempts++; attempts > 200 {
			t.Fatal("still pending after 200 hours")
		}
	}
	var state string
	var tries int
	var created, ended time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT state, attempts, created_at, ended_at FROM webhook_deliveries`).Scan(&state, &tries, &created, &ended); err != nil {
		t.Fatal(err)
	}
	if state != "failed" || ended.Sub(created) > 72*time.Hour+time.Minute || ended.Sub(created) < 60*time.Hour {
		t.Fatalf("delivery %s after %d attempts, ended %s after it was made; want failed within 72h", state, tries, ended.Sub(created))
	}
	if tries < 10 || tries > 40 {
		t.Errorf("%d attempts in 3 days: want exponential backoff, not a fixed beat", tries)
	}
	got, _ := e.store.Get(context.Background(), ep.ID)
	if !got.Enabled || got.FailingSince == nil {
		t.Fatalf("after 3 days failing: enabled %v, failing_since %v", got.Enabled, got.FailingSince)
	}
	// Two more days of failures: disabled, and says so.
	for range 60 {
		e.ingest(fmt.Sprintf("later-%d", attempts), "alice")
		attempts++
		e.pass()
		e.clk.Advance(time.Hour)
	}
	got, _ = e.store.Get(context.Background(), ep.ID)
	if got.Enabled || got.DisabledReason == nil || !strings.Contains(*got.DisabledReason, "every attempt failed since") {
		t.Fatalf("after 5 days failing: enabled %v, reason %v", got.Enabled, got.DisabledReason)
	}
	e.maintain() // ends a disabled endpoint's pending deliveries
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`); n != 0 {
		t.Errorf("%d deliveries still pending to a disabled endpoint", n)
	}
	e.ingest("while-disabled", "alice")
	if n := e.count(`SELECT count(*) FROM webhook_deliveries d WHERE d.payload->'data'->>'idempotency_key' = 'while-disabled'`); n != 0 {
		t.Error("a disabled endpoint's outbox grew")
	}

	// The receiver is back: a replay from the start sends everything again
	// and turns the endpoint on.
	r.set(200, 0)
	n, err := e.store.Replay(context.Background(), ep.ID, created.Add(-time.Second))
	if err != nil || n != int64(e.count(`SELECT count(*) FROM webhook_deliveries`)) {
		t.Fatalf("replay queued %d (%v), want every delivery", n, err)
	}
	e.pass()
	if got := len(r.deliveries()); got != int(n) {
		t.Errorf("replay delivered %d of %d", got, n)
	}
	got, _ = e.store.Get(context.Background(), ep.ID)
	if !got.Enabled || got.DisabledReason != nil {
		t.Errorf("after replay: enabled %v, reason %v", got.Enabled, got.DisabledReason)
	}
}

func TestGoneDisablesAtOnceAndRedirectsAreNotFollowed(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	elsewhere := newReceiver(t)
	redirect := newReceiver(t)
	redirect.set(http.StatusTemporaryRedirect, 0)
	redirect.mu.Lock()
	redirect.headers = http.Header{"Location": {elsewhere.URL}}
	redirect.mu.Unlock()
	e.endpoint(redirect.URL, webhook.NotificationCreated)
	gone := newReceiver(t)
	gone.set(http.StatusGone, 0)
	epGone := e.endpoint(gone.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	e.pass()
	if elsewhere.requests != 0 {
		t.Error("a redirect was followed")
	}
	if n := e.count(`SELECT count(*) FROM webhook_attempts WHERE status = 307 AND error LIKE '%not followed%'`); n != 1 {
		t.Errorf("%d attempts logged as a redirect not followed, want 1", n)
	}
	got, _ := e.store.Get(context.Background(), epGone.ID)
	if got.Enabled || got.DisabledReason == nil || !strings.Contains(*got.DisabledReason, "410") {
		t.Errorf("after 410: enabled %v, reason %v", got.Enabled, got.DisabledReason)
	}
}
