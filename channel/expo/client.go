// Package expo is a client of Expo's push service: send messages, fetch
// receipts. It keeps to Expo's limits — at most 100 messages a send, 1,000
// ids a receipt request, 4,096 bytes a message — compresses request bodies
// over 1 KiB, caps its concurrent requests and its messages per second, and
// retries with exponential backoff, honouring Retry-After, what Expo's
// documentation says to retry: a 429, a 5xx, a network error. A receipt
// request is retried after any of them; a send only when Expo did not take
// it: an answer of 429 or 5xx, or a request that never reached it whole (no
// connection, or one that broke while the request was written). Expo has no
// idempotency key, so a send written whole whose answer was lost (a timeout,
// a connection reset) is never sent again: push is at most once.
//
// The rule it keeps: a ticket is not an outcome. Send returns tickets; only
// a receipt says whether a message reached the device.
package expo

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/retryafter"
	"github.com/spoolcast/spoolcast/internal/sendtrace"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// DefaultURL is the base of Expo's production push API.
const DefaultURL = "https://exp.host/--/api/v2/push"

// Expo's limits.
const (
	MaxMessagesPerSend   = 100
	MaxIDsPerReceipts    = 1000
	MaxMessageBytes      = 4096
	DefaultRatePerSecond = 600 // messages per second per project
	gzipAbove            = 1 << 10
)

// Error codes Expo reports in tickets and receipts, and in request errors.
const (
	DeviceNotRegistered = "DeviceNotRegistered"
	MessageTooBig       = "MessageTooBig"
	MessageRateExceeded = "MessageRateExceeded"
	InvalidCredentials  = "InvalidCredentials"
	// MismatchSenderID: the device's FCM sender is not the one of the
	// credentials Expo holds for this project: a build of another app's,
	// or, for every Android device at once, the project's FCM credentials.
	MismatchSenderID = "MismatchSenderId"
)

// Message is one push to one device.
type Message struct {
	To    string         `json:"to"`
	Title string         `json:"title,omitempty"`
	Body  string         `json:"body,omitempty"`
	Data  map[string]any `json:"data,omitempty"`
	Sound string         `json:"sound,omitempty"`
	// Priority is Expo's delivery priority: "high" for critical notifications.
	Priority string `json:"priority,omitempty"`
	// ContentAvailable wakes the app in the background on iOS
	// (content-available): with no title, body or sound, the message is
	// silent, data for the app alone.
	ContentAvailable bool `json:"_contentAvailable,omitempty"`
	// TTL is how many seconds Expo's providers keep the message for a
	// device that is offline; 0 is "now or never". Without it Expo keeps
	// a message 0 s on iOS and four weeks on Android: the channel always
	// sends one.
	TTL *int `json:"ttl,omitempty"`
}

// Ticket is Expo's answer to one message of a send: an id to ask for its
// receipt, or an error.
type Ticket struct {
	Status  string       `json:"status"` // "ok" or "error"
	ID      string       `json:"id,omitempty"`
	Message string       `json:"message,omitempty"`
	Details *ErrorDetail `json:"details,omitempty"`
}

// Receipt is the outcome of one message, once Expo has it.
type Receipt struct {
	Status  string       `json:"status"` // "ok" or "error"
	Message string       `json:"message,omitempty"`
	Details *ErrorDetail `json:"details,omitempty"`
}

// ErrorDetail names an error Expo reports for one message.
type ErrorDetail struct {
	Error string `json:"error,omitempty"`
}

// Code returns the error code of a ticket or receipt ("" when none).
func code(d *ErrorDetail) string {
	if d == nil {
		return ""
	}
	return d.Error
}

// Code is the ticket's error code, "" for an ok ticket.
func (t Ticket) Code() string { return code(t.Details) }

// Code is the receipt's error code, "" for an ok receipt.
func (r Receipt) Code() string { return code(r.Details) }

