package webpush

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/internal/retryafter"
)

// Outcome is what became of a Send.
type Outcome int

// Outcomes. The zero Outcome is Unknown, so that a Result nobody filled in
// never reads as delivered, nor as safe to send again.
const (
	// Unknown: the request was written whole and no answer came (a
	// timeout, a broken connection), or a gateway answered for the push
	// service (502, 504, any 5xx but 500 and 503). The message may have
	// been delivered.
	Unknown Outcome = iota
	// Delivered: the push service took the message (2xx, normally 201).
	Delivered
	// Gone: the subscription has expired or was unsubscribed (404, 410);
	// disable it.
	Gone
	// RateLimited: too many messages (429); send again after RetryAfter.
	RateLimited
	// TooLarge: the push service takes smaller messages than MaxPayload (413).
	TooLarge
	// Rejected: any other refusal — 400, a VAPID token refused (401, 403),
	// a redirect (never followed). Sending it again changes nothing.
	Rejected
	// Unavailable: the push service failed (500, 503) and did not take
	// the message (it takes one with a 201); send it again after
	// RetryAfter, or with backoff. Any other 5xx (a gateway's 502 or 504)
	// is Unknown. A push service that had stored it after all keeps one
	// copy of a message with a Topic.
	Unavailable
	// NotSent: the request never reached the push service whole (no
	// connection could be made, it broke while the request was written, or
	// ctx ended first); it may be sent again.
	NotSent
	// Invalid: the subscription or the message is unusable (Err says why,
	// wrapping ErrBadSubscription or ErrBadMessage, or a
	// *PayloadTooLargeError); nothing was sent.
	Invalid
)

var outcomeNames = [...]string{"unknown", "delivered", "gone", "rate_limited", "too_large", "rejected", "unavailable", "not_sent", "invalid"}

// String names the outcome in snake case, for logs and metric labels.
func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeNames) {
		return "outcome(" + strconv.Itoa(int(o)) + ")"
	}
	return outcomeNames[o]
}

// Result is what a Send came to.
type Result struct {
	Outcome Outcome
	Status  int // the HTTP status; 0 when no answer came
	// MessageID is the push message's URL (Location), when the push service
	// gives one with a 201.
	MessageID string
	// RetryAfter is when to send again: Retry-After, for RateLimited or
	// Unavailable; for RateLimited without one, DefaultRetryAfter.
	RetryAfter time.Duration
	// Body is the start of the answer's body, when it was not a 2xx.
	Body string
	// Err says what went wrong, for the log; nil when Delivered.
	Err error
}

const (
	// DefaultRetryAfter is RateLimited's RetryAfter when the push service
	// gave none.
	DefaultRetryAfter = time.Minute
	maxExcerpt        = 256 // bytes of a refusal's body kept in Result.Body
)

// answer classifies the push service's answer. It reads at most maxExcerpt
// bytes of the body.
func answer(resp *http.Response, now time.Time) Result {
	// A short body read to its end lets the connection be used again.
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxExcerpt))
	r := Result{Status: resp.StatusCode}
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		r.Outcome, r.MessageID = Delivered, resp.Header.Get("Location")
		return r
	}
	r.Body = strings.ToValidUTF8(strings.TrimSpace(string(b)), "")
	switch {
	case code == http.StatusNotFound || code == http.StatusGone:
		r.Outcome = Gone
	case code == http.StatusRequestEntityTooLarge:
		r.Outcome = TooLarge
	case code == http.StatusTooManyRequests:
		r.Outcome = RateLimited
		var ok bool
		if r.RetryAfter, ok = retryafter.Parse(resp.Header.Get("Retry-After"), now); !ok {
			r.RetryAfter = DefaultRetryAfter
		}
	case code == http.StatusInternalServerError || code == http.StatusServiceUnavailable:
		// The push service's own word that it failed or is overloaded
		// (RFC 9110 §15.6.4: 503 is "currently unable to handle the
		// request"; push services document both as "retry later"): not
		// taken, it takes a message with a 201.
		r.Outcome = Unavailable
		r.RetryAfter, _ = retryafter.Parse(resp.Header.Get("Retry-After"), now)
	case code >= 500:
		// A gateway's (502, 504) or another 5xx: the request may have
		// reached the push service, which may have taken it. Not sent
		// again, as APNs and FCM do, so that a push is shown at most once.
		r.Outcome = Unknown
	default:
		r.Outcome = Rejected
	}
	msg := fmt.Sprintf("push service answered %d %s", code, http.StatusText(code))
	if r.Body != "" {
		msg += ": " + r.Body
	}
	r.Err = errors.New(msg)
	return r
}
