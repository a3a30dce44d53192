package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/internal/pgtest"
)

// get sends GET base+path with token (none when empty) and returns the
// answer, its body read.
func get(t *testing.T, url, token string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// Each user's requests are limited (a burst of twice the rate, then 429
// with Retry-After and the RateLimit fields), each user apart; requests
// with a bad token are limited by address, after which they are 429, not
// 401.
func TestCentralLimitsEachUsersRequestsAndBadTokensByAddress(t *testing.T) {
	t.Parallel()
	base, iss := startCentralProcess(t, pgtest.DB(t), "--rate-limit-user", "1/h", "--rate-limit-ip", "1/h")
	alice, bob := iss.Token("alice"), iss.Token("bob")
	for i := range 2 {
		resp, body := get(t, base+"/v1/notifications/unread-count", alice)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit-Policy") != `"user";q=2;w=7200` {
			t.Errorf("alice's request %d: %d %s, RateLimit-Policy %q", i+1, resp.StatusCode, body, resp.Header.Get("RateLimit-Policy"))
		}
	}
	resp, body := get(t, base+"/v1/notifications/unread-count", alice)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
		!strings.HasPrefix(resp.Header.Get("RateLimit"), `"user";r=0;t=`) || !strings.Contains(body, "rate-limited") {
		t.Errorf("alice's third request: %d %s, Retry-After %q, RateLimit %q; want 429 rate-limited with both", resp.StatusCode, body,
			resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
	if resp, body := get(t, base+"/v1/notifications/unread-count", bob); resp.StatusCode != http.StatusOK {
		t.Errorf("bob after alice's limit: %d %s; want 200", resp.StatusCode, body)
	}

	for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
		resp, body := get(t, base+"/v1/notifications", "not-a-token")
		if resp.StatusCode != want {
			t.Errorf("bad token %d: %d %s; want %d", i+1, resp.StatusCode, body, want)
		}
		// Even limited, the answer says the token is the trouble.
		if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("bad token %d: WWW-Authenticate %q, want a Bearer challenge", i+1, resp.Header.Get("WWW-Authenticate"))
		}
	}
	if resp, body := get(t, base+"/v1/notifications/unread-count", bob); resp.StatusCode != http.StatusOK {
		t.Errorf("bob from the same address after the bad tokens: %d %s; want 200 (a valid token is not counted)", resp.StatusCode, body)
	}
}

// Behind a trusted load balancer, bad tokens are limited by the client
// address it forwards, each client apart, and what a client writes into
// X-Forwarded-For itself picks no fresh bucket.
func TestCentralLimitsBadTokensByTheAddressATrustedProxyForwards(t *testing.T) {
	t.Parallel()
	base, _ := startCentralProcess(t, pgtest.DB(t), "--rate-limit-ip", "1/h", "--trusted-proxies", "127.0.0.0/8")
	badToken := func(forwardedFor string) int {
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/notifications", nil)
		req.Header.Set("Authorization", "Bearer not-a-token")
		req.Header.Set("X-Forwarded-For", forwardedFor)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, tc := range []struct {
		forwardedFor string
		want         int
	}{
		{"203.0.113.1", http.StatusUnauthorized},
		{"203.0.113.1", http.StatusUnauthorized},
		{"203.0.113.1", http.StatusTooManyRequests},
		{"203.0.113.2", http.StatusUnauthorized},                  // another client behind the same proxy
		{"198.51.100.7, 203.0.113.1", http.StatusTooManyRequests}, // the client's own entry, left of the proxy's, changes nothing
	} {
		if got := badToken(tc.forwardedFor); got != tc.want {
			t.Errorf("request %d, X-Forwarded-For %q: %d, want %d", i+1, tc.forwardedFor, got, tc.want)
		}
	}
}
