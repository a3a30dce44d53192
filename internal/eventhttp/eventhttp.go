// Package eventhttp reads a producer's ingest request over HTTP — content type,
// size limit, Idempotency-Key header, event body — with the same rules and the
// same problem answers at the relay and at central's internal ingress.
package eventhttp

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/jsonenc"
	"github.com/spoolcast/spoolcast/internal/problem"
)

// Decode reads and validates an ingest request: content type, size, the
// Idempotency-Key header and the event body. A nil problem means ev is valid and
// canonical. Central's internal ingress answers with the same rules.
func Decode(r *http.Request, maxBody int64) (ev event.Event, p *problem.Problem) {
	fail := func(status int, slug, title, detail, field string) (event.Event, *problem.Problem) {
		pr := problem.New(status, slug, title, detail)
		pr.Field = field
		return event.Event{}, &pr
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return fail(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type", "send the event as Content-Type: application/json", "")
	}
	if r.ContentLength > maxBody {
		return fail(http.StatusRequestEntityTooLarge, "body-too-large", "Body too large", fmt.Sprintf("the body is %d bytes; the limit is %d", r.ContentLength, maxBody), "")
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return fail(http.StatusRequestEntityTooLarge, "body-too-large", "Body too large", fmt.Sprintf("the body exceeds the limit of %d bytes", maxBody), "")
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The server's read deadline passed mid-body: the client was slow,
			// the request is fine. Retryable, unlike a malformed body.
			return fail(http.StatusRequestTimeout, "request-timeout", "Request timeout", "the body did not arrive in time; retry with the same key", "")
		}
		return fail(http.StatusBadRequest, "malformed-event", "Malformed event", "reading the body: "+err.Error(), "")
	}
	var headerKey string
	if values := r.Header.Values("Idempotency-Key"); len(values) > 0 {
		if len(values) > 1 {
			return fail(http.StatusBadRequest, "invalid-event", "Invalid event", "send one Idempotency-Key header", "Idempotency-Key")
		}
		if headerKey, err = event.ParseKeyHeader(values[0]); err != nil {
			return fail(http.StatusBadRequest, "invalid-event", "Invalid event", err.Error(), "Idempotency-Key")
		}
	}
	ev, err = event.Decode(body, headerKey)
	if err != nil {
		var evErr *event.Error
		field := ""
		if errors.As(err, &evErr) {
			field = evErr.Field
		}
		if errors.Is(err, event.ErrMalformed) {
			return fail(http.StatusBadRequest, "malformed-event", "Malformed event", err.Error(), field)
		}
		return fail(http.StatusBadRequest, "invalid-event", "Invalid event", err.Error(), field)
	}
	return ev, nil
}

// Answer statuses.
const (
	StatusAccepted  = "accepted"
	StatusDuplicate = "duplicate"
)

// Answer is the body of a 202 or 200 ingest response.
type Answer struct {
	Status         string    `json:"status"`
	IdempotencyKey string    `json:"idempotency_key"`
	ReceivedAt     time.Time `json:"received_at"`
}

// WriteAnswer sends a 202 accepted or, with Idempotent-Replayed, a 200
// duplicate. The body is built by hand: it is on every producer's hot path.
func WriteAnswer(w http.ResponseWriter, a Answer) {
	status := http.StatusAccepted
	h := w.Header()
	if a.Status == StatusDuplicate {
		status = http.StatusOK
		h["Idempotent-Replayed"] = replayed
	}
	h["Content-Type"] = contentTypeJSON
	w.WriteHeader(status)
	b := make([]byte, 0, 128+len(a.IdempotencyKey))
	b = append(b, `{"status":`...)
	b = jsonenc.AppendString(b, a.Status)
	b = append(b, `,"idempotency_key":`...)
	b = jsonenc.AppendString(b, a.IdempotencyKey)
	b = append(b, `,"received_at":"`...)
	b = a.ReceivedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, "\"}\n"...)
	_, _ = w.Write(b)
}

var (
	replayed        = []string{"true"}
	contentTypeJSON = []string{"application/json"}
)
