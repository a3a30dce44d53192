package central

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/eventhttp"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/push/policy"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// cancelEvent is DELETE /internal/v1/events/{key}: stop a scheduled event
// before its send_at. 200 cancelled (again for a repeat), 404 for a key
// never ingested for the token's subject, 409 once it was sent.
func (s *Server) cancelEvent(w http.ResponseWriter, r *http.Request, c auth.ServiceClaims) {
	if !hasProducer(w, r, c) {
		return
	}
	key, p := eventhttp.KeyFromPath(r, "/internal/v1/events/")
	if p != nil {
		problem.Write(w, r, *p)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.DBTimeout)
	defer cancel()
	res, err := ingest.Cancel(ctx, s.cfg.DB, c.Subject, key, s.cfg.Clock.Now())
	if err != nil {
		s.dbError(w, r, "cancel", err)
		return
	}
	switch res.Outcome {
	case ingest.CancelUnknown:
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.UnknownEvent,
			fmt.Sprintf("no event with key %q was ingested for %q (or its key expired)", key, c.Subject)))
		return
	case ingest.CancelTooLate:
		problem.Write(w, r, problem.New(http.StatusConflict, problem.AlreadySent,
			fmt.Sprintf("the event with key %q was sent already (it had no send_at, or its send_at passed)", key)))
		return
	}
	if n := res.Stopped + res.PushesStopped; n > 0 && s.cfg.PushMetrics != nil {
		s.cfg.PushMetrics.CountPolicy(policy.Cancelled, n)
	}
	httpapi.WriteJSON(w, http.StatusOK, cancelAnswer{Status: "cancelled", IdempotencyKey: key, CancelledAt: res.Cancelled.UTC(),
		Notifications: res.Stopped, TopicMembersReached: res.Reached, PushesStopped: res.PushesStopped})
}

// cancelAnswer is the body of a cancellation's 200.
type cancelAnswer struct {
	Status         string    `json:"status"`
	IdempotencyKey string    `json:"idempotency_key"`
	CancelledAt    time.Time `json:"cancelled_at"`
	// Notifications is how many recipients' scheduled notifications this
	// request stopped: 0 for a repeat.
	Notifications int `json:"notifications"`
	// TopicMembersReached is how many members of the event's topics got
	// it before its fan-outs stopped (0 before its send_at).
	TopicMembersReached int64 `json:"topic_members_reached"`
	// PushesStopped is how many pushes of the members reached were still
	// waiting in the queue and were stopped (0 for a repeat).
	PushesStopped int `json:"pushes_stopped"`
}

// ingestEvent is POST /internal/v1/events: the relay's contract for producers
// that cannot run a sidecar. Keys are scoped to the token's subject.
func (s *Server) ingestEvent(w http.ResponseWriter, r *http.Request, c auth.ServiceClaims) {
	if !hasProducer(w, r, c) {
		return
	}
	now := s.cfg.Clock.Now()
	ev, p := eventhttp.Decode(r, s.cfg.MaxBody, now)
	if p != nil {
		problem.Write(w, r, *p)
		return
	}
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
		if first, err := ingest.FirstClaim(ctx, s.cfg.DB, c.Subject, ev.IdempotencyKey); err == nil {
			answer.ReceivedAt = first
		}
	case event.Conflict:
		answer.ReceivedAt = time.Time{} // the first request's time is not kept apart
	}
	eventhttp.WriteAnswer(w, r, answer)
}

// hasProducer answers 403 for a service token without a subject: the
// subject is the producer that scopes the event keys.
func hasProducer(w http.ResponseWriter, r *http.Request, c auth.ServiceClaims) bool {
	if c.Subject != "" {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope"`)
	problem.Write(w, r, problem.New(http.StatusForbidden, problem.Forbidden, "the service token has no subject to scope its keys"))
	return false
}
