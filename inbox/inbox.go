// Package inbox is a small web page served by central at /inbox: a user's
// feed with infinite scroll, an unread badge, mark one or all read, and live
// arrivals through /v1/stream, resumed after a dropped connection, and Web
// Push in the browser. It is HTML, CSS and JavaScript embedded in the
// binary. Its script, static/inbox.js, is built from src/inbox.ts on the
// SDK's client, @spoolcast/client, by `make inbox` (build.mjs) and
// committed, so that building spoolcast never needs Node; a test fails
// when it differs from what its sources build. The page is the SDK's
// living example for app developers (docs/apps.md).
package inbox

import (
	"embed"
	"io/fs"
	"net/http"
	"regexp"
	"strings"
)

//go:embed static
var static embed.FS

// hostPort is a host name, IPv4 or bracketed IPv6 address, and an optional port.
var hostPort = regexp.MustCompile(`^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$`)

// Handler serves the page under prefix ("/inbox"): prefix itself is the
// page, prefix/inbox.js and prefix/inbox.css its assets, prefix/sw.js the
// service worker that shows Web Push messages (its scope is prefix/, the
// script's default).
func Handler(prefix string) http.Handler {
	files, _ := fs.Sub(static, "static")
	server := http.StripPrefix(prefix, http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Producer text is shown with textContent, never as markup; the
		// policy stops any script or connection but the page's own.
		// 'self' covers the page's own WebSocket in current browsers; the
		// explicit ws:// and wss:// sources are for older ones, and only
		// for a Host that is a plain host[:port], never text that would
		// change the policy.
		connect := "'self'"
		if hostPort.MatchString(r.Host) {
			connect += " ws://" + r.Host + " wss://" + r.Host
		}
		// worker-src is the service worker the page registers (sw.js).
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; worker-src 'self'; style-src 'self'; img-src 'self' data:; "+
			"connect-src "+connect+"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// no-cache: a new release reaches the page at once, and the browser
		// checks the service worker for an update at each registration.
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == prefix+"/sw.js" {
			// A worker script must have a JavaScript type; set here rather
			// than left to the system's MIME table.
			h.Set("Content-Type", "text/javascript; charset=utf-8")
		}
		if r.URL.Path == prefix || r.URL.Path == prefix+"/" {
			r = r.Clone(r.Context())
			r.URL.Path = prefix + "/"
		} else if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		server.ServeHTTP(w, r)
	})
}
