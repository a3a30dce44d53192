package central_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/webhook"
)

func TestWebhookEndpointsAreManagedByAdminsOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{allowPrivateWebhooks: true})
	var got atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("webhook-id") != "" && strings.HasPrefix(r.Header.Get("webhook-signature"), "v1,") {
			got.Add(1)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	admin, alice := h.iss.Token("root", "admin"), h.iss.Token("alice")
	create := `{"url":"` + receiver.URL + `/hooks","events":["notification.read","notification.created"],"description":"billing"}`
	if r := h.request(http.MethodPost, "/v1/admin/webhooks", alice, create); r.status != http.StatusForbidden {
		t.Errorf("create without the admin role = %d", r.status)
	}
	r := h.request(http.MethodPost, "/v1/admin/webhooks", admin, create)
	if r.status != http.StatusCreated || !strings.HasPrefix(r.body["secret"].(string), "whsec_") {
		t.Fatalf("create = %d %s", r.status, r.raw)
	}
	id := r.body["id"].(string)
	if events := r.body["events"].([]any); len(events) != 2 || events[0] != "notification.created" {
		t.Errorf("events = %v, want both in the documented order", events)
	}
	for _, c := range []struct{ body, field string }{
		{`{"url":"ftp://x/","events":["notification.read"]}`, "url"},
		{`{"url":"` + receiver.URL + `","events":[]}`, "events"},
		{`{"url":"` + receiver.URL + `","events":["push.everything"]}`, "events"},
	} {
		if r := h.request(http.MethodPost, "/v1/admin/webhooks", admin, c.body); r.status != http.StatusBadRequest || r.body["field"] != c.field {
			t.Errorf("%s = %d %s; want 400 on %s", c.body, r.status, r.raw, c.field)
		}
	}
	list := h.request(http.MethodGet, "/v1/admin/webhooks", admin, "")
	if list.status != http.StatusOK || len(list.body["data"].([]any)) != 1 || strings.Contains(string(list.raw), "whsec_") {
		t.Errorf("list = %d %s; want one endpoint and no secret", list.status, list.raw)
	}
	rot := h.request(http.MethodPost, "/v1/admin/webhooks/"+id+"/rotate-secret", admin, `{"overlap":"2h"}`)
	if rot.status != http.StatusOK || !strings.HasPrefix(rot.body["secret"].(string), "whsec_") || rot.body["secret"] == r.body["secret"] {
		t.Errorf("rotate = %d %s", rot.status, rot.raw)
	}
	if g := h.request(http.MethodGet, "/v1/admin/webhooks/"+id, admin, ""); g.status != http.StatusOK || g.body["previous_secret_until"] == nil {
		t.Errorf("get after rotation = %d %s", g.status, g.raw)
	}

	h.seed("alice", 1)
	d, err := webhook.NewDeliverer(webhook.DelivererConfig{DB: h.pool, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.Wait()
	if got.Load() != 1 {
		t.Fatalf("receiver got %d signed deliveries, want 1", got.Load())
	}
	log := h.request(http.MethodGet, "/v1/admin/webhooks/"+id+"/attempts", admin, "")
	if log.status != http.StatusOK || len(log.body["data"].([]any)) != 1 {
		t.Fatalf("attempts = %d %s", log.status, log.raw)
	}
	if a := log.body["data"].([]any)[0].(map[string]any); a["status"] != 204.0 || a["state"] != "delivered" || a["type"] != "notification.created" {
		t.Errorf("attempt = %v", a)
	}
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if rp := h.request(http.MethodPost, "/v1/admin/webhooks/"+id+"/replay", admin, `{"since":"`+since+`"}`); rp.status != http.StatusAccepted || rp.body["queued"] != 1.0 {
		t.Errorf("replay = %d %s", rp.status, rp.raw)
	}
	if rp := h.request(http.MethodPost, "/v1/admin/webhooks/"+id+"/replay", admin, `{}`); rp.status != http.StatusBadRequest || rp.body["field"] != "since" {
		t.Errorf("replay without since = %d %s", rp.status, rp.raw)
	}
	if del := h.request(http.MethodDelete, "/v1/admin/webhooks/"+id, admin, ""); del.status != http.StatusNoContent {
		t.Errorf("delete = %d %s", del.status, del.raw)
	}
	if g := h.request(http.MethodGet, "/v1/admin/webhooks/"+id, admin, ""); g.status != http.StatusNotFound {
		t.Errorf("get after delete = %d", g.status)
	}
	// Its deliveries and log go in the deliverers' maintenance (tested in
	// package webhook); the log is gone for the API at once.
	if a := h.request(http.MethodGet, "/v1/admin/webhooks/"+id+"/attempts", admin, ""); a.status != http.StatusNotFound {
		t.Errorf("attempts after delete = %d %s", a.status, a.raw)
	}
}

func TestWebhookTargetsOnPrivateRangesAreRefusedByDefault(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	r := h.request(http.MethodPost, "/v1/admin/webhooks", h.iss.Token("root", "admin"), `{"url":"http://127.0.0.1:9/x","events":["push.failed"]}`)
	if r.status != http.StatusBadRequest || r.body["field"] != "url" || !strings.Contains(r.body["detail"].(string), "--webhook-allow-private") {
		t.Errorf("loopback target = %d %s", r.status, r.raw)
	}
}
