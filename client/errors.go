package client

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Sentinel errors to branch on with errors.Is. Each error type below matches
// its sentinel; use errors.As for its details.
var (
	// ErrConflict: the key was already used for a different event
	// (*ConflictError). Never retried.
	ErrConflict = errors.New("idempotency key reused for a different event")
	// ErrInvalidEvent: the event breaks a rule, found here or by the relay
	// (*InvalidEventError). Never retried.
	ErrInvalidEvent = errors.New("invalid event")
	// ErrUnauthorized: the relay wants a valid service token with the
	// push:emit scope (*UnauthorizedError). Never retried.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrGaveUp: every attempt failed in a way worth retrying, and the
	// attempts, the time budget or the context ran out (*GaveUpError).
	ErrGaveUp = errors.New("gave up")
)

// Problem is the RFC 9457 problem document the relay answers errors with.
type Problem struct {
	// Type is a stable URI such as "urn:spoolcast:problem:overloaded".
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is the request path.
	Instance string `json:"instance,omitempty"`
	// Field names the request field at fault, where there is one.
	Field string `json:"field,omitempty"`
}

// Slug is the last part of Type ("overloaded", "invalid-event"); "" when
// the type is not one of spoolcast's.
func (p Problem) Slug() string {
	slug, ok := strings.CutPrefix(p.Type, problemTypePrefix)
	if !ok {
		return ""
	}
	return slug
}

const problemTypePrefix = "urn:spoolcast:problem:"

// ConflictError is a 422 idempotency-key-reused: the relay holds the key for
// another event. Sending again cannot help; a new event needs a new key.
type ConflictError struct {
	IdempotencyKey string
	Problem        Problem
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("idempotency key %q was already used for a different event: %s", e.IdempotencyKey, e.Problem.Detail)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// InvalidEventError is an event the relay will never take as it is: refused
// here before sending (StatusCode 0), or answered 400, 413, 415 or a 422
// other than a conflict.
type InvalidEventError struct {
	// StatusCode is the relay's answer; 0 when the client refused the event
	// without sending it.
	StatusCode int
	// Field names the event field at fault ("recipients", "data"); "" when
	// the fault is the whole request (malformed JSON, too large).
	Field string
	// Detail says what is wrong.
	Detail string
	// Problem is the relay's answer; zero when StatusCode is 0.
	Problem Problem
}

func (e *InvalidEventError) Error() string {
	var b strings.Builder
	b.WriteString("invalid event")
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, " (relay answered %d)", e.StatusCode)
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + strings.TrimPrefix(e.Detail, "invalid event: "+e.Field+": "))
	return b.String()
}

// Is makes errors.Is(err, ErrInvalidEvent) true.
func (e *InvalidEventError) Is(target error) bool { return target == ErrInvalidEvent }

// UnauthorizedError is a 401 (the token is missing, expired or not signed
// with the relay's secret) or a 403 (the token lacks the push:emit scope).
type UnauthorizedError struct {
	StatusCode int
	// Challenge is the WWW-Authenticate header, such as
	// `Bearer error="invalid_token"`.
	Challenge string
	Problem   Problem
}

func (e *UnauthorizedError) Error() string {
	return fmt.Sprintf("relay refused the credentials (%d %s): %s", e.StatusCode, http.StatusText(e.StatusCode), e.Problem.Detail)
}

// Is makes errors.Is(err, ErrUnauthorized) true.
func (e *UnauthorizedError) Is(target error) bool { return target == ErrUnauthorized }

// StatusError is any other answer that is not a success. Those worth
// retrying (408, 429, 5xx) reach the caller inside a GaveUpError; others
// (a 404 from a wrong RelayURL, an answer that is not the relay's) are
// returned at once.
type StatusError struct {
	StatusCode int
	// RetryAfter is the answer's Retry-After; 0 when absent.
	RetryAfter time.Duration
	Problem    Problem
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("relay answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if slug := e.Problem.Slug(); slug != "" {
		s += " (" + slug + ")"
	}
	if e.Problem.Detail != "" {
		s += ": " + e.Problem.Detail
	}
	return s
}

// Temporary reports whether the status is one Emit retries.
func (e *StatusError) Temporary() bool { return retryableStatus(e.StatusCode) }

// GaveUpError is Emit giving up after failures worth retrying: the relay was
// unreachable or slow, or answered 408, 429 or 5xx, until the attempts or the
// time budget ran out, or the context ended. The event may or may not be on
// the relay's disk: emit it again later with the same key, which is safe.
type GaveUpError struct {
	IdempotencyKey string
	// Attempts is how many attempts were made (one whose TokenSource
	// failed sent nothing); 0 when ctx ended first.
	Attempts int
	// Elapsed is the time Emit spent.
	Elapsed time.Duration
	// Last is the last attempt's failure: a *StatusError, an
	// *AttemptTimeoutError, a network error, a cut answer or a TokenSource
	// error. Nil when no attempt was made.
	Last error
	// ContextErr is the context's error when it ended the retries (also when
	// its deadline would pass before the next attempt was due); nil when the
	// attempts or the time budget ran out.
	ContextErr error
	reason     string
}

func (e *GaveUpError) Error() string {
	attempts := "attempts"
	if e.Attempts == 1 {
		attempts = "attempt"
	}
	s := fmt.Sprintf("gave up emitting %q after %d %s in %s", e.IdempotencyKey, e.Attempts, attempts, e.Elapsed.Round(time.Millisecond))
	if e.reason != "" {
		s += " (" + e.reason + ")"
	}
	if e.Last != nil {
		s += ": " + e.Last.Error()
	}
	return s
}

// Unwrap returns the last failure and the context's error, so that
// errors.Is(err, context.Canceled) and errors.As(err, &statusErr) work.
func (e *GaveUpError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Last, e.ContextErr} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Is makes errors.Is(err, ErrGaveUp) true.
func (e *GaveUpError) Is(target error) bool { return target == ErrGaveUp }

// AttemptTimeoutError is an attempt the relay did not answer, whole, within
// Config.AttemptTimeout. It is not the caller's context.DeadlineExceeded.
type AttemptTimeoutError struct {
	// After is the attempt's time limit: AttemptTimeout, or less when the
	// budget had less left.
	After time.Duration
}

func (e *AttemptTimeoutError) Error() string {
	return fmt.Sprintf("no answer within %s", e.After.Round(time.Millisecond))
}

// Timeout is true, as for a net.Error.
func (e *AttemptTimeoutError) Timeout() bool { return true }

// Rejected reports whether err says the relay will never take this event as
// it is (ErrInvalidEvent, ErrConflict): set it aside and fix the producer.
// For any other error the event is not at fault (the relay unreachable,
// full, misconfigured credentials or URL): keep it and emit it again later
// with the same key.
func Rejected(err error) bool {
	return errors.Is(err, ErrInvalidEvent) || errors.Is(err, ErrConflict)
}

// retryableStatus: 408, 429 and 5xx, but 501 and 505, which say the relay
// will never take this request.
func retryableStatus(code int) bool {
	switch code {
	case http.StatusNotImplemented, http.StatusHTTPVersionNotSupported:
		return false
	}
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}
