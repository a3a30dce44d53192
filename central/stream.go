package central

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/live"
)

// stream is GET /v1/stream, a WebSocket or an event stream: the token (or
// an event stream's ticket) is checked before the upgrade, and a refusal is
// a plain HTTP answer that closes the connection (the upgrade writes its own
// headers, so Connection: close reaches refusals alone). Neither the answer
// nor the log ever repeats the token or the ticket.
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
	sse := live.WantsEventStream(r)
	var u auth.User
	var redeem func(context.Context) error
	var err error
	if sse {
		u, redeem, err = s.authorizeEventStream(r)
	} else {
		u, err = s.cfg.Users.AuthorizeWebSocket(r)
	}
	if errors.Is(err, errTicketStore) {
		// The tickets' store failed: not the client's fault.
		s.dbLog.Do(func(suppressed int64) {
			s.log.Error("Postgres failed: redeem a stream ticket", "err", err, "suppressed", suppressed)
		})
		w.Header().Set("Retry-After", "1")
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "the stream cannot check the ticket now; reconnect with a new one"))
		return
	}
	if err != nil {
		w.Header().Set("WWW-Authenticate", auth.Challenge(err))
		if !s.allowFailedAuth(w, r) {
			return
		}
		s.cfg.Live.Metrics().AuthFailed()
		reason := auth.Reason(err)
		s.refused(r, reason)
		detail := reason
		switch {
		case errors.Is(err, live.ErrTicket):
			detail = live.TicketRefused
		case sse && errors.Is(err, auth.ErrNoToken):
			detail = "send Authorization: Bearer <token>, or (a browser's EventSource) ?ticket= from POST /v1/stream/tickets"
		case errors.Is(err, auth.ErrNoToken):
			detail = "send the token as Sec-WebSocket-Protocol: " + auth.WebSocketProtocol + ", <token>"
		}
		problem.Write(w, r, problem.New(http.StatusUnauthorized, problem.Unauthorized, detail))
		return
	}
	if !s.allowUser(w, r, u.ID) {
		return
	}
	s.cfg.Live.ServeTicket(w, r, u.ID, redeem)
	if rec, ok := w.(*httpapi.Recorder); ok && sse && rec.Status == http.StatusSwitchingProtocols {
		rec.Status = http.StatusOK // the event stream took the connection over to answer 200 on it
	}
}

// authorizeEventStream checks an event stream's caller: the bearer token
// when Authorization is sent, else the one-use ticket in ?ticket= (a
// browser's EventSource, which cannot send headers). A ticket is checked
// here and used up by redeem, which the hub calls once the handshake
// passed its other checks: a handshake refused for another reason leaves
// the app its ticket.
func (s *Server) authorizeEventStream(r *http.Request) (auth.User, func(context.Context) error, error) {
	if r.Header.Get("Authorization") != "" || !r.URL.Query().Has("ticket") {
		u, err := s.cfg.Users.Authorize(r, "")
		return u, nil, err
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	ticket := r.URL.Query().Get("ticket")
	user, err := s.tickets.User(ctx, ticket)
	if errors.Is(err, live.ErrTicket) {
		return auth.User{}, nil, fmt.Errorf("%w: %w", auth.ErrBadToken, err)
	}
	if err != nil {
		return auth.User{}, nil, fmt.Errorf("%w: %w", errTicketStore, err)
	}
	redeem := func(ctx context.Context) error {
		redeemed, err := s.tickets.Redeem(ctx, ticket)
		if err == nil && redeemed != user {
			return live.ErrTicket
		}
		return err
	}
	return auth.User{ID: user}, redeem, nil
}

// errTicketStore: the tickets' store failed (answer 503).
var errTicketStore = errors.New("stream tickets unavailable")

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
