package central_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
)

func TestDevicesAndPreferencesThroughTheAPI(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	alice, bob := h.iss.Token("alice"), h.iss.Token("bob")
	for _, tc := range []struct {
		body   string
		status int
		field  string
	}{
		{`{"token":"ExponentPushToken[abc123]","platform":"ios"}`, 200, ""},
		{`{"token":"ExpoPushToken[xyz-789]","platform":"android"}`, 200, ""},
		{`{"token":"fcm:abc","platform":"ios"}`, 400, "token"},
		{`{"token":"ExponentPushToken[abc123]","platform":"windows"}`, 400, "platform"},
		{`{"token":"ExponentPushToken[abc123]"`, 400, ""},
	} {
		r := h.request(http.MethodPut, "/v1/devices", alice, tc.body)
		if r.status != tc.status || (tc.field != "" && r.body["field"] != tc.field) {
			t.Errorf("PUT /v1/devices %s = %d %v; want %d naming %q", tc.body, r.status, r.body, tc.status, tc.field)
		}
	}
	if r := h.request(http.MethodDelete, "/v1/devices/ExponentPushToken[abc123]", bob, ""); r.status != 404 {
		t.Errorf("bob disabling alice's device = %d, want 404", r.status)
	}
	if r := h.request(http.MethodDelete, "/v1/devices/ExponentPushToken[abc123]", alice, ""); r.status != 204 {
		t.Errorf("alice disabling her device = %d, want 204", r.status)
	}
	list := h.request(http.MethodGet, "/v1/devices", alice, "").body["data"].([]any)
	if len(list) != 2 {
		t.Fatalf("alice's devices = %v; want both, the disabled one kept", list)
	}
	for _, d := range list {
		dev := d.(map[string]any)
		if dev["token"] == "ExponentPushToken[abc123]" && (dev["enabled"] != false || dev["disabled_reason"] != "user_request") {
			t.Errorf("the disabled device shows %v", dev)
		}
	}
	if r := h.request(http.MethodPut, "/v1/preferences", alice, `{"categories":{"marketing":{"push":false}}}`); r.status != 200 {
		t.Fatalf("PUT /v1/preferences = %d %v", r.status, r.body)
	}
	r := h.request(http.MethodPut, "/v1/preferences", alice, `{"categories":{"billing":{"push":false}}}`)
	cats, _ := r.body["categories"].(map[string]any)
	if len(cats) != 2 {
		t.Errorf("preferences after a second PUT = %v; want the two merged", r.body)
	}
	if r := h.request(http.MethodGet, "/v1/preferences", bob, ""); r.status != 200 || len(r.body["categories"].(map[string]any)) != 0 {
		t.Errorf("bob's preferences = %d %v; want none", r.status, r.body)
	}
}

func TestTheDeliveryLogIsForAdminsAndPaged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	for i := range 3 {
		if _, err := h.pool.Exec(context.Background(), `INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state)
			VALUES ($1, now(), 'alice', 'ExponentPushToken[abcdefghijkl]', 'sent')`, i+1); err != nil {
			t.Fatal(err)
		}
	}
	if r := h.request(http.MethodGet, "/v1/admin/deliveries", h.iss.Token("alice"), ""); r.status != 403 {
		t.Errorf("a user without the admin role = %d, want 403", r.status)
	}
	admin := h.iss.Token("root", "admin")
	first := h.request(http.MethodGet, "/v1/admin/deliveries?user=alice&limit=2", admin, "")
	if first.status != 200 || len(first.body["data"].([]any)) != 2 || first.body["has_more"] != true {
		t.Fatalf("first page = %d %v", first.status, first.body)
	}
	if tok := first.body["data"].([]any)[0].(map[string]any)["token"]; tok != "ExponentPushToken[abcd…ijkl]" {
		t.Errorf("token in the log = %v; want it masked", tok)
	}
	next := h.request(http.MethodGet, "/v1/admin/deliveries?user=alice&limit=2&cursor="+first.body["next_cursor"].(string), admin, "")
	if len(next.body["data"].([]any)) != 1 || next.body["has_more"] != false {
		t.Errorf("second page = %v", next.body)
	}
	if r := h.request(http.MethodGet, "/v1/admin/deliveries?state=lost", admin, ""); r.status != 400 {
		t.Errorf("an unknown state = %d, want 400", r.status)
	}
	if r := h.request(http.MethodGet, "/v1/admin/deliveries?cursor=nope", admin, ""); r.status != 400 {
		t.Errorf("a bad cursor = %d, want 400", r.status)
	}
}

func TestABodyOverTheLimitIs413NamingTheLimitOnEveryJSONRoute(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	user := h.iss.Token("alice")
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	const limit = 64 << 10
	big := strings.Repeat("x", limit)
	for _, tc := range []struct {
		method, path, token, body string
	}{
		{http.MethodPut, "/v1/devices", user, `{"token":"ExponentPushToken[` + big + `]","platform":"ios"}`},
		{http.MethodPut, "/v1/preferences", user, `{"categories":{"` + big + `":{"push":false}}}`},
		{http.MethodPost, "/internal/v1/events", emit, `{"idempotency_key":"big","type":"t","recipients":["alice"],"title":"` + big + `"}`},
	} {
		for _, sized := range []bool{true, false} {
			name := tc.method + " " + tc.path + " with Content-Length"
			if !sized {
				name = tc.method + " " + tc.path + " chunked"
			}
			t.Run(name, func(t *testing.T) {
				var body io.Reader = strings.NewReader(tc.body)
				if !sized {
					body = io.MultiReader(body) // length unknown: sent chunked
				}
				req, err := http.NewRequest(tc.method, h.url+tc.path, body)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+tc.token)
				req.Header.Set("Content-Type", "application/json")
				// Not h.do: it checks every answer against docs/openapi.yaml, and this loop sends one body to each route, documented or not.
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var p map[string]any
				raw, _ := io.ReadAll(resp.Body)
				_ = json.Unmarshal(raw, &p)
				detail, _ := p["detail"].(string)
				if resp.StatusCode != http.StatusRequestEntityTooLarge || p["type"] != "urn:spoolcast:problem:body-too-large" ||
					!strings.Contains(detail, fmt.Sprint(limit)) {
					t.Errorf("%d-byte body = %d %s; want 413 body-too-large naming the limit of %d bytes", len(tc.body), resp.StatusCode, raw, limit)
				}
			})
		}
	}
	if r := h.request(http.MethodPut, "/v1/preferences", user, `{"categories":{"`+strings.Repeat("x", 128)+`":{"push":false}}}`); r.status != 200 {
		t.Errorf("a body within the limit = %d %s", r.status, r.raw)
	}
}
