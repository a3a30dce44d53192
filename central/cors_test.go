package central_test

import (
	"net/http"
	"strings"
	"testing"
)

// A browser app on an allowed origin can call the API: its preflight is
// answered with what it may send, and each answer names the origin and the
// headers it may read (Retry-After among them). Another origin, and a page
// of the server's own, get no CORS fields.
func TestAnAllowedOriginMayCallTheAPIFromItsPages(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{origins: []string{"https://app.example.com"}})
	token := h.iss.Token("alice")

	preflight := func(origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodOptions, h.url+"/v1/notifications/read-all", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", http.MethodPost)
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, spoolcast-version")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := preflight("https://app.example.com")
	allowHeaders := strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers"))
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "POST") ||
		!strings.Contains(allowHeaders, "authorization") || !strings.Contains(allowHeaders, "spoolcast-version") || !strings.Contains(allowHeaders, "last-event-id") {
		t.Errorf("preflight from the allowed origin: %d %v; want 204 allowing POST, Authorization, Spoolcast-Version and Last-Event-ID", resp.StatusCode, resp.Header)
	}
	if resp := preflight("https://evil.example.com"); resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from another origin allowed it: %v", resp.Header)
	}

	r := h.request(http.MethodGet, "/v1/notifications/unread-count", token, "", "Origin", "https://app.example.com")
	if r.status != http.StatusOK || r.header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		!strings.Contains(r.header.Get("Access-Control-Expose-Headers"), "Retry-After") || !strings.Contains(r.header.Get("Vary"), "Origin") {
		t.Errorf("GET from the allowed origin: %d %v; want 200 shared with it, Retry-After readable, varying by Origin", r.status, r.header)
	}
	if r := h.request(http.MethodGet, "/v1/notifications/unread-count", token, "", "Origin", "https://evil.example.com"); r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("GET from another origin is shared with it: %v", r.header)
	}
	if r := h.request(http.MethodGet, "/healthz", "", "", "Origin", "https://app.example.com"); r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("a probe is shared with a page: %v", r.header)
	}
}
