package central_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/sseclient"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
)

// ticket asks central for a stream ticket with user's token.
func (h *harness) ticket(user string) string {
	h.t.Helper()
	r := h.request(http.MethodPost, "/v1/stream/tickets", h.iss.Token(user), "")
	if r.status != http.StatusCreated {
		h.t.Fatalf("POST /v1/stream/tickets: %d %s", r.status, r.raw)
	}
	if cc := r.header.Get("Cache-Control"); cc != "no-store" {
		h.t.Errorf("a ticket's answer has Cache-Control %q, want no-store", cc)
	}
	return r.body["ticket"].(string)
}

// openSSE opens an event stream on h and reads up to its ready frame; it
// closes when the test ends.
func (h *harness) openSSE(t *testing.T, o sseclient.Options) *sseclient.Conn {
	t.Helper()
	c, err := sseclient.Dial(context.Background(), h.url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if m, err := c.Next(10 * time.Second); err != nil || m.Type != "ready" {
		t.Fatalf("first frame %s, %v; want ready", m.Raw, err)
	}
	return c
}

// sseRefused opens an event stream that must be refused and returns the
// refusal, checking that it is a problem document that closes the
// connection.
func (h *harness) sseRefused(t *testing.T, o sseclient.Options) (*http.Response, map[string]any) {
	t.Helper()
	c, err := sseclient.Dial(context.Background(), h.url, o)
	if err == nil {
		c.Close()
		t.Fatal("the event stream opened; want a refusal")
	}
	if c == nil {
		t.Fatal(err)
	}
	var body map[string]any
	_ = json.NewDecoder(c.Response.Body).Decode(&body)
	if c.Response.Header.Get("Content-Type") != "application/problem+json" || !c.Response.Close {
		t.Errorf("a %d refusal: %q, close %v; want a problem document that closes the connection", c.Response.StatusCode, c.Response.Header.Get("Content-Type"), c.Response.Close)
	}
	return c.Response, body
}

func ticketQuery(ticket string) sseclient.Options {
	return sseclient.Options{Query: url.Values{"ticket": {ticket}}}
}

// A browser's EventSource opens the stream with a ticket asked for with the
// token: it opens one stream, of its own user, and is refused after; the
// token never rides in the URL, and neither the answers nor the logs repeat
// the ticket.
func TestAStreamTicketOpensOneEventStreamOfItsUser(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	h := newHarness(t, options{live: true, log: logs})
	ticket := h.ticket("u1")
	c := h.openSSE(t, ticketQuery(ticket))
	// u2's notification commits first: were the stream u2's too, it would
	// come first.
	h.seed("u2", 1)
	h.seed("u1", 1)
	m, err := c.Next(10 * time.Second)
	if err != nil || m.Type != "notification" {
		t.Fatalf("frame %s, %v; want u1's notification", m.Raw, err)
	}
	page := h.request(http.MethodGet, "/v1/notifications", h.iss.Token("u1"), "")
	it, _ := m.Item()
	if !strings.Contains(string(page.raw), `"id":"`+it.ID+`"`) {
		t.Errorf("the ticket's stream sent %s, which is not in u1's feed", m.Raw)
	}
	for name, tk := range map[string]string{"used": ticket, "unknown": strings.Repeat("A", 43), "malformed": "not-a-ticket"} {
		resp, body := h.sseRefused(t, ticketQuery(tk))
		if resp.StatusCode != http.StatusUnauthorized || body["type"] != "urn:spoolcast:problem:unauthorized" ||
			!strings.Contains(fmt.Sprint(body["detail"]), "POST /v1/stream/tickets") || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("a %s ticket: %d %v; want 401 saying to ask for a new ticket, with a challenge", name, resp.StatusCode, body)
		}
		if strings.Contains(fmt.Sprint(body), tk) {
			t.Errorf("the refusal of a %s ticket repeats it", name)
		}
	}
	if strings.Contains(logs.String(), ticket) {
		t.Error("the logs hold the ticket")
	}
	for series, want := range map[string]string{
		`spoolcast_stream_tickets_total{result="issued"}`:                     "1",
		`spoolcast_stream_tickets_total{result="redeemed"}`:                   "1",
		`spoolcast_stream_tickets_total{result="refused"}`:                    "3",
		"spoolcast_ws_auth_failures_total":                                    "3",
		"spoolcast_sse_connections":                                           "1",
		`spoolcast_central_requests_total{code="200",route="GET /v1/stream"}`: "1",
	} {
		if got := h.metric(series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
	// The header form needs no ticket; a ticket beside it is not used.
	spare := h.ticket("u1")
	o := ticketQuery(spare)
	o.Token = h.iss.Token("u1")
	h.openSSE(t, o)
	h.openSSE(t, ticketQuery(spare))
}

// A ticket is valid for 30 seconds from its issue, by central's clock.
func TestAStreamTicketExpiresAfterThirtySeconds(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	h := newHarness(t, options{live: true, clock: clk})
	r := h.request(http.MethodPost, "/v1/stream/tickets", h.iss.Token("u1"), "")
	expires, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r.body["expires_at"]))
	if err != nil || !expires.Equal(clk.Now().Add(30*time.Second).Truncate(time.Microsecond)) {
		t.Errorf("expires_at %v (%v); want 30 s from its issue", r.body["expires_at"], err)
	}
	clk.Advance(29 * time.Second)
	h.openSSE(t, ticketQuery(r.body["ticket"].(string)))
	late := h.ticket("u1")
	clk.Advance(30 * time.Second)
	if resp, body := h.sseRefused(t, ticketQuery(late)); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a ticket 30 s old: %d %v; want 401", resp.StatusCode, body)
	}
}

