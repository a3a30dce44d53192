package webhook_test

import (
	"context"
	"fmt"
	"net/http"
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
