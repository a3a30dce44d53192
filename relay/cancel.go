package relay

import (
	"context"
	"net/http"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/eventhttp"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/jsonenc"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/spool"
)

// cancelEvent is DELETE /v1/events/{idempotency_key}: cancel the producer's
// scheduled event, forwarded like the event. The cancellation is spooled
// durably before the 202, as an entry of its own namespace
// (spool.CancelProducer), and the forwarder applies it in spool order, after
// the events spooled before it. A repeat is the same claim: the same 202.
//
// The relay cannot know central's answer when it answers: a producer that
// needs it (404 for an unknown key, 409 once the event was sent) calls
// central's internal ingress instead, DELETE /internal/v1/events/{key}. The
// relay's outcome is counted in spoolcast_relay_cancels_total, and an
// unknown or already sent event is logged.
func (s *Server) cancelEvent(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	key, p := eventhttp.KeyFromPath(r, "/v1/events/")
	if p != nil {
		problem.Write(w, r, *p)
		return
	}
	payload := cancelPayload(key)
	// As for an event: what was submitted is answered as it ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.ClaimTimeout)
	defer cancel()
	// Any outcome means the cancellation is spooled: accepted now, or by an
	// earlier request (a duplicate; a conflict only if another version of
	// the relay wrote its payload otherwise).
	if _, err := s.cfg.Spool.Claim(ctx, spool.Entry{
		Producer: spool.CancelProducer(s.cfg.Producer),
		Key:      key,
		Hash:     event.HashCanonical(payload),
		Payload:  payload,
	}); err != nil {
		s.claimFailed(w, r, "the cancellation", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusAccepted, cancelAnswer{Status: "cancel_accepted", IdempotencyKey: key})
}

// cancelAnswer is the body of a cancellation's 202.
type cancelAnswer struct {
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotency_key"`
}

// cancelPayload is what a cancellation spools: the forwarder reads only the
// entry's key, so it is there for whoever inspects the spool, and it counts
// towards the spool's byte limit like an event.
func cancelPayload(key string) []byte {
	b := append(make([]byte, 0, 40+len(key)), `{"cancel":true,"idempotency_key":`...)
	b = jsonenc.AppendString(b, key)
	return append(b, '}')
}
