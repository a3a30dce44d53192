package central_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// lockedBuffer collects log lines written from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// handshake sends a WebSocket handshake by hand and returns every byte the
// server sent until it closed the connection, or until the first frame
// after a 101.
func (h *harness) handshake(protocols, origin string) []byte {
	h.t.Helper()
	u, _ := url.Parse(h.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		h.t.Fatal(err)
	}
	defer conn.Close()
	req := "GET /v1/stream HTTP/1.1\r\nHost: " + u.Host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	if protocols != "" {
		req += "Sec-WebSocket-Protocol: " + protocols + "\r\n"
	}
	if origin != "" {
		req += "Origin: " + origin + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		h.t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	var raw bytes.Buffer
	_ = resp.Write(&raw)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The first frame: ready.
		b := make([]byte, 2)
		if _, err := io.ReadFull(br, b); err != nil {
			h.t.Fatal(err)
		}
		frame := make([]byte, int(b[1]&0x7f))
		if _, err := io.ReadFull(br, frame); err != nil {
			h.t.Fatal(err)
		}
		raw.Write(frame)
		return raw.Bytes()
	}
	// A refusal closes the connection after its body.
	if _, err := br.ReadByte(); err != io.EOF {
		h.t.Errorf("the connection stayed open after a %d refusal (%v)", resp.StatusCode, err)
	}
	return raw.Bytes()
}

// openStream opens a stream for user and reads its ready frame; the socket
// closes with the test.
func (h *harness) openStream(t *testing.T, user string) *wsclient.Conn {
	t.Helper()
	c, err := wsclient.Dial(context.Background(), h.url, h.iss.Token(user), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if m, err := c.Next(10 * time.Second); err != nil || m.Type != "ready" {
		t.Fatalf("first frame %v, %v; want ready", m, err)
	}
	return c
}

func (h *harness) metric(name string) string {
	h.t.Helper()
	r := h.request(http.MethodGet, "/metrics", "", "")
	for line := range strings.SplitSeq(string(r.raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

func TestStreamTokensAreCheckedBeforeTheUpgradeAndNeverRepeated(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	h := newHarness(t, options{live: true, log: logs})
	expired := h.iss.Claims("u1")
	expired["exp"] = time.Now().Add(-time.Minute).Unix()
	wrongAudience := h.iss.Claims("u1")
	wrongAudience["aud"] = "someone-else"
	refused := []struct {
		name, protocols, token string
	}{
		{name: "missing", protocols: "spoolcast.bearer.v1"},
		{name: "garbage", protocols: "spoolcast.bearer.v1, not-a-token-at-all", token: "not-a-token-at-all"},
		{name: "expired", token: h.iss.Sign(expired)},
		{name: "another audience", token: h.iss.Sign(wrongAudience)},
		{name: "token without the protocol name", protocols: h.iss.Token("u1")},
	}
	for _, c := range refused {
		protocols := c.protocols
		if protocols == "" {
			protocols = "spoolcast.bearer.v1, " + c.token
		}
		raw := h.handshake(protocols, "")
		if !bytes.HasPrefix(raw, []byte("HTTP/1.1 401 ")) || !bytes.Contains(raw, []byte("application/problem+json")) {
			t.Errorf("%s: %q, want a plain 401 problem", c.name, raw)
		}
		for _, secret := range []string{c.token, c.protocols} {
			if secret != "" && secret != "spoolcast.bearer.v1" && bytes.Contains(raw, []byte(secret)) {
				t.Errorf("%s: the response repeats the token", c.name)
			}
		}
	}
	if got := h.metric("spoolcast_ws_auth_failures_total"); got != "5" {
		t.Errorf("spoolcast_ws_auth_failures_total = %q, want 5", got)
	}

	token := h.iss.Token("u1")
	raw := h.handshake("spoolcast.bearer.v1, "+token, "")
	if !bytes.HasPrefix(raw, []byte("HTTP/1.1 101 ")) || !bytes.Contains(raw, []byte("Sec-Websocket-Protocol: spoolcast.bearer.v1\r\n")) ||
		!bytes.Contains(raw, []byte(`"type":"ready"`)) {
		t.Errorf("a valid token: %q, want 101 echoing only the protocol, then ready", raw)
	}
	if bytes.Contains(raw, []byte(token)) {
		t.Error("the upgrade repeats the token")
	}
	for _, c := range refused {
		if c.token != "" && strings.Contains(logs.String(), c.token) {
			t.Errorf("the logs hold the %s token", c.name)
		}
	}
	if strings.Contains(logs.String(), token) {
		t.Error("the logs hold the valid token")
	}
	if !strings.Contains(logs.String(), "refused a token") {
		t.Error("refusals are not logged at all")
	}
}

func TestStreamOriginsAreChecked(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true, origins: []string{"https://app.example.com"}})
	token := "spoolcast.bearer.v1, " + h.iss.Token("u1")
	if raw := h.handshake(token, "https://evil.example"); !bytes.HasPrefix(raw, []byte("HTTP/1.1 403 ")) {
		t.Errorf("a foreign origin: %q, want 403", raw)
	}
	for _, origin := range []string{"https://app.example.com", "", "http://" + strings.TrimPrefix(h.url, "http://")} {
		if raw := h.handshake(token, origin); !bytes.HasPrefix(raw, []byte("HTTP/1.1 101 ")) {
			t.Errorf("origin %q: %q, want 101", origin, raw)
		}
	}
}

// A user past --max-sockets-per-user is told to wait by Retry-After alone:
// the RateLimit fields of --rate-limit-user, which this refusal is not,
// would tell the app it may retry at once.
func TestTooManySocketsIsAnsweredWithRetryAfterAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true, maxSocketsPerUser: 1, userRate: "20/s"})
	h.openStream(t, "u1")
	raw := h.handshake("spoolcast.bearer.v1, "+h.iss.Token("u1"), "")
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "10" {
		t.Errorf("the second socket: %d, Retry-After %q; want 429 with Retry-After 10", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for _, f := range []string{"RateLimit", "RateLimit-Policy"} {
		if v := resp.Header.Get(f); v != "" {
			t.Errorf("the too-many-sockets answer carries %s: %q", f, v)
		}
	}
}

func TestAStreamFrameCarriesTheFeedsItem(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true})
	c := h.openStream(t, "u1")
	h.seed("u1", 1)
	m, err := c.Next(10 * time.Second)
	if err != nil || m.Type != "notification" {
		t.Fatalf("frame %v, %v; want the notification", m, err)
	}
	// The frame's data is the feed's item, id and all.
	page := h.request(http.MethodGet, "/v1/notifications", h.iss.Token("u1"), "")
	item, _ := m.Item()
	if !strings.Contains(string(page.raw), `"id":"`+item.ID+`"`) {
		t.Errorf("the frame's id %s is not the feed's (%s)", item.ID, page.raw)
	}
}

