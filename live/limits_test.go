package live_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
)

// handshake sends a stream handshake for user without upgrading and
// returns the answer's status and Retry-After.
func handshake(t *testing.T, s *stack, user string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.base+"/v1/stream", nil)
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
// tries another); a closed socket frees its place.
func TestSocketsAreCappedPerUserAndPerReplica(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) { c.MaxSocketsPerUser, c.MaxSockets = 2, 3 })
	first := s.dial("u1", "")
	s.ready(first)
	s.ready(s.dial("u1", ""))
	if code, retry := handshake(t, s, "u1"); code != http.StatusTooManyRequests || retry == "" {
		t.Errorf("u1's third socket: %d, Retry-After %q; want 429 with Retry-After", code, retry)
	}
	s.ready(s.dial("u2", ""))
	if code, retry := handshake(t, s, "u3"); code != http.StatusServiceUnavailable || retry == "" {
		t.Errorf("the replica's fourth socket: %d, Retry-After %q; want 503 with Retry-After", code, retry)
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
