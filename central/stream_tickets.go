package central

import (
	"errors"
	"net/http"

	"github.com/julienschmidt/httprouter"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/live"
)

// createStreamTicket is POST /v1/stream/tickets: a one-use ticket, valid for
// live.TicketTTL, that opens the caller's event stream from a browser's
// EventSource (GET /v1/stream?ticket=…), which cannot send the token.
func (s *Server) createStreamTicket(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	if s.cfg.Live == nil {
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.StreamDisabled, "this deployment serves no live stream"))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	t, err := s.tickets.Issue(ctx, u.ID)
	if err != nil {
		s.dbError(w, r, "issue a stream ticket", err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	httpapi.WriteJSON(w, http.StatusCreated, t)
}

// streamSeen is POST /v1/stream/seen: what a seen message does on a
// WebSocket, for an app on an event stream, which cannot send on it; written
// before the answer (a WebSocket's within a second).
func (s *Server) streamSeen(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	if s.cfg.Live == nil {
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.StreamDisabled, "this deployment serves no live stream"))
		return
	}
	var body struct {
		Type   string `json:"type"` // optional: the WebSocket's message, sent as it is, is taken too
		Cursor string `json:"cursor"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	if body.Type != "" && body.Type != "seen" {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, `type, when sent, is "seen"`).On("type"))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	err := s.cfg.Live.Seen(ctx, u.ID, body.Cursor)
	switch {
	case errors.Is(err, live.ErrBadCursor):
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor, "cursor is not a stream cursor this server issued: send the cursor of the last frame shown").On("cursor"))
	case err != nil:
		s.dbError(w, r, "record seen", err)
	default:
		s.wrote(ctx, w, r, u.ID)
		w.WriteHeader(http.StatusNoContent)
	}
}
