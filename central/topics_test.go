package central_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/topics"
)

// A service opens a topic and fills it in bulk; users list theirs, join
// the open one and leave it; every answer as docs/openapi.yaml describes.
func TestTopicsThroughTheAPI(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	manage, _ := auth.SignServiceToken(serviceSecret, "crm", []string{auth.ScopeTopics}, time.Now(), time.Minute)
	emit, _ := auth.SignServiceToken(serviceSecret, "crm", []string{auth.ScopeEmit}, time.Now(), time.Minute)
	alice, bob := h.iss.Token("alice"), h.iss.Token("bob")

	if r := h.request(http.MethodPut, "/internal/v1/topics/releases", emit, `{"open":true}`); r.status != http.StatusForbidden {
		t.Errorf("push:emit alone sets a topic: %d", r.status)
	}
	if r := h.request(http.MethodPut, "/internal/v1/topics/releases", manage, `{}`); r.status != http.StatusBadRequest {
		t.Errorf("a topic without open: %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodPut, "/internal/v1/topics/releases", manage, `{"open":true}`); r.status != http.StatusCreated || r.body["open"] != true {
		t.Fatalf("open releases: %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodPut, "/internal/v1/topics/releases", manage, `{"open":true}`); r.status != http.StatusOK {
		t.Errorf("open releases again: %d", r.status)
	}
	if r := h.request(http.MethodGet, "/internal/v1/topics/Bad!", manage, ""); r.status != http.StatusBadRequest {
		t.Errorf("a bad name: %d", r.status)
	}
	if r := h.request(http.MethodGet, "/internal/v1/topics/none", manage, ""); r.status != http.StatusNotFound {
		t.Errorf("a missing topic: %d", r.status)
	}

	// 10,000 members in one request, then the same request again.
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("%q", fmt.Sprintf("member-%05d", i))
	}
	body := `{"add":[` + strings.Join(ids, ",") + `,"alice"]}`
	if r := h.request(http.MethodPost, "/internal/v1/topics/staff/members", manage, body); r.status != http.StatusBadRequest {
		t.Errorf("10,001 users: %d %s", r.status, r.raw)
	}
	body = `{"add":[` + strings.Join(ids[:9_999], ",") + `,"alice"]}`
	for i, want := range []float64{10_000, 0} {
		r := h.request(http.MethodPost, "/internal/v1/topics/staff/members", manage, body)
		if r.status != http.StatusOK || r.body["added"] != want || r.body["removed"] != 0.0 {
			t.Errorf("add 10,000, time %d: %d %s; want %v added", i+1, r.status, r.raw, want)
		}
	}
	if r := h.request(http.MethodPost, "/internal/v1/topics/staff/members", manage, `{"add":["x"],"remove":["x"]}`); r.status != http.StatusBadRequest {
		t.Errorf("added and removed at once: %d", r.status)
	}

	// Alice is in staff (closed) and joins releases; Bob cannot join staff.
	if r := h.request(http.MethodPut, "/v1/topics/releases/subscription", alice, ""); r.status != http.StatusCreated || r.body["topic"] != "releases" {
		t.Errorf("subscribe: %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodPut, "/v1/topics/releases/subscription", alice, ""); r.status != http.StatusOK {
		t.Errorf("subscribe again: %d", r.status)
	}
	if r := h.request(http.MethodPut, "/v1/topics/staff/subscription", bob, ""); r.status != http.StatusNotFound {
		t.Errorf("subscribe to a closed topic: %d", r.status)
	}
	if r := h.request(http.MethodDelete, "/v1/topics/staff/subscription", alice, ""); r.status != http.StatusNotFound {
		t.Errorf("leave a closed topic: %d", r.status)
	}
	r := h.request(http.MethodGet, "/v1/topics?limit=1", alice, "")
	if r.status != http.StatusOK || r.body["next_after"] != "releases" {
		t.Fatalf("first page: %d %s", r.status, r.raw)
	}
	r = h.request(http.MethodGet, "/v1/topics?limit=1&after=releases", alice, "")
	if data, _ := r.body["data"].([]any); r.status != http.StatusOK || len(data) != 1 || data[0].(map[string]any)["topic"] != "staff" || r.body["next_after"] != nil {
		t.Errorf("second page: %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodGet, "/v1/topics?limit=0", alice, ""); r.status != http.StatusBadRequest {
		t.Errorf("limit 0: %d", r.status)
	}
	for _, after := range []string{"%FF", "a%00", ".."} {
		if r := h.request(http.MethodGet, "/v1/topics?after="+after, alice, ""); r.status != http.StatusBadRequest || r.body["field"] != "after" {
			t.Errorf("after=%s: %d %s; want 400 naming after", after, r.status, r.raw)
		}
	}
	for range 2 {
		if r := h.request(http.MethodDelete, "/v1/topics/releases/subscription", alice, ""); r.status != http.StatusNoContent {
			t.Errorf("leave: %d %s", r.status, r.raw)
		}
	}
	if r := h.request(http.MethodGet, "/v1/topics", bob, ""); r.status != http.StatusOK || string(r.raw) != `{"data":[]}`+"\n" && string(r.raw) != `{"data":[]}` {
		t.Errorf("bob's topics: %d %q", r.status, r.raw)
	}
}

// A producer addresses a topic through /internal/v1/events; an admin
// follows the fan-out; a cancel while it runs says how many it reached.
func TestATopicEventThroughTheAPI(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	ctx := context.Background()
	manage, _ := auth.SignServiceToken(serviceSecret, "news", []string{auth.ScopeTopics}, time.Now(), time.Minute)
	emit, _ := auth.SignServiceToken(serviceSecret, "news", []string{auth.ScopeEmit}, time.Now(), time.Minute)
	admin := h.iss.Token("root", "admin")
	ids := make([]string, 500)
	for i := range ids {
		ids[i] = fmt.Sprintf("%q", fmt.Sprintf("reader-%03d", i))
	}
	if r := h.request(http.MethodPost, "/internal/v1/topics/readers/members", manage, `{"add":[`+strings.Join(ids, ",")+`]}`); r.status != http.StatusOK {
		t.Fatalf("add members: %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, `{"idempotency_key":"issue-1","type":"issue","title":"Issue 1","topics":["Readers"]}`); r.status != http.StatusBadRequest || r.body["field"] != "topics" {
		t.Errorf("a bad topic name: %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, `{"idempotency_key":"issue-1","type":"issue","title":"Issue 1"}`); r.status != http.StatusBadRequest || r.body["field"] != "recipients" {
		t.Errorf("neither recipients nor topics: %d %s", r.status, r.raw)
	}
	first := h.request(http.MethodPost, "/internal/v1/events", emit, `{"idempotency_key":"issue-1","type":"issue","title":"Issue 1","topics":["readers"]}`)
	if first.status != http.StatusAccepted || first.body["status"] != "accepted" {
		t.Fatalf("a topic event: %d %s", first.status, first.raw)
	}
	again := h.request(http.MethodPost, "/internal/v1/events", emit, `{"idempotency_key":"issue-1","type":"issue","title":"Issue 1","topics":["readers"]}`)
	if again.status != http.StatusOK || again.body["status"] != "duplicate" || again.body["received_at"] == nil {
		t.Errorf("the same topic event again: %d %s", again.status, again.raw)
	}
	if r := h.request(http.MethodGet, "/v1/admin/topic-fanouts", h.iss.Token("alice"), ""); r.status != http.StatusForbidden {
		t.Errorf("fan-outs without the admin role: %d", r.status)
	}
	if r := h.request(http.MethodGet, "/v1/admin/topic-fanouts?state=done", admin, ""); r.status != http.StatusBadRequest {
		t.Errorf("a bad state: %d %s", r.status, r.raw)
	}
	r := h.request(http.MethodGet, "/v1/admin/topic-fanouts?idempotency_key=issue-1", admin, "")
	list, _ := r.body["fanouts"].([]any)
	if r.status != http.StatusOK || len(list) != 1 || list[0].(map[string]any)["state"] != "pending" {
		t.Fatalf("the pending fan-out: %d %s", r.status, r.raw)
	}
	fanout, err := topics.NewFanout(topics.FanoutConfig{DB: h.pool, BatchSize: 100, BatchTime: time.Hour}) // batches of 100: the test counts them
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // the start, then two batches
		if _, err := fanout.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r = h.request(http.MethodGet, "/v1/admin/topic-fanouts?state=running&limit=1", admin, "")
	list, _ = r.body["fanouts"].([]any)
	if r.status != http.StatusOK || len(list) != 1 || list[0].(map[string]any)["written"] != 200.0 || list[0].(map[string]any)["members"] != 500.0 {
		t.Fatalf("the running fan-out: %d %s", r.status, r.raw)
	}
	c := h.request(http.MethodDelete, "/internal/v1/events/issue-1", emit, "")
	if c.status != http.StatusOK || c.body["topic_members_reached"] != 200.0 || c.body["notifications"] != 0.0 {
		t.Errorf("cancel mid-fan-out: %d %s; want 200 reached", c.status, c.raw)
	}
	if err := fanout.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, h.pool, `SELECT count(*) FROM notifications WHERE idempotency_key = 'issue-1'`); n != 200 {
		t.Errorf("%d notifications after the cancel; want 200", n)
	}
}
