package inbox_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/inbox"
)

func get(t *testing.T, h http.Handler, path, host string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Host = host
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func TestThePageAndItsAssetsAreServedUnderTheirPolicy(t *testing.T) {
	h := inbox.Handler("/inbox")
	for path, want := range map[string]string{
		"/inbox":           "text/html",
		"/inbox/":          "text/html",
		"/inbox/inbox.js":  "text/javascript",
		"/inbox/inbox.css": "text/css",
		"/inbox/sw.js":     "text/javascript",
	} {
		resp := get(t, h, path, "central.example.com:8080")
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), want) || len(body) == 0 {
			t.Errorf("GET %s = %d %q; want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self';") || !strings.Contains(csp, "worker-src 'self';") || !strings.Contains(csp, "connect-src 'self' ws://central.example.com:8080 wss://central.example.com:8080;") {
			t.Errorf("GET %s: policy %q", path, csp)
		}
		// no-cache: a new release, and a new service worker, is seen at once.
		if resp.Header.Get("Referrer-Policy") != "no-referrer" || resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Cache-Control") != "no-cache" {
			t.Errorf("GET %s: headers %v", path, resp.Header)
		}
	}
	if resp := get(t, h, "/inbox/static/", "localhost"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a directory = %d, want 404", resp.StatusCode)
	}
}

func TestAHostileHostCannotChangeThePolicy(t *testing.T) {
	h := inbox.Handler("/inbox")
	for _, host := range []string{"x,*", "x;script-src-elem *", "x *"} {
		csp := get(t, h, "/inbox", host).Header.Get("Content-Security-Policy")
		if strings.Contains(csp, host) || strings.Count(csp, ";") != 8 || strings.Contains(csp, "*") {
			t.Errorf("Host %q: policy %q", host, csp)
		}
		if !strings.Contains(csp, "connect-src 'self';") {
			t.Errorf("Host %q: policy %q; want connect-src 'self' alone", host, csp)
		}
	}
	for _, host := range []string{"127.0.0.1:8080", "[::1]:8080", "localhost"} {
		if csp := get(t, h, "/inbox", host).Header.Get("Content-Security-Policy"); !strings.Contains(csp, "ws://"+host+" ") {
			t.Errorf("Host %q: policy %q; want its ws:// source", host, csp)
		}
	}
}