// RequestError is a request Expo refused or failed as a whole.
type RequestError struct {
	Status int    // HTTP status; 0 when no answer came
	Code   string // Expo's error code, e.g. InvalidCredentials
	Msg    string
	// Unknown: the request may have been processed. It was written whole,
	// and then no usable answer came (a timeout, a broken connection, an
	// answer cut short or unreadable). A send's messages may have been
	// accepted, so a send that is Unknown is never tried again.
	Unknown bool
	// Tries is how many requests were made, retries included.
	Tries int
	// RetryAfter is what the last answer's Retry-After asked for (a 429,
	// a 503); 0 when it named no wait.
	RetryAfter time.Duration
	// Experiences are the details of a PUSH_TOO_MANY_EXPERIENCE_IDS: the
	// request's tokens by the Expo project ("@owner/slug") each belongs to.
	Experiences map[string][]string
	cause       error // the context's error, when it ended the request
}

// TooManyExperiences is the code of a 400 refusing a request whose tokens
// belong to more than one Expo project; Expo took none of its messages.
const TooManyExperiences = "PUSH_TOO_MANY_EXPERIENCE_IDS"

// Unwrap returns the context's error when it ended the request.
func (e *RequestError) Unwrap() error { return e.cause }

func (e *RequestError) Error() string {
	var msg string
	switch {
	case e.Status == 0:
		msg = "expo: " + e.Msg
	case e.Code != "":
		msg = fmt.Sprintf("expo: %d %s: %s", e.Status, e.Code, e.Msg)
	default:
		msg = fmt.Sprintf("expo: %d: %s", e.Status, e.Msg)
	}
	if e.Tries > 1 {
		msg += fmt.Sprintf(" (after %d tries)", e.Tries)
	}
	return msg
}

// Retryable reports whether a send that failed with e may be sent again:
// Expo did not take it (it answered 429 or 5xx, or the request never reached
// it whole).
func (e *RequestError) Retryable() bool { return e.retryable(false) }

// retryable reports whether a request that failed with e is tried again:
// no answer, 429 or 5xx (as Expo's documentation asks), and, for a request
// that is not idempotent (a send: Expo has no idempotency key, a retry of a
// send it took delivers twice), only when Expo did not take it.
func (e *RequestError) retryable(idempotent bool) bool {
	if e.Unknown && !idempotent {
		return false
	}
	return e.Status == 0 || e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// ErrMessageTooBig: a message over MaxMessageBytes, refused before sending.
var ErrMessageTooBig = errors.New("expo: " + MessageTooBig + ": a message is over 4096 bytes")

// ErrNotSent wraps the error of a request that ended, because its context
// did, before it reached Expo whole: while it waited for the rate limit, for
// a connection slot, for a retry, for the connection to open, or while it was
// written. Nothing of it was delivered; its messages may be sent again.
var ErrNotSent = errors.New("expo: not sent")

// Config configures a client.
type Config struct {
	// URL is the API base; the client appends /send and /getReceipts. Default DefaultURL.
	URL string
	// AccessToken, when set, is sent as a bearer token (Expo's enhanced push security).
	AccessToken string
	// HTTP is the HTTP client. Default one with a 10 s timeout.
	HTTP *http.Client
	// MaxConcurrent caps requests in flight. Default 6.
	MaxConcurrent int
	// RatePerSecond caps messages sent per second; negative is no cap (for
	// benchmarks against a fake). Default DefaultRatePerSecond.
	RatePerSecond int
	// Retries is how many times a request that may pass later is tried
	// again: a send after a 429, a 5xx or a request never written whole
	// (only what Expo did not take), a receipt request also after no answer.
	// A call under RetryFor is tried again for as long as it says instead.
	// Default 3.
	Retries int
	// MinBackoff is the first wait before a retry, doubled each time, unless
	// Retry-After says otherwise. Default 500ms.
	MinBackoff time.Duration
	// MaxBackoff caps a wait, Retry-After included. Default 30s.
	MaxBackoff time.Duration
	// OnRequest, when set, is called after every HTTP request with its
	// endpoint ("send" or "getReceipts"), its duration and its outcome.
	OnRequest func(endpoint string, took time.Duration, err error)
	// Clock times backoffs, Retry-After dates and requests. Default the wall clock.
	Clock clock.Clock
}

// Client talks to Expo's push API. It is safe for concurrent use.
type Client struct {
	cfg     Config
	slots   chan struct{}
	limiter *rate.Limiter
}

// New returns a client.
func New(cfg Config) (*Client, error) {
	switch {
	case cfg.MaxConcurrent < 0 || cfg.Retries < 0 || cfg.MinBackoff < 0 || cfg.MaxBackoff < 0:
		return nil, errors.New("expo: concurrency, retries and backoff must not be negative")
	}
	cfg.URL = strings.TrimSuffix(cmp.Or(cfg.URL, DefaultURL), "/")
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	cfg.MaxConcurrent = cmp.Or(cfg.MaxConcurrent, 6)
	cfg.RatePerSecond = cmp.Or(cfg.RatePerSecond, DefaultRatePerSecond)
	cfg.Retries = cmp.Or(cfg.Retries, 3)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 500*time.Millisecond)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 30*time.Second)
	c := &Client{cfg: cfg, slots: make(chan struct{}, cfg.MaxConcurrent)}
	if cfg.RatePerSecond > 0 {
		c.limiter = rate.NewLimiter(rate.Limit(cfg.RatePerSecond), max(cfg.RatePerSecond, MaxMessagesPerSend))
	}
	return c, nil
}

