// Package relay is the producer-facing loopback API of the sidecar: it
// validates events, authenticates callers when it must, claims each event's key
// in the spool and answers at once.
//
// The rule it keeps: a producer is never made to wait on, or fail because of,
// anything downstream of the spool. 202 means the event is durable on local disk.
package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/eventhttp"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/spool"
)

// Spool is what the relay needs of the spool.
type Spool interface {
	Claim(ctx context.Context, e spool.Entry) (spool.ClaimResult, error)
	Ping(ctx context.Context) error
}

var _ Spool = (*spool.Spool)(nil)

// Config configures the relay's HTTP API.
type Config struct {
	// Producer is the logical producing service that scopes idempotency keys.
	// Required.
	Producer string
	// Spool receives claims. Required.
	Spool Spool
	// MaxBody caps a request body in bytes. Default 64 KiB.
	MaxBody int64
	// Verifier, when set, requires every ingest request to carry a service token
	// with the push:emit scope. Nil accepts any caller (loopback only).
	Verifier *auth.ServiceVerifier
	// RetryAfter is what a 503 tells producers to wait. Default 5s.
	RetryAfter time.Duration
	// Registry serves /metrics and receives the relay's metrics. Default a new
	// registry with the Go and process collectors.
	Registry *prometheus.Registry
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case strings.TrimSpace(c.Producer) == "":
		return errors.New("producer is required: name the logical service this relay serves (the same on every replica)")
	case c.Spool == nil:
		return errors.New("spool is required")
	case c.MaxBody < 0:
		return fmt.Errorf("max body %d: must not be negative", c.MaxBody)
	}
	return nil
}

// Server answers the relay's HTTP API.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	handler http.Handler
	ops     http.Handler
}

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return reg
}

// New returns the relay's HTTP API.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.MaxBody = cmp.Or(cfg.MaxBody, 64<<10)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, 5*time.Second)
	if cfg.Registry == nil {
		cfg.Registry = NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "relay"), metrics: NewMetrics(cfg.Registry)}
	router := newRouter()
	router.HandlerFunc(http.MethodPost, "/v1/events", s.postEvent)
	s.routeOps(router)
	ops := newRouter()
	s.routeOps(ops)
	s.ops = ops
	s.handler = router
	return s, nil
}

// ServeHTTP implements http.Handler: ingest and the operations routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Ops serves only /healthz, /readyz and /metrics: for a listener that
// kubelet probes and Prometheus scrapes reach while ingest stays on loopback.
func (s *Server) Ops() http.Handler { return s.ops }

func (s *Server) routeOps(router *httprouter.Router) {
	router.HandlerFunc(http.MethodGet, "/healthz", s.healthz)
	router.HandlerFunc(http.MethodGet, "/readyz", s.readyz)
	router.Handler(http.MethodGet, "/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
}

func newRouter() *httprouter.Router {
	router := httprouter.New()
	router.NotFound = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, r, problem.New(http.StatusNotFound, "not-found", "Not found", "no route for "+r.URL.Path))
	})
	router.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, r, problem.New(http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed", r.Method+" is not allowed on "+r.URL.Path))
	})
	return router
}

func (s *Server) postEvent(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	outcome := s.ingest(w, r)
	s.metrics.observe(outcome, time.Since(start))
}

// ingest answers one POST /v1/events and returns its outcome label.
func (s *Server) ingest(w http.ResponseWriter, r *http.Request) string {
	if s.cfg.Verifier != nil {
		if _, err := s.cfg.Verifier.Authorize(r, auth.ScopeEmit); err != nil {
			w.Header().Set("WWW-Authenticate", auth.Challenge(err))
			if errors.Is(err, auth.ErrForbidden) {
				problem.Write(w, r, problem.New(http.StatusForbidden, "forbidden", "Forbidden", "the token lacks the push:emit scope"))
			} else {
				problem.Write(w, r, problem.New(http.StatusUnauthorized, "unauthorized", "Unauthorized", "a valid service bearer token with scope push:emit is required"))
			}
			return OutcomeUnauthorized
		}
	}
	ev, p := eventhttp.Decode(r, s.cfg.MaxBody)
	if p != nil {
		problem.Write(w, r, *p)
		return OutcomeInvalid
	}
	canonical := ev.Canonical()
	res, err := s.cfg.Spool.Claim(r.Context(), spool.Entry{
		Producer: s.cfg.Producer,
		Key:      ev.IdempotencyKey,
		Hash:     event.HashCanonical(canonical),
		Payload:  canonical,
	})
	switch {
	case errors.Is(err, spool.ErrFull):
		s.retryLater(w, r, "the spool is over its byte limit while Postgres catches up; retry later")
		return OutcomeOverloaded
	case errors.Is(err, spool.ErrClosed):
		s.retryLater(w, r, "the relay is shutting down; retry later")
		return OutcomeOverloaded
	case err != nil && r.Context().Err() != nil:
		return OutcomeCanceled // the producer hung up; nobody reads an answer
	case err != nil:
		s.log.Error("spool claim failed", "err", err, "key", ev.IdempotencyKey)
		problem.Write(w, r, problem.New(http.StatusInternalServerError, "spool-error", "Spool error", "the event could not be written to the spool; retry with the same key"))
		return OutcomeError
	}
	answer := eventhttp.Answer{IdempotencyKey: ev.IdempotencyKey, ReceivedAt: res.ReceivedAt.UTC()}
	switch res.Outcome {
	case spool.Accepted:
		answer.Status = eventhttp.StatusAccepted
		eventhttp.WriteAnswer(w, answer)
		return OutcomeAccepted
	case spool.Duplicate:
		answer.Status = eventhttp.StatusDuplicate
		eventhttp.WriteAnswer(w, answer)
		return OutcomeDuplicate
	default:
		problem.Write(w, r, problem.New(http.StatusUnprocessableEntity, "idempotency-key-reused", "Idempotency key reused",
			fmt.Sprintf("key %q was first used at %s for a different request; use a new key for a new event", ev.IdempotencyKey, res.ReceivedAt.UTC().Format(time.RFC3339Nano))))
		return OutcomeConflict
	}
}

func (s *Server) retryLater(w http.ResponseWriter, r *http.Request, detail string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(max(1, s.cfg.RetryAfter.Round(time.Second).Seconds()))))
	problem.Write(w, r, problem.New(http.StatusServiceUnavailable, "overloaded", "Service unavailable", detail))
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 while the spool takes writes.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.cfg.Spool.Ping(ctx); err != nil {
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, "not-ready", "Not ready", "the spool is not writable: "+err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
