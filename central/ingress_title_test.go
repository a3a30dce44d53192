package central_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

// The internal ingress refuses, as the relay does, an event that would push
// an empty banner (neither title nor body), naming title and storing
// nothing; a body alone is enough to push.
func TestInternalIngressRefusesAnEventThatWouldShowNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	for _, body := range []string{
		`{"idempotency_key":"silent:1","type":"t","recipients":["alice"]}`,
		`{"idempotency_key":"silent:2","type":"t","recipients":["alice"],"title":" ","body":"","data":{"a":1}}`,
	} {
		r := h.request(http.MethodPost, "/internal/v1/events", emit, body)
		if r.status != http.StatusBadRequest || !strings.HasSuffix(fmt.Sprint(r.body["type"]), ":invalid-event") ||
			r.body["field"] != "title" || !strings.Contains(fmt.Sprint(r.body["detail"]), "empty banner") {
			t.Errorf("%s = %d %s; want 400 invalid-event naming title and why", body, r.status, r.raw)
		}
	}
	if n := pgtest.Count(t, h.pool, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Errorf("the refused events claimed %d keys", n)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, `{"idempotency_key":"body-only","type":"t","recipients":["alice"],"body":"Starts Monday 10:00"}`); r.status != http.StatusAccepted {
		t.Errorf("an event with a body and no title = %d %s; want 202", r.status, r.raw)
	}
}
