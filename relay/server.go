// Package relay is the producer-facing loopback API of the sidecar: it
// validates events, authenticates callers when it must, claims each event's key
// in the spool and answers at once. A cancellation of an event is spooled and
// answered the same way.
//
// The rule it keeps: a producer is never made to wait on, or fail because of,
// anything downstream of the spool. 202 means the event is durable on local disk.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/chaosplant"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/eventhttp"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/spool"
)

// Spool is what the relay needs of the spool.
type Spool interface {
	Claim(ctx context.Context, e spool.Entry) (spool.ClaimResult, error)
	Ready(ctx context.Context, size int64) error
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
	// ClaimTimeout bounds the wait for the spool to commit a claim (a stuck
	// disk); past it the producer gets 503 and retries with the same key.
	// Default 10s.
	ClaimTimeout time.Duration
	// Registry serves /metrics and receives the relay's metrics. Default a new
	// registry with the Go and process collectors.
	Registry *prometheus.Registry
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock times requests. Default the wall clock.
	Clock clock.Clock
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case strings.TrimSpace(c.Producer) == "":
		return errors.New("producer is required: name the logical service this relay serves (the same on every replica)")
	case strings.ContainsRune(c.Producer, 0):
		return errors.New("producer must not contain a NUL byte: the spool keeps cancellations under such names")
	case c.Spool == nil:
		return errors.New("spool is required")
	case c.MaxBody < 0:
		return fmt.Errorf("max body %d: must not be negative", c.MaxBody)
	case c.RetryAfter < 0:
		return fmt.Errorf("retry after %s: must not be negative", c.RetryAfter)
	case c.ClaimTimeout < 0:
		return fmt.Errorf("claim timeout %s: must not be negative", c.ClaimTimeout)
	}
	return nil
}

// Server answers the relay's HTTP API.
type Server struct {
	cfg      Config
	log      *slog.Logger
	metrics  *metrics
	handler  http.Handler
	ops      http.Handler
	draining atomic.Bool
	// One line per interval for each kind of repeated failure.
	diskFullLog, spoolErrLog *lograte.Limiter
}

// New returns the relay's HTTP API.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.MaxBody = cmp.Or(cfg.MaxBody, 64<<10)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, 5*time.Second)
	cfg.ClaimTimeout = cmp.Or(cfg.ClaimTimeout, 10*time.Second)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Registry == nil {
		cfg.Registry = httpapi.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("component", "relay")
	s := &Server{
		cfg: cfg, log: log, metrics: newMetrics(cfg.Registry),
		diskFullLog: lograte.New(10 * time.Second), spoolErrLog: lograte.New(10 * time.Second),
	}
	router := httpapi.NewRouter(log)
	router.HandlerFunc(http.MethodPost, "/v1/events", s.postEvent)
	// A catch-all, so that cancelEvent reads the key from the escaped path.
	router.HandlerFunc(http.MethodDelete, "/v1/events/*idempotency_key", s.cancelEvent)
	s.routeOps(router)
	ops := httpapi.NewRouter(log)
	s.routeOps(ops)
	s.ops = httpapi.Answered(ops, log)
	s.handler = httpapi.Answered(router, log)
	return s, nil
}

// ServeHTTP implements http.Handler: ingest, cancellation and the operations routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Ops serves only /healthz, /readyz and /metrics: for a listener that
// kubelet probes and Prometheus scrapes reach while ingest stays on loopback.
func (s *Server) Ops() http.Handler { return s.ops }

// Drain makes /readyz answer 503 from now on: the relay is shutting down.
// Requests still arriving are answered as usual.
func (s *Server) Drain() { s.draining.Store(true) }

