package central

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/julienschmidt/httprouter"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/webhook"
)

// maxAttemptsLimit caps one page of an endpoint's delivery log.
const maxAttemptsLimit = 200

// webhookError answers the store's errors.
func (s *Server) webhookError(w http.ResponseWriter, r *http.Request, what string, err error) {
	var input *webhook.InputError
	switch {
	case errors.As(err, &input):
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, input.Error()).On(input.Field))
	case errors.Is(err, webhook.ErrNotFound):
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no such webhook endpoint"))
	case errors.Is(err, webhook.ErrTooMany):
		problem.Write(w, r, problem.New(http.StatusConflict, problem.LimitReached, err.Error()))
	default:
		s.dbError(w, r, what, err)
	}
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request, _ httprouter.Params, _ auth.User) {
	var body webhook.NewEndpoint
	if !readJSON(w, r, &body) {
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	ep, err := s.cfg.Webhooks.Create(ctx, body)
	if err != nil {
		s.webhookError(w, r, "create webhook endpoint", err)
		return
	}
	w.Header().Set("Location", "/v1/admin/webhooks/"+ep.ID)
	httpapi.WriteJSON(w, http.StatusCreated, ep)
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request, _ httprouter.Params, _ auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	eps, err := s.cfg.Webhooks.List(ctx)
	if err != nil {
		s.webhookError(w, r, "list webhook endpoints", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Data []webhook.Endpoint `json:"data"`
	}{eps})
}

func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request, ps httprouter.Params, _ auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	ep, err := s.cfg.Webhooks.Get(ctx, ps.ByName("id"))
	if err != nil {
		s.webhookError(w, r, "read webhook endpoint", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, ep)
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request, ps httprouter.Params, _ auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	if err := s.cfg.Webhooks.Delete(ctx, ps.ByName("id")); err != nil {
		s.webhookError(w, r, "delete webhook endpoint", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) rotateWebhookSecret(w http.ResponseWriter, r *http.Request, ps httprouter.Params, _ auth.User) {
	var body struct {
		// Overlap is how long the old secret still signs, a Go duration ("24h").
		Overlap string `json:"overlap"`
	}
	if r.ContentLength != 0 && !readJSON(w, r, &body) {
		return
	}
	overlap := webhook.DefaultOverlap
	if body.Overlap != "" {
		d, err := time.ParseDuration(body.Overlap)
		if err != nil {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "overlap is a duration such as 24h").On("overlap"))
			return
		}
		overlap = d
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	secret, until, err := s.cfg.Webhooks.RotateSecret(ctx, ps.ByName("id"), overlap)
	if err != nil {
		s.webhookError(w, r, "rotate webhook secret", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Secret              string    `json:"secret"`
		PreviousSecretUntil time.Time `json:"previous_secret_until"`
	}{secret, until})
}

// replayTimeout bounds a replay's request.
const replayTimeout = 2 * time.Minute

func (s *Server) replayWebhook(w http.ResponseWriter, r *http.Request, ps httprouter.Params, _ auth.User) {
	var body struct {
		Since *time.Time `json:"since"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	if body.Since == nil {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "since is required: an RFC 3339 time").On("since"))
		return
	}
	// A replay's statements are each bounded, but a busy endpoint's week
	// is many of them: more time than a read.
	ctx, cancel := context.WithTimeout(r.Context(), max(s.cfg.DBTimeout, replayTimeout))
	defer cancel()
	n, err := s.cfg.Webhooks.Replay(ctx, ps.ByName("id"), *body.Since)
	if err != nil && n > 0 {
		w.Header().Set("Retry-After", "2")
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.DatabaseUnavailable,
			fmt.Sprintf("queued the newest %d deliveries before the replay was cut off (%v); replay again with the same since to finish it", n, err)))
		return
	}
	if err != nil {
		s.webhookError(w, r, "replay webhook deliveries", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusAccepted, struct {
		Queued int64 `json:"queued"`
	}{n})
}

// listWebhookAttempts is an endpoint's delivery log, newest first.
func (s *Server) listWebhookAttempts(w http.ResponseWriter, r *http.Request, ps httprouter.Params, _ auth.User) {
	query := r.URL.Query()
	limit := 50
	if v := query.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxAttemptsLimit {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidQuery, "limit must be a whole number from 1 to "+strconv.Itoa(maxAttemptsLimit)).On("limit"))
			return
		}
		limit = n
	}
	var before int64
	if v := query.Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor, "cursor is not one this server issued; start again without it").On("cursor"))
			return
		}
		before = n
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	attempts, err := s.cfg.Webhooks.Attempts(ctx, ps.ByName("id"), before, limit+1)
	if err != nil {
		s.webhookError(w, r, "read webhook attempts", err)
		return
	}
	page := struct {
		Data       []webhook.Attempt `json:"data"`
		NextCursor *string           `json:"next_cursor"`
	}{Data: attempts}
	if len(attempts) > limit {
		page.Data = attempts[:limit]
		next := strconv.FormatInt(attempts[limit-1].ID, 10)
		page.NextCursor = &next
	}
	httpapi.WriteJSON(w, http.StatusOK, page)
}
