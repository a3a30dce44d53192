package central_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

func TestAScheduledEventIsCancelledThroughTheInternalIngressWithExactAnswers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	other, _ := auth.SignServiceToken(serviceSecret, "shipping", []string{"push:emit"}, time.Now(), time.Minute)
	at := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	scheduled := `{"idempotency_key":"renewal:7","type":"renewal","recipients":["alice","bob"],"title":"Renews tomorrow","send_at":"` + at + `"}`
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, scheduled); r.status != http.StatusAccepted {
		t.Fatalf("scheduled event = %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, `{"idempotency_key":"now:1","type":"t","recipients":["alice"],"title":"t"}`); r.status != http.StatusAccepted {
		t.Fatalf("immediate event = %d %s", r.status, r.raw)
	}
	feed := h.request(http.MethodGet, "/v1/notifications", h.iss.Token("bob"), "")
	if items := feed.body["data"].([]any); len(items) != 0 {
		t.Errorf("bob's feed before send_at holds %s", feed.raw)
	}
	if r := h.request(http.MethodDelete, "/internal/v1/events/renewal:7", other, ""); r.status != http.StatusNotFound || !strings.Contains(r.body["type"].(string), "unknown-event") {
		t.Errorf("another producer's cancel = %d %s; keys are scoped per producer", r.status, r.raw)
	}
	r := h.request(http.MethodDelete, "/internal/v1/events/renewal:7", emit, "")
	if r.status != http.StatusOK || r.body["status"] != "cancelled" || r.body["notifications"] != 2.0 {
		t.Fatalf("cancel = %d %s", r.status, r.raw)
	}
	if again := h.request(http.MethodDelete, "/internal/v1/events/renewal:7", emit, ""); again.status != http.StatusOK || again.body["notifications"] != 0.0 ||
		again.body["cancelled_at"] != r.body["cancelled_at"] {
		t.Errorf("repeated cancel = %d %s; want 200, nothing more stopped, the first cancellation's time", again.status, again.raw)
	}
	if r := h.request(http.MethodDelete, "/internal/v1/events/now:1", emit, ""); r.status != http.StatusConflict || !strings.Contains(r.body["type"].(string), "already-sent") {
		t.Errorf("cancel of a sent event = %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodDelete, "/internal/v1/events/"+strings.Repeat("k", 257), emit, ""); r.status != http.StatusBadRequest {
		t.Errorf("cancel of an over-long key = %d %s", r.status, r.raw)
	}
	slashed := `{"idempotency_key":"team/7","type":"renewal","recipients":["alice"],"title":"Renews tomorrow","send_at":"` + at + `"}`
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, slashed); r.status != http.StatusAccepted {
		t.Fatalf("scheduled event = %d %s", r.status, r.raw)
	}
	// Sent apart from the harness: its OpenAPI router cannot match an escaped /.
	req, _ := http.NewRequest(http.MethodDelete, h.url+"/internal/v1/events/team%2F7", nil)
	req.Header.Set("Authorization", "Bearer "+emit)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"idempotency_key":"team/7"`) || !strings.Contains(string(raw), `"notifications":1`) {
		t.Errorf("cancel of a key holding a / = %d %s", resp.StatusCode, raw)
	}
	if r := h.request(http.MethodDelete, "/internal/v1/events/team/7", emit, ""); r.status != http.StatusNotFound {
		t.Errorf("cancel with the / unescaped = %d %s; want 404", r.status, r.raw)
	}
	if n := pgtest.Count(t, h.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'cancelled' AND user_id = 'bob'`); n != 1 {
		t.Errorf("%d cancelled rows in bob's delivery log, want 1", n)
	}
	log := h.request(http.MethodGet, "/v1/admin/deliveries?state=cancelled", h.iss.Token("admin", "admin"), "")
	if log.status != http.StatusOK || len(log.body["data"].([]any)) != 3 {
		t.Errorf("delivery log of cancelled = %d %s", log.status, log.raw)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", emit,
		`{"idempotency_key":"far","type":"t","recipients":["alice"],"send_at":"`+time.Now().Add(31*24*time.Hour).UTC().Format(time.RFC3339)+`"}`); r.status != http.StatusBadRequest || r.body["field"] != "send_at" {
		t.Errorf("send_at 31 days ahead = %d %s", r.status, r.raw)
	}
}

func TestQuietHoursAreSetReadAndRemovedBesideCategories(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	alice := h.iss.Token("alice")
	put := func(body string) response {
		return h.request(http.MethodPut, "/v1/preferences", alice, body)
	}
	r := put(`{"categories":{"chat":{"push":false}},"quiet_hours":{"start":"22:00","end":"07:00","time_zone":"Europe/Berlin"}}`)
	qh, _ := r.body["quiet_hours"].(map[string]any)
	if r.status != http.StatusOK || qh["start"] != "22:00" || qh["time_zone"] != "Europe/Berlin" {
		t.Fatalf("put = %d %s", r.status, r.raw)
	}
	// Categories alone keep the quiet hours.
	if r := put(`{"categories":{"billing":{"push":true}}}`); r.body["quiet_hours"] == nil {
		t.Errorf("a put without quiet_hours removed them: %s", r.raw)
	}
	for _, bad := range []string{
		`{"quiet_hours":{"start":"22:00","end":"07:00","time_zone":"Mars/Base"}}`,
		`{"quiet_hours":{"start":"25:00","end":"07:00","time_zone":"UTC"}}`,
		`{"quiet_hours":{"start":"22:00","end":"22:00","time_zone":"UTC"}}`,
		`{"quiet_hours":{"start":"22:00","end":"07:00"}}`,
	} {
		if r := put(bad); r.status != http.StatusBadRequest || !strings.Contains(r.body["detail"].(string), "quiet_hours") {
			t.Errorf("%s = %d %s", bad, r.status, r.raw)
		}
	}
	if r := put(`{"quiet_hours":null}`); r.status != http.StatusOK || r.body["quiet_hours"] != nil || len(r.body["categories"].(map[string]any)) != 2 {
		t.Errorf("removing quiet hours = %d %s", r.status, r.raw)
	}
}
