package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/internal/retryafter"
)

// result is what one attempt came to.
type result struct {
	outcome    string
	status     int
	err        string
	retryAfter time.Duration
	hold       time.Duration // the endpoint is sent nothing more for this long
	took       time.Duration
}

// send makes one attempt: a POST of the body with the three Standard
// Webhooks headers, signed at the attempt's own time.
func (d *Deliverer) send(ctx context.Context, l lease) result {
	start := time.Now()
	ts := d.cfg.Clock.Now().Unix()
	sig, err := Sign(l.secrets, l.id, ts, l.body)
	if err != nil {
		return result{outcome: OutcomeClient, err: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(l.body))
	if err != nil {
		return result{outcome: OutcomeNetwork, err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "spoolcast-webhooks/1")
	req.Header.Set("webhook-id", l.id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := d.cfg.Client.Do(req)
	took := time.Since(start)
	if err != nil {
		r := result{outcome: OutcomeNetwork, err: err.Error(), took: took}
		switch {
		case errors.Is(err, ErrPrivateTarget):
			r.outcome = OutcomeRefused
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			r.outcome, r.err = OutcomeTimeout, fmt.Sprintf("no answer within %s", d.cfg.Timeout)
		}
		return r
	}
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, bodyExcerpt))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	resp.Body.Close()
	r := result{status: resp.StatusCode, took: took}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		r.outcome = OutcomeDelivered
		return r
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		r.outcome = OutcomeRedirect
		r.err = fmt.Sprintf("%d redirect to %q not followed", resp.StatusCode, resp.Header.Get("Location"))
	case resp.StatusCode < 500:
		r.outcome = OutcomeClient
		r.err = fmt.Sprintf("%d %s", resp.StatusCode, loggable(bytes.TrimSpace(excerpt)))
	default:
		r.outcome = OutcomeServer
		r.err = fmt.Sprintf("%d %s", resp.StatusCode, loggable(bytes.TrimSpace(excerpt)))
	}
	// Whatever failed answer carries it: Standard Webhooks names 503 only as
	// an example, RFC 9110 gives it a meaning on 3xx too, and a receiver
	// behind a gateway may add it to a 502.
	wait, _ := retryafter.Parse(resp.Header.Get("Retry-After"), d.cfg.Clock.Now())
	r.retryAfter = min(wait, maxRetryAfter)
	// A receiver that says it is overloaded gets nothing more until it said,
	// as Standard Webhooks asks senders to throttle the endpoint, not only
	// to put off the one delivery: a 429 (for minRetry without a
	// Retry-After), or a 502, 503 or 504 that carries a Retry-After. A 5xx
	// without one puts off its own delivery only: a receiver that fails a
	// few requests in a hundred (a deploy, a gateway's hiccup) would
	// otherwise be held most of the time and fall ever further behind.
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		r.hold = max(r.retryAfter, minRetry)
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		r.hold = r.retryAfter
	}
	return r
}

// loggable is a receiver's answer as text Postgres takes: a NUL or invalid
// UTF-8 (a binary body, or one cut mid-character) would fail the whole
// recording transaction, every outcome in it.
func loggable(b []byte) string {
	return strings.ToValidUTF8(strings.ReplaceAll(string(b), "\x00", ""), "\uFFFD")
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
