package central

import (
	"context"
	"net/http"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/eventhttp"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/sync"
)

// ingestEvent is POST /internal/v1/events: the relay's contract for producers
// that cannot run a sidecar. Keys are scoped to the token's subject.
func (s *Server) ingestEvent(w http.ResponseWriter, r *http.Request, c auth.ServiceClaims) {
	if c.Subject == "" {
		w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope"`)
		problem.Write(w, r, problem.New(http.StatusForbidden, "forbidden", "Forbidden", "the service token has no subject to scope its keys"))
		return
	}
	ev, p := eventhttp.Decode(r, s.cfg.MaxBody)
	if p != nil {
		problem.Write(w, r, *p)
		return
	}
	now := s.cfg.Now()
	// Once sent, the event is answered with its real outcome even if the
	// client hangs up or half-closes meanwhile; only DBTimeout bounds it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.DBTimeout)
	defer cancel()
	results, err := sync.Ingest(ctx, s.cfg.DB, []sync.Item{{Producer: c.Subject, Event: ev, ReceivedAt: now}})
	if err != nil {
		s.dbError(w, r, "ingest", err)
		return
	}
	answer := eventhttp.Answer{IdempotencyKey: ev.IdempotencyKey, ReceivedAt: now.UTC()}
	switch results[0].Outcome {
	case sync.New:
		s.waker.Committed()
		answer.Status = eventhttp.StatusAccepted
		eventhttp.WriteAnswer(w, answer)
	case sync.Duplicate:
		answer.Status = eventhttp.StatusDuplicate
		if first, err := s.firstClaim(ctx, c.Subject, ev.IdempotencyKey, ev.Recipients[0]); err == nil {
			answer.ReceivedAt = first.UTC()
		}
		eventhttp.WriteAnswer(w, answer)
	default:
		problem.Write(w, r, problem.New(http.StatusUnprocessableEntity, "idempotency-key-reused", "Idempotency key reused",
			"key "+ev.IdempotencyKey+" was used before for a different request; use a new key for a new event"))
	}
}

// firstClaim is when the key was first claimed in Postgres.
func (s *Server) firstClaim(ctx context.Context, producer, key, recipient string) (time.Time, error) {
	var at time.Time
	err := s.cfg.DB.QueryRow(ctx, `SELECT claimed_at FROM idempotency_keys WHERE key = $1`, sync.NotificationKey(producer, key, recipient)).Scan(&at)
	return at, err
}