func (s *Server) routeOps(router *httprouter.Router) {
	router.HandlerFunc(http.MethodGet, "/healthz", httpapi.Healthz)
	router.HandlerFunc(http.MethodGet, "/readyz", httpapi.Readyz(2*time.Second, s.ready))
	router.Handler(http.MethodGet, "/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
}

func (s *Server) postEvent(w http.ResponseWriter, r *http.Request) {
	start := s.cfg.Clock.Now()
	outcome := s.ingest(w, r)
	s.metrics.observe(outcome, clock.Since(s.cfg.Clock, start))
}

// ingest answers one POST /v1/events and returns its outcome label: the
// event's outcome, or why it was not taken.
func (s *Server) ingest(w http.ResponseWriter, r *http.Request) string {
	if !s.authorized(w, r) {
		return resultUnauthorized
	}
	ev, p := eventhttp.Decode(r, s.cfg.MaxBody, s.cfg.Clock.Now())
	if p != nil {
		problem.Write(w, r, *p)
		return resultInvalid
	}
	if chaosplant.Plant(chaosplant.LoseEvent) { // a planted defect (chaos self-check builds only)
		eventhttp.WriteAnswer(w, r, eventhttp.Answer{Outcome: event.Accepted, IdempotencyKey: ev.IdempotencyKey, ReceivedAt: s.cfg.Clock.Now()})
		return event.Accepted.String()
	}
	canonical := ev.Canonical()
	// The claim gets its real answer even if the producer hangs up or
	// half-closes its socket meanwhile: what was submitted is answered as it
	// ended, never left to an implicit reply.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.ClaimTimeout)
	defer cancel()
	res, err := s.cfg.Spool.Claim(ctx, spool.Entry{
		Producer: s.cfg.Producer,
		Key:      ev.IdempotencyKey,
		Hash:     event.HashCanonical(canonical),
		Payload:  canonical,
		Fanout:   max(1, len(ev.Recipients)), // a topic event is one row until central fans it out
	})
	if err != nil {
		return s.claimFailed(w, r, "the event", err)
	}
	eventhttp.WriteAnswer(w, r, eventhttp.Answer{Outcome: res.Outcome, IdempotencyKey: ev.IdempotencyKey, ReceivedAt: res.ReceivedAt})
	return res.Outcome.String()
}

// authorized answers 401 or 403 and reports false unless the request may
// emit: it carries a service token with the push:emit scope, or no verifier
// is configured (loopback only).
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.Verifier == nil {
		return true
	}
	_, err := s.cfg.Verifier.Authorize(r, auth.ScopeEmit)
	if err == nil {
		return true
	}
	w.Header().Set("WWW-Authenticate", auth.Challenge(err))
	if errors.Is(err, auth.ErrForbidden) {
		problem.Write(w, r, problem.New(http.StatusForbidden, problem.Forbidden, "the token lacks the push:emit scope"))
	} else {
		problem.Write(w, r, problem.New(http.StatusUnauthorized, problem.Unauthorized, "a valid service bearer token with scope push:emit is required"))
	}
	return false
}

// claimFailed answers a claim the spool did not take (what names the thing
// claimed, for the 500's detail) and returns the outcome label: 503 with
// Retry-After for what passes (the spool at its limit, a full disk, a
// shutdown, a key index behind, a slow commit), 500 otherwise. Every answer
// tells the producer to retry with the same key.
func (s *Server) claimFailed(w http.ResponseWriter, r *http.Request, what string, err error) string {
	switch {
	case errors.Is(err, spool.ErrFull):
		s.retryLater(w, r, problem.Overloaded, "the spool holds its limit of events awaiting Postgres; retry later with the same key")
		return resultOverloaded
	case errors.Is(err, spool.ErrDiskFull):
		s.diskFullLog.Do(func(suppressed int64) {
			s.log.Error("the spool's disk is full: new events get 503", "err", err, "suppressed", suppressed)
		})
		s.retryLater(w, r, problem.DiskFull, "the relay's disk is full; retry later with the same key")
		return resultDiskFull
	case errors.Is(err, spool.ErrClosed):
		s.retryLater(w, r, problem.Overloaded, "the relay is shutting down; retry later with the same key")
		return resultOverloaded
	case errors.Is(err, spool.ErrKeysBehind):
		s.spoolErrLog.Do(func(suppressed int64) {
			s.log.Error("the spool's key index file is not being written: new events get 503", "err", err, "suppressed", suppressed)
		})
		s.retryLater(w, r, problem.Overloaded, "the spool's key index is behind; retry later with the same key")
		return resultOverloaded
	case errors.Is(err, context.DeadlineExceeded):
		s.spoolErrLog.Do(func(suppressed int64) {
			s.log.Error("spool claim timed out", "timeout", s.cfg.ClaimTimeout, "suppressed", suppressed)
		})
		s.retryLater(w, r, problem.Overloaded, "the spool did not commit in time; retry with the same key (if it committed meanwhile, the retry is answered as a duplicate)")
		return resultOverloaded
	default:
		s.spoolErrLog.Do(func(suppressed int64) {
			s.log.Error("spool claim failed", "err", err, "suppressed", suppressed)
		})
		problem.Write(w, r, problem.New(http.StatusInternalServerError, problem.SpoolError, what+" could not be written to the spool; retry with the same key"))
		return resultError
	}
}

func (s *Server) retryLater(w http.ResponseWriter, r *http.Request, t problem.Type, detail string) {
	eventhttp.WriteUnavailable(w, r, s.cfg.RetryAfter, t, detail)
}

// ready is nil while a new event of the largest legal size would be taken:
// not while shutting down, with the spool at its limit, or with its disk full.
func (s *Server) ready(ctx context.Context) error {
	if s.draining.Load() {
		return errors.New("the relay is shutting down")
	}
	switch err := s.cfg.Spool.Ready(ctx, s.cfg.MaxBody); {
	case errors.Is(err, spool.ErrFull):
		return errors.New("the spool holds its limit of events awaiting Postgres (--spool-max-bytes)")
	case errors.Is(err, spool.ErrDiskFull):
		return errors.New("the spool's disk is full")
	case errors.Is(err, spool.ErrClosed):
		return errors.New("the relay is shutting down")
	case errors.Is(err, spool.ErrKeysBehind):
		return errors.New("the spool's key index file cannot be written (see the log)")
	case err != nil:
		return fmt.Errorf("the spool is not writable: %w", err)
	}
	return nil
}
