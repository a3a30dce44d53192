package apns

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sideshow/apns2"

	"github.com/spoolcast/spoolcast/channel"
)

// TooManyWait is how long a message APNs answered 429 TooManyRequests
// (too many to its device) without a Retry-After waits.
const TooManyWait = time.Minute

// answered maps an APNs answer to its outcome (the table in doc.go);
// invalidSince is a 410's timestamp (zero without one).
func answered(status int, reason, apnsID string, wait time.Duration, invalidSince time.Time) channel.Outcome {
	o := channel.Outcome{Status: status, Code: reason, Reason: fmt.Sprintf("APNs %d %s", status, reason)}
	if reason == "" {
		o.Reason = fmt.Sprintf("APNs %d %s", status, http.StatusText(status))
	}
	switch {
	case status == http.StatusOK:
		o.Kind, o.ID = channel.Delivered, apnsID
	case status == http.StatusGone:
		o.Kind, o.InvalidSince = channel.TokenGone, invalidSince
	case status == http.StatusBadRequest && reason == apns2.ReasonBadDeviceToken:
		o.Kind = channel.TokenInvalid
	case status == http.StatusBadRequest && reason == apns2.ReasonDeviceTokenNotForTopic:
		// This device's token is another app's (a build with another
		// bundle id). A wrong --apns-topic answers so for every device:
		// the dispatcher's refusal guard tells the two apart.
		o.Kind = channel.TokenForeign
	case status == http.StatusBadRequest && (reason == apns2.ReasonTopicDisallowed ||
		reason == apns2.ReasonBadTopic || reason == apns2.ReasonMissingTopic):
		// The topic (--apns-topic) is not this key's, or none: a wrong
		// setting, no device to blame. An operator's alert.
		o.Kind, o.Credentials = channel.Failed, true
	case status == http.StatusForbidden && reason == apns2.ReasonExpiredProviderToken:
		// The JWT outlived its hour: the next request signs a new one
		// (Channel.send), so this heals by itself; sent again, no alert.
		o.Kind = channel.RetryAfter
	case status == http.StatusForbidden:
		// Apple: not to be retried (Forbidden), or refused until an
		// operator fixes the key, team or certificate (InvalidProviderToken,
		// MissingProviderToken, BadCertificate, ...): final, and counted for
		// the credentials alert.
		o.Kind, o.Credentials = channel.Failed, true
	case status == http.StatusTooManyRequests && reason == apns2.ReasonTooManyProviderTokenUpdates:
		// The key's token was renewed more often than every 20 minutes:
		// replicas signing their own rather than sharing one (--apns-*
		// set on a replica without the database's shared token, or two
		// deployments on one key). The deployment's, counted for the alert.
		o.Kind, o.Wait, o.Credentials = channel.RetryAfter, wait, true
	case status == http.StatusTooManyRequests && reason == apns2.ReasonTooManyRequests:
		// Too many to this one device: sent again at once, it is refused
		// again. Apple names no wait; a minute, deferred.
		o.Kind, o.Wait = channel.RetryAfter, cmp.Or(wait, TooManyWait)
	case status == http.StatusTooManyRequests, status == http.StatusInternalServerError, status == http.StatusServiceUnavailable:
		o.Kind, o.Wait = channel.RetryAfter, wait
	case status >= 500:
		// Not APNs' own words: a proxy's 502 or 504 may hide a request
		// APNs took.
		o.Kind = channel.Unknown
	default:
		o.Kind = channel.Failed
	}
	return o
}

// unanswered is the outcome of a request that got no answer: Unknown if
// it may have been written, NotSent if the caller's ctx ended first,
// RetryAfter otherwise (no connection, a timeout before writing).
func unanswered(ctx context.Context, x *exchange, err error) channel.Outcome {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err // without "Post <url with the device token>: "
	}
	switch {
	case x.maybeWritten():
		return channel.Outcome{Kind: channel.Unknown, Reason: "APNs: no answer to a request written: " + err.Error()}
	case ctx.Err() != nil:
		return notSent(ctx)
	default:
		return channel.Outcome{Kind: channel.RetryAfter, Reason: "APNs: request not written: " + err.Error()}
	}
}

// exchange is what the transport showed of one request, beyond what
// apns2's Response says: how far it got, and the answer's headers.
type exchange struct {
	ctx context.Context // the request's: its deadline is Config.Timeout
	// liveConn: the last attempt got a connection before ctx ended, so
	// the transport may be writing it even after returning ctx's error.
	liveConn atomic.Bool
	// wrote: the last attempt's HEADERS were written, or failed to be.
	wrote atomic.Bool

	// Set by the observer when the transport answers; read after Push.
	status     int
	apnsID     string
	retryAfter string
	bearer     string
	// invalidSince is a 410's timestamp, to the millisecond Apple sends
	// (apns2 keeps whole seconds); zero without one.
	invalidSince time.Time
}

type exchangeKey struct{}

// trace marks each attempt: GotConn starts one (the transport retries only
// requests the server said it did not process), WroteHeaders writes it.
func (x *exchange) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) {
			x.wrote.Store(false)
			x.liveConn.Store(x.ctx.Err() == nil)
		},
		WroteHeaders: func() { x.wrote.Store(true) },
	}
}

// maybeWritten is the rule in doc.go: headers written, or a ctx that ended
// while the request held a connection (the writer may still be at it).
func (x *exchange) maybeWritten() bool {
	return x.wrote.Load() || (x.ctx.Err() != nil && x.liveConn.Load())
}

// wait is the Retry-After the answer carried, in seconds or as a date; 0
// without one.
func (x *exchange) wait(now time.Time) time.Duration {
	if x.retryAfter == "" {
		return 0
	}
	if s, err := strconv.Atoi(x.retryAfter); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(x.retryAfter); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// observer wraps apns2's transport to keep what apns2 drops: the status
// of an answer whose body it cannot read, Retry-After, and the JWT sent.
type observer struct{ next http.RoundTripper }

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := o.next.RoundTrip(req)
	if x, ok := req.Context().Value(exchangeKey{}).(*exchange); ok {
		x.bearer = req.Header.Get("authorization")
		if res != nil {
			x.status = res.StatusCode
			x.apnsID = res.Header.Get("apns-id")
			x.retryAfter = res.Header.Get("Retry-After")
			if res.StatusCode == http.StatusGone {
				x.invalidSince = readTimestamp(res)
			}
		}
	}
	return res, err
}

// readTimestamp reads the "timestamp" (milliseconds since the epoch) of a
// 410's body and puts the body back for apns2; zero when there is none.
func readTimestamp(res *http.Response) time.Time {
	body, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	_ = res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(body))
	var answer struct {
		Timestamp int64 `json:"timestamp"`
	}
	if err != nil || json.Unmarshal(body, &answer) != nil || answer.Timestamp <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(answer.Timestamp)
}

// CloseIdleConnections is what apns2's Client.CloseIdleConnections asks
// of its transport.
func (o *observer) CloseIdleConnections() {
	if c, ok := o.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