// Send pushes at most MaxMessagesPerSend messages in one request and returns
// their tickets in the same order. A message over MaxMessageBytes fails the
// call with ErrMessageTooBig before anything is sent: check with Size first.
// A request Expo refuses as a whole is a *RequestError, after the retries
// when it is retryable; one whose outcome is unknown (Expo may have accepted
// the messages) is never retried and has Unknown set. A send that ctx ended
// before it reached Expo is ErrNotSent.
func (c *Client) Send(ctx context.Context, msgs []Message) ([]Ticket, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if len(msgs) > MaxMessagesPerSend {
		return nil, fmt.Errorf("expo: %d messages in one send; at most %d", len(msgs), MaxMessagesPerSend)
	}
	for _, m := range msgs {
		if n, _ := Size(m); n > MaxMessageBytes {
			return nil, ErrMessageTooBig
		}
	}
	if c.limiter != nil {
		if err := c.limiter.WaitN(ctx, len(msgs)); err != nil {
			return nil, fmt.Errorf("%w: waiting for the rate limit: %w", ErrNotSent, err)
		}
	}
	var out struct {
		Data []Ticket `json:"data"`
	}
	if err := c.post(ctx, "send", false, msgs, &out); err != nil {
		return nil, err
	}
	if len(out.Data) != len(msgs) {
		return nil, &RequestError{Status: http.StatusOK, Msg: fmt.Sprintf("%d tickets for %d messages", len(out.Data), len(msgs)), Unknown: true}
	}
	return out.Data, nil
}

// Receipts fetches the receipts of at most MaxIDsPerReceipts tickets. An id
// Expo has no receipt for yet is absent from the map: ask again later.
func (c *Client) Receipts(ctx context.Context, ids []string) (map[string]Receipt, error) {
	if len(ids) == 0 {
		return map[string]Receipt{}, nil
	}
	if len(ids) > MaxIDsPerReceipts {
		return nil, fmt.Errorf("expo: %d receipt ids in one request; at most %d", len(ids), MaxIDsPerReceipts)
	}
	var out struct {
		Data map[string]Receipt `json:"data"`
	}
	if err := c.post(ctx, "getReceipts", true, map[string][]string{"ids": ids}, &out); err != nil {
		return nil, err
	}
	if out.Data == nil {
		out.Data = map[string]Receipt{}
	}
	return out.Data, nil
}

// Size is a message's encoded size, the measure of MaxMessageBytes.
func Size(m Message) (int, error) {
	b, err := json.Marshal(m)
	return len(b), err
}

type retryForKey struct{}

// RetryFor returns a context under which the client's calls keep trying
// again what may pass later for d from their first try, however many tries
// that takes, instead of Config.Retries times: a caller's bound on an
// outcome, such as a push dispatch's lease, that does not cut off a request
// in flight as a deadline would. A retry starts only if it can end, its wait
// and the HTTP client's timeout included, within d.
func RetryFor(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, retryForKey{}, d)
}