// Tickets live in Postgres: one replica issues, another redeems, and then
// neither takes it again.
func TestATicketIssuedByOneReplicaOpensTheStreamOnAnother(t *testing.T) {
	t.Parallel()
	a := newHarness(t, options{live: true})
	b := newHarness(t, options{live: true, pool: a.pool, iss: a.iss})
	ticket := a.ticket("u1")
	b.openSSE(t, ticketQuery(ticket))
	for name, h := range map[string]*harness{"the replica that issued it": a, "the one that took it": b} {
		if resp, _ := h.sseRefused(t, ticketQuery(ticket)); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("the ticket again at %s: %d; want 401", name, resp.StatusCode)
		}
	}
}

// A ticket is used up only by a stream that opens: a handshake refused for
// another reason (here, the user's streams at their cap) leaves the app its
// ticket, which opens the stream once there is room, and only once.
func TestATicketRefusedForAnotherReasonIsNotUsedUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true, maxSocketsPerUser: 1})
	first := h.openSSE(t, sseclient.Options{Token: h.iss.Token("u1")})
	ticket := h.ticket("u1")
	if resp, body := h.sseRefused(t, ticketQuery(ticket)); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the ticket beside u1's stream at its cap: %d %v; want 429", resp.StatusCode, body)
	}
	first.Close()
	var opened bool
	deadline := time.Now().Add(10 * time.Second)
	for !opened && time.Now().Before(deadline) {
		c, err := sseclient.Dial(context.Background(), h.url, ticketQuery(ticket))
		if err == nil {
			opened = true
			t.Cleanup(func() { c.Close() })
			break
		}
		if !strings.Contains(err.Error(), "429") { // the first stream's slot not yet given back
			t.Fatalf("the ticket once the first stream closed: %v; want the stream", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !opened {
		t.Fatal("the ticket refused at the cap never opened the stream")
	}
	if resp, _ := h.sseRefused(t, ticketQuery(ticket)); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the ticket again: %d; want 401, used up", resp.StatusCode)
	}
}

// Every refusal of an event stream is a plain problem before the stream,
// and closes the connection, as the WebSocket's are.
func TestEventStreamRefusalsAreProblemsThatCloseTheConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true, origins: []string{"https://app.example.com"}, maxSocketsPerUser: 1, userRate: "20/s"})
	token := h.iss.Token("u1")
	withHeader := func(k, v string) sseclient.Options {
		o := sseclient.Options{Token: token, Header: http.Header{}}
		o.Header.Set(k, v)
		return o
	}
	resp, body := h.sseRefused(t, sseclient.Options{})
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(fmt.Sprint(body["detail"]), "ticket") {
		t.Errorf("no token: %d %v; want 401 naming both ways to authenticate", resp.StatusCode, body)
	}
	if resp, body := h.sseRefused(t, withHeader("Origin", "https://evil.example")); resp.StatusCode != http.StatusForbidden || body["type"] != "urn:spoolcast:problem:origin-not-allowed" {
		t.Errorf("a foreign origin: %d %v; want 403 origin-not-allowed", resp.StatusCode, body)
	}
	if resp, body := h.sseRefused(t, withHeader("Last-Event-ID", "not-a-cursor")); resp.StatusCode != http.StatusBadRequest || body["field"] != "Last-Event-ID" {
		t.Errorf("a bad Last-Event-ID: %d %v; want 400 naming Last-Event-ID", resp.StatusCode, body)
	}
	h.openSSE(t, withHeader("Origin", "https://app.example.com"))
	for _, name := range []string{"an event stream", "a WebSocket"} {
		var resp *http.Response
		var body map[string]any
		if name == "a WebSocket" {
			r, err := http.ReadResponse(bufioReader(h.handshake("spoolcast.bearer.v1, "+token, "")), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp = r
			_ = json.NewDecoder(r.Body).Decode(&body)
		} else {
			resp, body = h.sseRefused(t, sseclient.Options{Token: token})
		}
		if resp.StatusCode != http.StatusTooManyRequests || body["type"] != "urn:spoolcast:problem:too-many-sockets" || resp.Header.Get("Retry-After") != "10" || resp.Header.Get("RateLimit") != "" {
			t.Errorf("%s beside u1's event stream: %d %v, Retry-After %q, RateLimit %q; want 429 too-many-sockets with Retry-After 10 alone",
				name, resp.StatusCode, body, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.hub.Shutdown(ctx)
	if resp, body := h.sseRefused(t, sseclient.Options{Token: h.iss.Token("u2")}); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a replica shutting down: %d %v; want 503 with Retry-After", resp.StatusCode, body)
	}
}

// An app on an event stream says what it has shown with POST
// /v1/stream/seen, as a WebSocket's app sends a seen message; the user is
// present while only an event stream is open.
func TestSeenPostedForAnEventStreamMovesTheUsersSeenPosition(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true, presence: true})
	token := h.iss.Token("u1")
	c := h.openSSE(t, sseclient.Options{Token: token})
	testsignal.Eventually(t, "u1's presence to be recorded", 10*time.Second, func() bool {
		return pgtest.Count(t, h.pool, `SELECT count(*) FROM stream_presence WHERE user_id = 'u1'`) == 1
	})
	h.seed("u1", 2)
	var frames []wsclient.Message
	for len(frames) < 2 {
		m, err := c.Next(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, m)
	}
	seenThrough := func() live.Position {
		var p live.Position
		_ = h.pool.QueryRow(context.Background(), `SELECT through_tx::text::bigint, through_id FROM stream_seen WHERE user_id = 'u1'`).Scan(&p.Tx, &p.ID)
		return p
	}
	first, _ := live.ParseCursor(frames[0].Cursor)
	if r := h.request(http.MethodPost, "/v1/stream/seen", token, fmt.Sprintf(`{"cursor":%q}`, frames[0].Cursor)); r.status != http.StatusNoContent {
		t.Fatalf("POST /v1/stream/seen: %d %s", r.status, r.raw)
	}
	testsignal.Eventually(t, "the seen position to be recorded", 10*time.Second, func() bool { return seenThrough() == first.Position })
	// The WebSocket's message, sent as it is, works too.
	second, _ := live.ParseCursor(frames[1].Cursor)
	if r := h.request(http.MethodPost, "/v1/stream/seen", token, fmt.Sprintf(`{"type":"seen","cursor":%q}`, frames[1].Cursor)); r.status != http.StatusNoContent {
		t.Fatalf("POST /v1/stream/seen with the seen message: %d %s", r.status, r.raw)
	}
	testsignal.Eventually(t, "the seen position to move on", 10*time.Second, func() bool { return seenThrough() == second.Position })
	for _, bad := range []string{`{"cursor":"not-a-cursor"}`, `{"type":"hello","cursor":""}`, `{}`} {
		if r := h.request(http.MethodPost, "/v1/stream/seen", token, bad); r.status != http.StatusBadRequest {
			t.Errorf("POST /v1/stream/seen %s: %d %s; want 400", bad, r.status, r.raw)
		}
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
