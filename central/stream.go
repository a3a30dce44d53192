package central

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/problem"
)

// stream is GET /v1/stream: the token is checked before the upgrade, and a
// refusal is a plain HTTP answer that closes the connection (the upgrade
// writes its own headers, so Connection: close reaches refusals alone).
// Neither the answer nor the log ever repeats the token.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if s.cfg.Live == nil {
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.StreamDisabled, "this deployment serves no live stream"))
		return
	}
	if !s.originAllowed(r) {
		problem.Write(w, r, problem.New(http.StatusForbidden, problem.OriginNotAllowed,
			"this origin may not open the stream; the server's --allowed-origins lists those that may"))
		return
	}
	u, err := s.cfg.Users.AuthorizeWebSocket(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", auth.Challenge(err))
		if !s.allowFailedAuth(w, r) {
			return
		}
	}
	if err != nil {
		s.cfg.Live.Metrics().AuthFailed()
		reason := auth.Reason(err)
		s.refused(r, reason)
		w.Header().Set("WWW-Authenticate", auth.Challenge(err))
		detail := reason
		if errors.Is(err, auth.ErrNoToken) {
			detail = "send the token as Sec-WebSocket-Protocol: " + auth.WebSocketProtocol + ", <token>"
		}
		problem.Write(w, r, problem.New(http.StatusUnauthorized, problem.Unauthorized, detail))
		return
	}
	if !s.allowUser(w, r, u.ID) {
		return
	}
	s.cfg.Live.Serve(w, r, u.ID)
}

// originAllowed admits handshakes without Origin (native apps), from the
// server's own host, and from the configured origins.
func (s *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || slices.Contains(s.cfg.AllowedOrigins, "*") {
		return true
	}
	if slices.ContainsFunc(s.cfg.AllowedOrigins, func(o string) bool { return strings.EqualFold(strings.TrimSuffix(o, "/"), origin) }) {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}
