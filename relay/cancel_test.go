package relay_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/spool"
)

// rawResponse is an answer with its body as sent.
type rawResponse struct {
	status int
	header http.Header
	body   string
}

// cancel sends DELETE /v1/events/{escapedKey}; the key goes into the path
// as given, already escaped.
func (h *harness) cancel(t *testing.T, escapedKey string, headers ...string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, h.url+"/v1/events/"+escapedKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: string(raw)}
}

func cancelAccepted(key string) string {
	return fmt.Sprintf(`{"status":"cancel_accepted","idempotency_key":%q}`+"\n", key)
}

// spooledCancels returns the keys of the spool's cancellations, in seq order.
func (h *harness) spooledCancels(t *testing.T) []string {
	t.Helper()
	rows, err := h.spool.List(context.Background(), spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, rec := range rows {
		if producer, ok := rec.CancelOf(); ok {
			if producer != "billing" || !rec.Pending() {
				t.Errorf("cancellation of %q: producer %q, pending %v; want billing's, pending", rec.Key, producer, rec.Pending())
			}
			keys = append(keys, rec.Key)
		}
	}
	return keys
}

func TestADeleteIsSpooledAndEveryRepeatIsAnsweredTheSame(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	first := h.cancel(t, "meeting_assignment:u_123:m_456")
	if first.status != http.StatusAccepted || first.header.Get("Content-Type") != "application/json" || first.body != cancelAccepted("meeting_assignment:u_123:m_456") {
		t.Fatalf("DELETE = %d %q %q; want 202 cancel_accepted", first.status, first.header.Get("Content-Type"), first.body)
	}
	again := h.cancel(t, "meeting_assignment:u_123:m_456")
	if again.status != first.status || again.body != first.body {
		t.Errorf("repeated DELETE = %d %q; want the first answer %d %q", again.status, again.body, first.status, first.body)
	}
	// The event's own key is untouched: its cancellation is kept apart.
	if r := h.post(t, event("meeting_assignment:u_123:m_456", "Weekly sync")); r.status != http.StatusAccepted || r.body["status"] != "accepted" {
		t.Errorf("POST after the DELETE = %d %v; want 202 accepted", r.status, r.body)
	}
	if got := h.spooledCancels(t); len(got) != 1 || got[0] != "meeting_assignment:u_123:m_456" {
		t.Errorf("spooled cancellations = %q, want the one key once", got)
	}
	if got := h.rows(t); got != 2 {
		t.Errorf("spool rows = %d, want 2 (the cancellation and the event)", got)
	}
}

func TestTheCancelKeyIsThePathSegmentUnescaped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	longest := strings.Repeat("k", 256)
	for _, tc := range []struct{ path, key string }{
		{"a%2Fb", "a/b"},
		{"job%20finished:%C3%A9t%C3%A9", "job finished:été"},
		{"meeting:1?x=y", "meeting:1"}, // a query is not part of the key
		{longest, longest},
	} {
		if r := h.cancel(t, tc.path); r.status != http.StatusAccepted || r.body != cancelAccepted(tc.key) {
			t.Errorf("DELETE /v1/events/%s = %d %q; want 202 for key %q", tc.path, r.status, r.body, tc.key)
		}
	}
	if got := h.spooledCancels(t); strings.Join(got, "|") != "a/b|job finished:été|meeting:1|"+longest {
		t.Errorf("spooled cancellations = %q", got)
	}
}

func TestABadCancelKeyIs400AndChangesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	for _, tc := range []struct {
		name, path string
		status     int
		typ        string
	}{
		{"an empty key is 400", "", 400, "invalid-event"},
		{"a blank key is 400", "%20%20", 400, "invalid-event"},
		{"a key over 256 bytes is 400", strings.Repeat("k", 257), 400, "invalid-event"},
		{"a key of invalid UTF-8 is 400", "k%FF", 400, "invalid-event"},
		{"a key with a NUL is 400", "k%00", 400, "invalid-event"},
		{"two path segments are 404", "a/b", 404, "not-found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.cancel(t, tc.path)
			if r.status != tc.status || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("status = %d %q %q; want %d problem", r.status, r.header.Get("Content-Type"), r.body, tc.status)
			}
			if !strings.Contains(r.body, `"type":"urn:spoolcast:problem:`+tc.typ+`"`) || !strings.Contains(r.body, fmt.Sprintf(`"status":%d`, tc.status)) {
				t.Errorf("problem = %s; want type %s", r.body, tc.typ)
			}
			if tc.status == 400 && !strings.Contains(r.body, `"field":"idempotency_key"`) {
				t.Errorf("problem = %s; want it to name idempotency_key", r.body)
			}
		})
	}
	if got := h.rows(t); got != 0 {
		t.Errorf("bad DELETEs left %d spool rows, want 0", got)
	}
}

