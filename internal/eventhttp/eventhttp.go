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
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/jsonenc"
	"github.com/spoolcast/spoolcast/internal/problem"
)

// Decode reads and validates an ingest request: content type, size, the
// Idempotency-Key header and the event body; now bounds its send_at, and an
// event that would push an empty banner is refused (event.CheckShown). A nil
// problem means ev is valid and canonical. Central's internal ingress
// answers with the same rules.
func Decode(r *http.Request, maxBody int64, now time.Time) (ev event.Event, p *problem.Problem) {
	fail := func(status int, t problem.Type, detail, field string) (event.Event, *problem.Problem) {
		pr := problem.New(status, t, detail).On(field)
		return event.Event{}, &pr
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return fail(http.StatusUnsupportedMediaType, problem.UnsupportedMediaType, "send the event as Content-Type: application/json", "")
	}
	if r.ContentLength > maxBody {
		return fail(http.StatusRequestEntityTooLarge, problem.BodyTooLarge, fmt.Sprintf("the body is %d bytes; the limit is %d", r.ContentLength, maxBody), "")
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return fail(http.StatusRequestEntityTooLarge, problem.BodyTooLarge, fmt.Sprintf("the body exceeds the limit of %d bytes", maxBody), "")
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The server's read deadline passed mid-body: the client was slow,
			// the request is fine. Retryable, unlike a malformed body.
			return fail(http.StatusRequestTimeout, problem.RequestTimeout, "the body did not arrive in time; retry with the same key", "")
		}
		return fail(http.StatusBadRequest, problem.MalformedEvent, "reading the body: "+err.Error(), "")
	}
	var headerKey string
	if values := r.Header.Values("Idempotency-Key"); len(values) > 0 {
		if len(values) > 1 {
			return fail(http.StatusBadRequest, problem.InvalidEvent, "send one Idempotency-Key header", "Idempotency-Key")
		}
		if headerKey, err = event.ParseKeyHeader(values[0]); err != nil {
			return fail(http.StatusBadRequest, problem.InvalidEvent, err.Error(), "Idempotency-Key")
		}
	}
	ev, err = event.Decode(body, headerKey)
	if err == nil {
		err = ev.CheckSchedule(now)
	}
	if err == nil {
		err = ev.CheckShown()
	}
	if err != nil {
		var evErr *event.Error
		field := ""
		if errors.As(err, &evErr) {
			field = evErr.Field
		}
		if errors.Is(err, event.ErrMalformed) {
			return fail(http.StatusBadRequest, problem.MalformedEvent, err.Error(), field)
		}
		return fail(http.StatusBadRequest, problem.InvalidEvent, err.Error(), field)
	}
	return ev, nil
}

// KeyFromPath reads the idempotency key that is the last segment of r's
// path after prefix (such as "/v1/events/"), as both ingress points take a
// cancellation: URL-unescaped, read from the escaped path so that a key
// holding a / (sent as %2F) stays one segment, and checked like an event's
// key. A nil problem means key is valid: 404 for a path of more segments or
// a bad escape, 400 for a key that breaks a rule.
func KeyFromPath(r *http.Request, prefix string) (key string, p *problem.Problem) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	ok = ok && !strings.Contains(rest, "/")
	if ok {
		var err error
		key, err = url.PathUnescape(rest)
		ok = err == nil
	}
	if !ok {
		pr := problem.New(http.StatusNotFound, problem.NotFound, "no route for "+r.URL.Path+": send the key as one path segment, a / in it as %2F")
		return "", &pr
	}
	if err := event.CheckKey(key); err != nil {
		pr := problem.New(http.StatusBadRequest, problem.InvalidEvent, err.Error()).On("idempotency_key")
		return "", &pr
	}
	return key, nil
}

// Answer is the answer to a valid ingest request.
type Answer struct {
	Outcome        event.Outcome
	IdempotencyKey string
	// ReceivedAt is when the key was first received: now for Accepted, the
	// first request's time otherwise (zero: not known).
	ReceivedAt time.Time
}

// WriteAnswer sends the answer both ingress points give for a valid event:
// 202 accepted; 200 duplicate with Idempotent-Replayed; 422 for a key used
// before for a different request. The 2xx body is built by hand: it is on
// every producer's hot path.
func WriteAnswer(w http.ResponseWriter, r *http.Request, a Answer) {
	var status int
	switch a.Outcome {
	case event.Accepted:
		status = http.StatusAccepted
	case event.Duplicate:
		status = http.StatusOK
		w.Header()["Idempotent-Replayed"] = replayed
	default:
		detail := fmt.Sprintf("key %q was used before for a different request; use a new key for a new event", a.IdempotencyKey)
		if !a.ReceivedAt.IsZero() {
			detail = fmt.Sprintf("key %q was first used at %s for a different request; use a new key for a new event",
				a.IdempotencyKey, a.ReceivedAt.UTC().Format(time.RFC3339Nano))
		}
		problem.Write(w, r, problem.New(http.StatusUnprocessableEntity, problem.IdempotencyKeyReused, detail))
		return
	}
	w.Header()["Content-Type"] = contentTypeJSON
	w.WriteHeader(status)
	b := make([]byte, 0, 128+len(a.IdempotencyKey))
	b = append(b, `{"status":`...)
	b = jsonenc.AppendString(b, a.Outcome.String())
	b = append(b, `,"idempotency_key":`...)
	b = jsonenc.AppendString(b, a.IdempotencyKey)
	b = append(b, `,"received_at":"`...)
	b = a.ReceivedAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, "\"}\n"...)
	_, _ = w.Write(b)
}

// WriteUnavailable sends 503 with Retry-After (whole seconds, at least 1):
// the ingress point cannot store the event now, and a retry with the same key
// is safe.
func WriteUnavailable(w http.ResponseWriter, r *http.Request, retryAfter time.Duration, t problem.Type, detail string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(max(1, retryAfter.Round(time.Second).Seconds()))))
	problem.Write(w, r, problem.New(http.StatusServiceUnavailable, t, detail))
}

var (
	replayed        = []string{"true"}
	contentTypeJSON = []string{"application/json"}
)
