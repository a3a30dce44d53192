package central_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/apiversion"
	"github.com/spoolcast/spoolcast/auth"
)

func TestFeedPagesWithCursorsAndLinks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.seed("alice", 45)
	token := h.iss.Token("alice")
	seen := map[string]bool{}
	path := "/v1/notifications?limit=20"
	for pages := 1; ; pages++ {
		r := h.request(http.MethodGet, path, token, "")
		if r.status != 200 || r.header.Get(apiversion.Header) != apiversion.Default().Latest() {
			t.Fatalf("page %d: %d %s", pages, r.status, r.raw)
		}
		for _, n := range r.body["data"].([]any) {
			id := n.(map[string]any)["id"].(string)
			if seen[id] {
				t.Fatalf("id %s seen twice", id)
			}
			seen[id] = true
		}
		if r.body["has_more"] != true {
			if pages != 3 || r.body["next_cursor"] != nil || r.header.Get("Link") != "" {
				t.Errorf("last page %d: next_cursor %v, Link %q", pages, r.body["next_cursor"], r.header.Get("Link"))
			}
			break
		}
		link := r.header.Get("Link")
		m := regexp.MustCompile(`^<([^>]+)>; rel="next"$`).FindStringSubmatch(link)
		if m == nil || !strings.Contains(m[1], "cursor="+r.body["next_cursor"].(string)) {
			t.Fatalf("Link = %q, next_cursor %v", link, r.body["next_cursor"])
		}
		path = m[1]
	}
	if len(seen) != 45 {
		t.Errorf("saw %d notifications, want 45", len(seen))
	}
	if r := h.request(http.MethodGet, "/v1/notifications", token, ""); len(r.body["data"].([]any)) != 20 {
		t.Errorf("default page holds %d, want 20", len(r.body["data"].([]any)))
	}
}

func TestBadFeedQueriesAre400(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	token := h.iss.Token("alice")
	for _, q := range []string{"limit=0", "limit=101", "limit=ten", "limit=-1", "cursor=not-a-cursor", "cursor=", "cursor=MjAyNi0xMS0zMFQwOTowMDowMFp8MA", "unread=maybe"} {
		r := h.request(http.MethodGet, "/v1/notifications?"+q, token, "")
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("?%s = %d %s; want 400 problem", q, r.status, r.raw)
		}
	}
}

func TestUsersSeeAndMarkOnlyTheirOwnNotifications(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.seed("alice", 3)
	h.seed("bob", 2)
	alice, bob := h.iss.Token("alice"), h.iss.Token("bob")
	bobs := h.request(http.MethodGet, "/v1/notifications", bob, "").body["data"].([]any)
	if len(bobs) != 2 {
		t.Fatalf("bob sees %d, want his 2", len(bobs))
	}
	bobsID := bobs[0].(map[string]any)["id"].(string)
	if r := h.request(http.MethodPost, "/v1/notifications/"+bobsID+"/read", alice, ""); r.status != 404 {
		t.Errorf("alice marking bob's notification = %d, want 404", r.status)
	}
	for _, id := range []string{"0", "abc", "99999999", "AAAAAAAAAAAAAAAAAAAAAA", bobsID[:21] + "B"} {
		if r := h.request(http.MethodPost, "/v1/notifications/"+id+"/read", alice, ""); r.status != 404 {
			t.Errorf("marking %s = %d, want 404", id, r.status)
		}
	}
	if r := h.request(http.MethodPost, "/v1/notifications/"+bobsID+"/read", bob, ""); r.status != 204 {
		t.Errorf("bob marking his own = %d, want 204", r.status)
	}
	if r := h.request(http.MethodGet, "/v1/notifications/unread-count", bob, ""); r.body["count"] != float64(1) || r.body["capped"] != false {
		t.Errorf("bob unread-count = %v", r.body)
	}
	unread := h.request(http.MethodGet, "/v1/notifications?unread=true", bob, "").body["data"].([]any)
	if len(unread) != 1 || unread[0].(map[string]any)["id"] == bobsID {
		t.Errorf("bob's unread feed = %v", unread)
	}
	alicesNewest := h.request(http.MethodGet, "/v1/notifications?limit=1", alice, "").body["data"].([]any)[0].(map[string]any)["id"]
	if r := h.request(http.MethodPost, "/v1/notifications/read-all", alice, ""); r.status != 200 || r.body["read_through"] != alicesNewest {
		t.Errorf("alice read-all = %d %v; want read through her newest %v", r.status, r.body, alicesNewest)
	}
	if r := h.request(http.MethodPost, "/v1/notifications/not-an-action", alice, ""); r.status != 404 {
		t.Errorf("POST /v1/notifications/not-an-action = %d, want 404", r.status)
	}
	for _, n := range h.request(http.MethodGet, "/v1/notifications", alice, "").body["data"].([]any) {
		if n.(map[string]any)["read_at"] == nil {
			t.Errorf("alice's %v is unread after read-all", n)
		}
	}
	if r := h.request(http.MethodGet, "/v1/notifications/unread-count", bob, ""); r.body["count"] != float64(1) {
		t.Errorf("alice's read-all touched bob: %v", r.body)
	}
}

