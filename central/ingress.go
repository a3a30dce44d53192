package central

import (
	"context"
	"net/http"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/eventhttp"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// ingestEvent is POST /internal/v1/events: the relay's contract for producers
// that cannot run a sidecar. Keys are scoped to the token's subject.
func (s *Server) ingestEvent(w http.ResponseWriter, r *http.Request, c auth.ServiceClaims) {
	if c.Subject == "" {
		w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope"`)
		problem.Write(w, r, problem.New(http.StatusForbidden, problem.Forbidden, "the service token has no subject to scope its keys"))
		return
	}
	ev, p := eventhttp.Decode(r, s.cfg.MaxBody)
	if p != nil {
		problem.Write(w, r, *p)
		return
	}
	now := s.cfg.Clock.Now()
	// Once sent, the event is answered with its real outcome even if the
	// client hangs up or half-closes meanwhile; only DBTimeout bounds it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.DBTimeout)
	defer cancel()
	results, err := ingest.Ingest(ctx, s.cfg.DB, []ingest.Item{{Producer: c.Subject, Event: ev, ReceivedAt: now}})
	if err != nil {
		s.dbError(w, r, "ingest", err)
		return
	}
	answer := eventhttp.Answer{Outcome: results[0].Outcome, IdempotencyKey: ev.IdempotencyKey, ReceivedAt: now}
	switch answer.Outcome {
	case event.Accepted:
		s.waker.Committed()
	case event.Duplicate:
		if first, err := ingest.FirstClaim(ctx, s.cfg.DB, c.Subject, ev.IdempotencyKey, ev.Recipients[0]); err == nil {
			answer.ReceivedAt = first
		}
	case event.Conflict:
		answer.ReceivedAt = time.Time{} // the first request's time is not kept apart
	}
	eventhttp.WriteAnswer(w, r, answer)
}