func TestInternalIngressWakesListenersButNotOncePerRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	ctx := context.Background()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+ingest.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	// 20 events at once: they commit within a few wake-up intervals, and
	// wake listeners a few times, not 20.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"idempotency_key":"burst:%d","type":"t","recipients":["alice"],"title":"t"}`, i)
			req, _ := http.NewRequest(http.MethodPost, h.url+"/internal/v1/events", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+emit)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				t.Errorf("event %d: %d", i, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	wakes := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			break
		}
		wakes++
	}
	if wakes == 0 || wakes >= 20 {
		t.Errorf("%d wake-ups for 20 commits; want at least one, and fewer than one per commit", wakes)
	}
}

func TestRefusedTokensAreToldWhyAndLoggedAtALimitedRate(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	h := newHarness(t, options{log: logs})
	expired := h.iss.Claims("u1")
	expired["exp"] = time.Now().Add(-time.Minute).Unix()
	foreign := h.iss.Claims("u1")
	foreign["aud"] = "another-api"
	for _, c := range []struct{ token, says string }{
		{h.iss.Sign(expired), "expired"},
		{h.iss.Sign(foreign), "another audience"},
		{"garbage", "not a well-formed JWT"},
	} {
		r := h.request(http.MethodGet, "/v1/notifications", c.token, "")
		if r.status != http.StatusUnauthorized || !strings.Contains(r.body["detail"].(string), c.says) {
			t.Errorf("%d %s; want 401 saying %q", r.status, r.raw, c.says)
		}
		if strings.Contains(string(r.raw), c.token) {
			t.Error("the answer repeats the token")
		}
	}
	// Three refusals within the interval: one line, naming the first reason.
	if n := strings.Count(logs.String(), "refused a token"); n != 1 {
		t.Errorf("%d log lines for 3 refusals in a moment; want 1\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "level=INFO") || !strings.Contains(logs.String(), "expired") {
		t.Errorf("log: %s", logs.String())
	}
}
