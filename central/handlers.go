package central

// This file holds how every route of central is wrapped: authentication and
// its refusals, instrumentation, JSON request bodies, and the answer to a
// database failure.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/julienschmidt/httprouter"

	"github.com/spoolcast/spoolcast/apiversion"
	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/internal/ratelimit"
)

// access says which end users may call a route.
type access int

const (
	user  access = iota // any end user, on their own rows
	admin               // an end user with the admin role
)

type userHandler func(w http.ResponseWriter, r *http.Request, ps httprouter.Params, u auth.User)

type serviceHandler func(w http.ResponseWriter, r *http.Request, c auth.ServiceClaims)

// handle registers a route anyone may call: health, metrics, the API description.
func (s *Server) handle(method, path string, h http.HandlerFunc) {
	s.routes = append(s.routes, Route{Method: method, Path: path})
	s.router.Handler(method, path, s.metrics.instrument(method+" "+path, h))
}

func (s *Server) handleUser(method, path string, a access, h userHandler) {
	role := ""
	if a == admin {
		role = s.cfg.AdminRole
	}
	name := method + " " + path
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := s.cfg.Users.Authorize(r, role)
		if err != nil {
			s.denied(w, r, err)
			return
		}
		if !s.allowUser(w, r, u.ID) {
			return
		}
		h(w, r, httprouter.ParamsFromContext(r.Context()), u)
	})
	versioned := s.cfg.Versions.Wrap(name, apiversion.RequireApp(s.cfg.MinAppVersion, inner))
	s.routes = append(s.routes, Route{Method: method, Path: path})
	s.router.Handler(method, path, s.metrics.instrumentVersioned(name, s.cfg.Versions, versioned))
}

func (s *Server) handleService(method, path, scope string, h serviceHandler) {
	name := method + " " + path
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Services == nil {
			s.denied(w, r, fmt.Errorf("%w: service tokens are not configured on this server", auth.ErrBadToken))
			return
		}
		c, err := s.cfg.Services.Authorize(r, scope)
		if err != nil {
			s.denied(w, r, err)
			return
		}
		h(w, r, c)
	})
	s.routes = append(s.routes, Route{Method: method, Path: path})
	s.router.Handler(method, path, s.metrics.instrumentVersioned(name, s.cfg.Versions, s.cfg.Versions.Wrap(name, inner)))
}

// allowUser counts a request of user against --rate-limit-user, writes the
// RateLimit fields, and answers 429 (false) past the limit.
func (s *Server) allowUser(w http.ResponseWriter, r *http.Request, user string) bool {
	d := s.cfg.UserLimit.Allow(user)
	return s.limited(w, r, d, "user", "too many requests from this user; retry after Retry-After seconds (--rate-limit-user)")
}

// allowFailedAuth counts a request refused for its token against
// --rate-limit-ip, keyed by the client's address, and answers 429 (false)
// past the limit.
func (s *Server) allowFailedAuth(w http.ResponseWriter, r *http.Request) bool {
	d := s.cfg.FailedAuthLimit.Allow(s.cfg.TrustedProxies.ClientIP(r))
	return s.limited(w, r, d, "ip", "too many requests with a missing or bad token from this address; retry after Retry-After seconds (--rate-limit-ip)")
}

func (s *Server) limited(w http.ResponseWriter, r *http.Request, d ratelimit.Decision, limit, detail string) bool {
	d.SetHeaders(w.Header())
	if d.Allowed {
		return true
	}
	s.metrics.limited.WithLabelValues(limit).Inc()
	problem.Write(w, r, problem.New(http.StatusTooManyRequests, problem.RateLimited, detail))
	return false
}

// denied answers 401 for a missing or bad token and 403 for a valid one that
// lacks the role or scope, with a Bearer challenge either way; past
// --rate-limit-ip for the client's address, 429.
func (s *Server) denied(w http.ResponseWriter, r *http.Request, err error) {
	// The challenge rides on a 429 too: an app whose token expired, behind
	// an address others flood with bad tokens, still learns it must sign in.
	w.Header().Set("WWW-Authenticate", auth.Challenge(err))
	if !s.allowFailedAuth(w, r) {
		return
	}
	if errors.Is(err, auth.ErrForbidden) || errors.Is(err, auth.ErrNoRole) {
		problem.Write(w, r, problem.New(http.StatusForbidden, problem.Forbidden, err.Error()))
		return
	}
	reason := auth.Reason(err)
	s.refused(r, reason)
	detail := reason
	if errors.Is(err, auth.ErrNoToken) {
		detail = "send Authorization: Bearer <token>"
	}
	problem.Write(w, r, problem.New(http.StatusUnauthorized, problem.Unauthorized, detail))
}

// refused logs why a token was refused, at most one line per interval (a
// client retrying a stale token must not flood the log), never the token.
func (s *Server) refused(r *http.Request, reason string) {
	s.authLog.Do(func(suppressed int64) {
		s.log.Info("refused a token", "path", r.URL.Path, "reason", reason, "suppressed", suppressed)
	})
}

// dbContext bounds a request's Postgres work by DBTimeout.
func (s *Server) dbContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.DBTimeout)
}

// maxJSONBody caps the body of a user route that takes JSON (a device, a
// preferences document): far above any real one.
const maxJSONBody = 64 << 10

// readJSON decodes a small JSON body strictly into v, or answers 400, 413
// (over maxJSONBody, the limit in the detail) or 415.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	return readJSONUpTo(w, r, v, maxJSONBody)
}

// readJSONUpTo is readJSON for a body of at most maxJSONBody bytes.
func readJSONUpTo(w http.ResponseWriter, r *http.Request, v any, maxJSONBody int64) bool {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" && ct != "application/json; charset=utf-8" {
		problem.Write(w, r, problem.New(http.StatusUnsupportedMediaType, problem.UnsupportedMediaType, "send Content-Type: application/json"))
		return false
	}
	if r.ContentLength > maxJSONBody {
		problem.Write(w, r, problem.New(http.StatusRequestEntityTooLarge, problem.BodyTooLarge,
			fmt.Sprintf("the body is %d bytes; the limit is %d", r.ContentLength, maxJSONBody)))
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			problem.Write(w, r, problem.New(http.StatusRequestEntityTooLarge, problem.BodyTooLarge,
				fmt.Sprintf("the body exceeds the limit of %d bytes", tooLarge.Limit)))
			return false
		}
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "the body is not the JSON this route takes: "+err.Error()))
		return false
	}
	return true
}

// dbError answers 503 for a Postgres failure or timeout: the client should
// retry. It answers even a client that has gone: no request ends unanswered.
func (s *Server) dbError(w http.ResponseWriter, r *http.Request, what string, err error) {
	if r.Context().Err() == nil {
		s.dbLog.Do(func(suppressed int64) {
			s.log.Error("Postgres failed: "+what, "err", err, "suppressed", suppressed)
		})
	}
	w.Header().Set("Retry-After", "2")
	problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.DatabaseUnavailable, "the notification store is unavailable; retry shortly"))
}