func TestADeleteNeedsTheServiceTokenWhenConfigured(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{auth: true})
	emit, _ := auth.SignServiceToken(testSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	readOnly, _ := auth.SignServiceToken(testSecret, "billing", []string{"prefs:read"}, time.Now(), time.Minute)
	for _, tc := range []struct {
		name   string
		auth   string
		status int
	}{
		{"no token is 401", "", 401},
		{"a garbage token is 401", "Bearer not.a.token", 401},
		{"a token without push:emit is 403", "Bearer " + readOnly, 403},
		{"a token with push:emit is accepted", "Bearer " + emit, 202},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var headers []string
			if tc.auth != "" {
				headers = []string{"Authorization", tc.auth}
			}
			r := h.cancel(t, "auth-key", headers...)
			if r.status != tc.status {
				t.Fatalf("status = %d %q; want %d", r.status, r.body, tc.status)
			}
			if tc.status >= 400 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate = %q", r.header.Get("WWW-Authenticate"))
			}
		})
	}
	if got := h.rows(t); got != 1 {
		t.Errorf("spool rows = %d, want only the authorized cancellation", got)
	}
}

func TestADeleteTheSpoolCannotTakeIs503LikeAnEvent(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{spoolMaxBytes: 24 << 10})
	for i := 0; ; i++ {
		if r := h.post(t, event(fmt.Sprintf("fill-%d", i), strings.Repeat("t", 1000))); r.status != http.StatusAccepted {
			break
		}
	}
	// A cancellation is small: what room is left takes a few, then none.
	var accepted []string
	var last rawResponse
	for i := range 1000 {
		key := fmt.Sprintf("cancel-%d", i)
		if last = h.cancel(t, key); last.status != http.StatusAccepted {
			break
		}
		accepted = append(accepted, key)
	}
	if last.status != http.StatusServiceUnavailable || last.header.Get("Retry-After") != "5" || !strings.Contains(last.body, `"type":"urn:spoolcast:problem:overloaded"`) {
		t.Fatalf("DELETE with the spool at its limit = %d %v %s; want 503 overloaded with Retry-After: 5", last.status, last.header, last.body)
	}
	for _, key := range accepted {
		if r := h.cancel(t, key); r.status != http.StatusAccepted || r.body != cancelAccepted(key) {
			t.Fatalf("repeated DELETE of spooled %s while full = %d %q; want 202", key, r.status, r.body)
		}
	}

	closed := newHarness(t, harnessOpts{})
	if err := closed.spool.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := closed.cancel(t, "after-close")
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "5" || !strings.Contains(r.body, "shutting down") {
		t.Errorf("DELETE on a closed spool = %d %v %s; want 503 shutting down with Retry-After", r.status, r.header, r.body)
	}
}

func TestACancellationSurvivesARestartOfTheRelay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := newHarness(t, harnessOpts{spoolDir: dir})
	if r := first.cancel(t, "invoice:7"); r.status != http.StatusAccepted {
		t.Fatalf("DELETE = %d %q", r.status, r.body)
	}
	if err := first.spool.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := newHarness(t, harnessOpts{spoolDir: dir})
	if r := second.cancel(t, "invoice:7"); r.status != http.StatusAccepted || r.body != cancelAccepted("invoice:7") {
		t.Errorf("DELETE after the restart = %d %q; want the same 202", r.status, r.body)
	}
	if got := second.spooledCancels(t); len(got) != 1 || got[0] != "invoice:7" {
		t.Errorf("spooled cancellations after the restart = %q, want invoice:7 once", got)
	}
}