func TestInternalIngressAnswersLikeTheRelay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	readOnly, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"prefs:read"}, time.Now(), time.Minute)
	userToken := h.iss.Token("alice")
	body := `{"idempotency_key":"invoice:7","type":"invoice.paid","recipients":["alice","bob"],"title":"Invoice paid"}`

	if r := h.request(http.MethodPost, "/internal/v1/events", "", body); r.status != 401 {
		t.Errorf("no token = %d", r.status)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", userToken, body); r.status != 401 {
		t.Errorf("an end user's token = %d, want 401: no route lets a user create a notification", r.status)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", readOnly, body); r.status != 403 {
		t.Errorf("token without push:emit = %d, want 403", r.status)
	}
	first := h.request(http.MethodPost, "/internal/v1/events", emit, body)
	if first.status != 202 || first.body["status"] != "accepted" {
		t.Fatalf("first = %d %s", first.status, first.raw)
	}
	again := h.request(http.MethodPost, "/internal/v1/events", emit, body, "Idempotency-Key", `"invoice:7"`)
	if again.status != 200 || again.body["status"] != "duplicate" || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry = %d %s", again.status, again.raw)
	}
	other := h.request(http.MethodPost, "/internal/v1/events", emit, strings.Replace(body, "Invoice paid", "Invoice refunded", 1))
	if other.status != 422 {
		t.Errorf("same key, other request = %d", other.status)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, `{"type":"t"}`); r.status != 400 {
		t.Errorf("missing key = %d", r.status)
	}
	if r := h.request(http.MethodPost, "/internal/v1/events", emit, body, "Content-Type", "text/plain"); r.status != 415 {
		t.Errorf("text/plain = %d", r.status)
	}
	feed := h.request(http.MethodGet, "/v1/notifications", h.iss.Token("bob"), "")
	if items := feed.body["data"].([]any); len(items) != 1 || items[0].(map[string]any)["producer"] != "billing" {
		t.Errorf("bob's feed after ingress = %s", feed.raw)
	}
}

func TestInternalIngressAnswersAHalfClosedRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	const n = 50
	statuses := make(chan int, n)
	for i := range n {
		go func() {
			body := fmt.Sprintf(`{"idempotency_key":"half-%d","type":"t","recipients":["alice"],"title":"t"}`, i)
			conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
			if err != nil {
				statuses <- 0
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /internal/v1/events HTTP/1.1\r\nHost: central\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", emit, len(body), body)
			conn.(*net.TCPConn).CloseWrite()
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				statuses <- 0
				return
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !bytes.Contains(raw, []byte(`"accepted"`)) {
				statuses <- -resp.StatusCode
				return
			}
			statuses <- resp.StatusCode
		}()
	}
	for range n {
		if s := <-statuses; s != http.StatusAccepted {
			t.Errorf("half-closed internal ingest answered %d; want 202 with its body", s)
		}
	}
	var stored int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE user_id = 'alice'`).Scan(&stored); err != nil || stored != n {
		t.Errorf("notifications = %d (%v), want %d", stored, err, n)
	}
}