// post sends body to endpoint and decodes the answer into out, retrying what
// may pass later with exponential backoff (see RequestError.retryable;
// idempotent: a retry of a request Expo took does no harm).
func (c *Client) post(ctx context.Context, endpoint string, idempotent bool, body, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("expo: encode %s: %w", endpoint, err)
	}
	budget, bounded := ctx.Value(retryForKey{}).(time.Duration)
	first := c.cfg.Clock.Now()
	for attempt := 0; ; attempt++ {
		wait, err := c.postOnce(ctx, endpoint, raw, out)
		var re *RequestError
		if err == nil || !errors.As(err, &re) {
			return err
		}
		re.Tries, re.RetryAfter = attempt+1, wait
		if !re.retryable(idempotent) {
			return err
		}
		if ctx.Err() != nil {
			return notSent(ctx, re)
		}
		if wait == 0 {
			d := c.cfg.MinBackoff << min(attempt, 30)
			wait = d/2 + rand.N(d/2+1)
		}
		wait = min(wait, c.cfg.MaxBackoff)
		switch {
		case !bounded && attempt >= c.cfg.Retries:
			return err
		case bounded && clock.Since(c.cfg.Clock, first)+wait+c.cfg.HTTP.Timeout > budget:
			return err
		}
		if !startstop.Sleep(ctx, c.cfg.Clock, wait) {
			return notSent(ctx, re)
		}
	}
}

// notSent is the error of a request whose context ended while it waited to
// retry after re: ErrNotSent, unless re's outcome is unknown.
func notSent(ctx context.Context, re *RequestError) error {
	if re.Unknown {
		return re
	}
	return fmt.Errorf("%w: %w, after %w", ErrNotSent, ctx.Err(), re)
}

// postOnce makes one request. wait is what Retry-After asked for, if anything.
func (c *Client) postOnce(ctx context.Context, endpoint string, raw []byte, out any) (wait time.Duration, err error) {
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: waiting for a connection slot: %w", ErrNotSent, ctx.Err())
	}
	start := c.cfg.Clock.Now()
	defer func() {
		if c.cfg.OnRequest != nil {
			c.cfg.OnRequest(endpoint, clock.Since(c.cfg.Clock, start), err)
		}
	}()
	var reqBody io.Reader = bytes.NewReader(raw)
	gzipped := len(raw) > gzipAbove
	if gzipped {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed) // most of the saving for a fraction of the CPU
		_, _ = zw.Write(raw)
		_ = zw.Close()
		reqBody = &buf
	}
	// Whether Expo may have the request whole (sendtrace) tells one Expo
	// did not take (no connection, or one that broke while it was written:
	// Expo reads a request whole before it acts on it) from one it may have.
	tctx, trace := sendtrace.With(ctx)
	req, err := http.NewRequestWithContext(tctx, http.MethodPost, c.cfg.URL+"/"+endpoint, reqBody)
	if err != nil {
		return 0, fmt.Errorf("expo: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if gzipped {
		req.Header.Set("Content-Encoding", "gzip")
	}
	if c.cfg.AccessToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.AccessToken)
	}
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		switch {
		case trace.MaybeReceived():
			return 0, &RequestError{Msg: err.Error(), Unknown: true, cause: ctx.Err()}
		case ctx.Err() != nil:
			return 0, fmt.Errorf("%w: %w", ErrNotSent, ctx.Err())
		}
		return 0, &RequestError{Msg: err.Error()} // never written whole: Expo did not take it
	}
	defer resp.Body.Close()
	payload, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return 0, &RequestError{Status: resp.StatusCode, Msg: "reading the answer: " + err.Error(), Unknown: true, cause: ctx.Err()}
	}
	if resp.StatusCode != http.StatusOK {
		// Expo processes nothing it answers 429, 4xx or 5xx: its
		// documentation asks for 429 and 5xx to be retried with backoff.
		re := &RequestError{Status: resp.StatusCode, Msg: strings.TrimSpace(string(payload))}
		var body struct {
			Errors []struct {
				Code    string          `json:"code"`
				Message string          `json:"message"`
				Details json.RawMessage `json:"details"`
			} `json:"errors"`
		}
		if json.Unmarshal(payload, &body) == nil && len(body.Errors) > 0 {
			re.Code, re.Msg = body.Errors[0].Code, body.Errors[0].Message
			if re.Code == TooManyExperiences {
				_ = json.Unmarshal(body.Errors[0].Details, &re.Experiences) // unreadable: none, and the batch fails whole
			}
		}
		wait, _ := retryafter.Parse(resp.Header.Get("Retry-After"), c.cfg.Clock.Now())
		return wait, re
	}
	if err := json.Unmarshal(payload, out); err != nil {
		return 0, &RequestError{Status: resp.StatusCode, Msg: "undecodable answer: " + err.Error(), Unknown: true}
	}
	return 0, nil
}
