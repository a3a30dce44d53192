package live_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
)

// handshake sends a stream handshake for user, resuming after a cursor
// unless it is empty, without upgrading and returns the answer's status
// and Retry-After.
func handshake(t *testing.T, s *stack, user, after string) (int, string) {
	t.Helper()
	u := s.base + "/v1/stream"
	if after != "" {
		u += "?after=" + url.QueryEscape(after)
	}
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Sec-WebSocket-Protocol", wsclient.Protocol+", "+user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// One user's sockets are capped per replica (429 before the upgrade, with
// Retry-After), and so are the replica's (503, so that the load balancer
// tries another); a closed socket frees its place. The caps come before a
// resume's cursor is checked in Postgres: a capped handshake costs no query.
func TestSocketsAreCappedPerUserAndPerReplica(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) { c.MaxSocketsPerUser, c.MaxSockets = 2, 3 })
	first := s.dial("u1", "")
	_, cursor := s.ready(first)
	parsed, err := live.ParseCursor(cursor)
	if err != nil {
		t.Fatal(err)
	}
	// A cursor whose check in Postgres fails (400): a transaction this
	// cluster never had.
	unchecked := live.Cursor{Position: live.Position{Tx: parsed.Tx + 1<<32}, At: parsed.At}.String()
	if code, _ := handshake(t, s, "u1", unchecked); code != http.StatusBadRequest {
		t.Fatalf("a cursor beyond the cluster's transactions: %d, want 400", code)
	}
	s.ready(s.dial("u1", ""))
	if code, retry := handshake(t, s, "u1", ""); code != http.StatusTooManyRequests || retry == "" {
		t.Errorf("u1's third socket: %d, Retry-After %q; want 429 with Retry-After", code, retry)
	}
	if code, _ := handshake(t, s, "u1", unchecked); code != http.StatusTooManyRequests {
		t.Errorf("u1's third socket, resuming: %d; want 429 before the cursor is checked", code)
	}
	s.ready(s.dial("u2", ""))
	if code, retry := handshake(t, s, "u3", ""); code != http.StatusServiceUnavailable || retry == "" {
		t.Errorf("the replica's fourth socket: %d, Retry-After %q; want 503 with Retry-After", code, retry)
	}
	if code, _ := handshake(t, s, "u3", unchecked); code != http.StatusServiceUnavailable {
		t.Errorf("the replica's fourth socket, resuming: %d; want 503 before the cursor is checked", code)
	}
	if _, err := wsclient.Dial(t.Context(), s.base, "u1", ""); err == nil || !strings.Contains(err.Error(), "HTTP 429") {
		t.Errorf("u1's third socket by a client: %v; want HTTP 429", err)
	}
	first.Close()
	var again *wsclient.Conn
	testsignal.Eventually(t, "u1's closed socket to free its place", 10*time.Second, func() bool {
		c, err := wsclient.Dial(t.Context(), s.base, "u1", "")
		again = c
		return err == nil
	})
	defer again.Close()
	s.ready(again)
}
