package central

import (
	"net/http"
	"slices"
	"strings"

	"github.com/spoolcast/spoolcast/apiversion"
)

// CORS for browser apps on other origins. The API takes bearer tokens, never
// cookies, so a response may be shared with any origin the operator listed
// (--allowed-origins) without credentials: a page of another origin learns
// nothing a script holding the user's token could not ask for itself. Only
// the public API (/v1/…) is shared; the server's own host needs no CORS.

// corsAllowHeaders are the request headers an app may send: its token, JSON
// bodies, the API and app versions, the replica-read marker and an event
// stream's resume.
var corsAllowHeaders = strings.Join([]string{"Authorization", "Content-Type", apiversion.Header, apiversion.AppHeader, WrittenAtHeader, "Last-Event-ID"}, ", ")

// corsExposeHeaders are the answer headers an app must be able to read: when
// to retry, the rate limit's fields, and the marker its next reads send back.
var corsExposeHeaders = strings.Join([]string{"Retry-After", "RateLimit", "RateLimit-Policy", WrittenAtHeader, apiversion.Header}, ", ")

// withCORS answers preflights for the public API and marks its answers as
// shareable with the allowed origins.
func (s *Server) withCORS(next http.Handler) http.Handler {
	if len(s.cfg.AllowedOrigins) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" || !strings.HasPrefix(r.URL.Path, "/v1/") || !s.corsOrigin(origin) {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		h.Set("Access-Control-Allow-Origin", origin)
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
			h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE")
			h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		next.ServeHTTP(w, r)
	})
}

// corsOrigin reports whether origin is one of --allowed-origins (or they
// allow any).
func (s *Server) corsOrigin(origin string) bool {
	return slices.ContainsFunc(s.cfg.AllowedOrigins, func(o string) bool {
		return o == "*" || strings.EqualFold(strings.TrimSuffix(o, "/"), origin)
	})
}
