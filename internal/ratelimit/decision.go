package ratelimit

import (
	"net/http"
	"strconv"
	"time"
)

// Decision is the outcome of one Allow. The zero Decision, which a nil
// Limiter returns, allows and writes no header fields.
type Decision struct {
	// Allowed is false when the request is over the limit: answer 429.
	Allowed bool
	// Remaining is the whole units left in the bucket after this request.
	Remaining int
	// RetryAfter is, when refused, the wait until one unit is there, in
	// whole seconds rounded up, at least one; zero when allowed.
	RetryAfter time.Duration
	// Reset is the wait until the next unit arrives, in whole seconds rounded
	// up, at least one: until then Remaining is all the client may spend. The
	// RateLimit field's t; equal to RetryAfter when refused.
	Reset time.Duration

	policy *policy // nil from a nil Limiter
}

// SetHeaders sets the RateLimit-Policy and RateLimit fields on every answer,
// and Retry-After when d refuses. It replaces any earlier values: one policy
// applies to a request.
func (d Decision) SetHeaders(h http.Header) {
	if d.policy == nil {
		return
	}
	// Assigned under their canonical keys: h.Set would allocate to
	// canonicalize "RateLimit-Policy" on every answer.
	h[policyKey] = []string{d.policy.field}
	h[limitKey] = []string{d.policy.name + ";r=" + strconv.Itoa(d.Remaining) + ";t=" + seconds(d.Reset)}
	if !d.Allowed {
		h[retryAfterKey] = []string{seconds(d.RetryAfter)}
	}
}

// The fields' names as http.CanonicalHeaderKey spells them.
const (
	policyKey     = "Ratelimit-Policy"
	limitKey      = "Ratelimit"
	retryAfterKey = "Retry-After"
)

func seconds(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) }
