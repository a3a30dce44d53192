package eventhttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
)

func TestTheAnswerBodyIsWhatEncodingJSONWrites(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)
	for _, a := range []Answer{
		{Outcome: event.Accepted, IdempotencyKey: "meeting:u_1", ReceivedAt: at},
		{Outcome: event.Duplicate, IdempotencyKey: "quote \" back\\slash \n é \u2028 <tag>", ReceivedAt: at.Truncate(time.Second)},
	} {
		w := httptest.NewRecorder()
		WriteAnswer(w, httptest.NewRequest(http.MethodPost, "/v1/events", nil), a)
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(struct {
			Status         string    `json:"status"`
			IdempotencyKey string    `json:"idempotency_key"`
			ReceivedAt     time.Time `json:"received_at"`
		}{a.Outcome.String(), a.IdempotencyKey, a.ReceivedAt})
		if w.Body.String() != want.String() {
			t.Errorf("answer body %q; encoding/json writes %q", w.Body, want.String())
		}
	}
}

func TestEachOutcomeHasItsStatus(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		outcome  event.Outcome
		status   int
		replayed string
		body     string
	}{
		{event.Accepted, http.StatusAccepted, "", `"status":"accepted"`},
		{event.Duplicate, http.StatusOK, "true", `"status":"duplicate"`},
		{event.Conflict, http.StatusUnprocessableEntity, "", `"type":"urn:spoolcast:problem:idempotency-key-reused"`},
	} {
		w := httptest.NewRecorder()
		WriteAnswer(w, httptest.NewRequest(http.MethodPost, "/v1/events", nil), Answer{Outcome: tc.outcome, IdempotencyKey: "k", ReceivedAt: at})
		if w.Code != tc.status || w.Header().Get("Idempotent-Replayed") != tc.replayed || !strings.Contains(w.Body.String(), tc.body) {
			t.Errorf("%s: %d, Idempotent-Replayed %q, body %s; want %d, %q, %s", tc.outcome, w.Code, w.Header().Get("Idempotent-Replayed"), w.Body, tc.status, tc.replayed, tc.body)
		}
	}
}
