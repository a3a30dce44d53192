package client

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/internal/retryafter"
)

// DefaultRelayURL is where the relay listens beside every producer pod.
const DefaultRelayURL = "http://127.0.0.1:7070"

// Config configures a Client. The zero Config talks to the local relay with
// the default retry policy.
type Config struct {
	// RelayURL is the relay's base URL; events go to RelayURL + "/v1/events".
	// Default DefaultRelayURL.
	RelayURL string
	// HTTPClient sends the requests. Default a client of its own whose
	// transport keeps up to 64 idle connections to the relay, so concurrent
	// emits reuse connections instead of opening new ones.
	HTTPClient *http.Client
	// AttemptTimeout bounds one attempt, from sending to reading the answer.
	// A relay on loopback answers in milliseconds. The default, 12s, is
	// longer than the relay's own wait for a slow disk (10s): a relay that
	// cannot commit in time answers 503 with Retry-After, and Emit backs off
	// as asked instead of piling retries onto the disk.
	AttemptTimeout time.Duration
	// MaxAttempts caps the requests of one Emit, the first included; 1 turns
	// retries off. Default 5.
	MaxAttempts int
	// MaxElapsed caps the time one Emit spends over all its attempts and
	// waits. A wait that would end past it (a long Retry-After) is not
	// started: Emit gives up at once. Default 30s.
	MaxElapsed time.Duration
	// BaseBackoff is the ceiling of the wait before the first retry; it
	// doubles for each later one, up to MaxBackoff. The wait is drawn
	// uniformly below the ceiling (full jitter). Default 100ms.
	BaseBackoff time.Duration
	// MaxBackoff caps the backoff ceiling. Default 5s, or BaseBackoff if larger.
	MaxBackoff time.Duration
	// Token is a static bearer token (an HS256 service JWT with the push:emit
	// scope), for a relay that requires service tokens. Default none: a relay
	// on loopback needs no credentials.
	Token string
	// TokenSource, when set, is called before every attempt for the bearer
	// token, so a rotated token is picked up. Its error (a file mid-rotation)
	// is retried like a network error, within MaxElapsed; a token it returns
	// that could not be sent ends Emit. Set Token or TokenSource, not both.
	// Default none.
	TokenSource func(ctx context.Context) (string, error)
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case c.AttemptTimeout < 0:
		return fmt.Errorf("attempt timeout %s: must not be negative (0 means the default, 12s)", c.AttemptTimeout)
	case c.MaxAttempts < 0:
		return fmt.Errorf("max attempts %d: must not be negative (0 means the default, 5; 1 turns retries off)", c.MaxAttempts)
	case c.MaxElapsed < 0:
		return fmt.Errorf("max elapsed %s: must not be negative (0 means the default, 30s)", c.MaxElapsed)
	case c.BaseBackoff < 0:
		return fmt.Errorf("base backoff %s: must not be negative (0 means the default, 100ms)", c.BaseBackoff)
	case c.MaxBackoff < 0:
		return fmt.Errorf("max backoff %s: must not be negative (0 means the default, 5s)", c.MaxBackoff)
	case c.MaxBackoff > 0 && c.MaxBackoff < cmp.Or(c.BaseBackoff, defaultBaseBackoff):
		return fmt.Errorf("max backoff %s is below base backoff %s", c.MaxBackoff, cmp.Or(c.BaseBackoff, defaultBaseBackoff))
	case c.Token != "" && c.TokenSource != nil:
		return errors.New("set Token or TokenSource, not both")
	}
	if c.Token != "" {
		if err := checkToken(c.Token); err != nil {
			return fmt.Errorf("token: %w", err)
		}
	}
	if c.RelayURL != "" {
		u, err := url.Parse(c.RelayURL)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https"):
			return fmt.Errorf("relay URL %q: want a URL such as %s (http or https)", c.RelayURL, DefaultRelayURL)
		case u.Host == "":
			return fmt.Errorf("relay URL %q: no host", c.RelayURL)
		case u.RawQuery != "" || u.Fragment != "":
			return fmt.Errorf("relay URL %q: want a base URL without query or fragment", c.RelayURL)
		case strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1/events"):
			return fmt.Errorf("relay URL %q: want the base URL; the client adds /v1/events", c.RelayURL)
		}
	}
	return nil
}

const defaultBaseBackoff = 100 * time.Millisecond

// checkToken refuses what would make an invalid Authorization header: net/http
// would fail every attempt with it, a failure no retry cures.
func checkToken(tok string) error {
	if len(tok) > 7 && strings.EqualFold(tok[:7], "bearer ") {
		return errors.New(`pass the token alone, without "Bearer "`)
	}
	for _, r := range tok {
		if r <= ' ' || r >= 0x7f {
			return errors.New("holds a space, a control or a non-ASCII character (a trailing newline from a file?)")
		}
	}
	return nil
}

// Status says how the relay took an event. Both mean the event is on its disk.
type Status string

// The statuses of a Result.
const (
	// Accepted: the relay did not hold the key (202): the first emit, or one
	// after the relay forgot a forwarded key (its --key-ttl), which Postgres
	// then recognises, so it is still one notification per recipient.
	Accepted Status = "accepted"
	// Duplicate: the relay already held the key with this same event (200 +
	// Idempotent-Replayed): an earlier Emit, or an earlier attempt of this
	// one whose answer was lost. This answer stored nothing new; the event
	// is stored once.
	Duplicate Status = "duplicate"
)

// Result is a successful Emit: the event is durable on the relay's disk and
// will be forwarded.
type Result struct {
	Status         Status
	IdempotencyKey string
	// ReceivedAt is when the relay first received the key; for a Duplicate,
	// the first receipt's time.
	ReceivedAt time.Time
}

// Client emits events to a relay. It is safe for concurrent use.
type Client struct {
	cfg       Config
	eventsURL string
	http      *http.Client
	ownHTTP   bool
}

// New returns a client for cfg, with defaults filled in.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("spoolcast client: %w", err)
	}
	cfg.RelayURL = cmp.Or(cfg.RelayURL, DefaultRelayURL)
	cfg.AttemptTimeout = cmp.Or(cfg.AttemptTimeout, 12*time.Second)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 5)
	cfg.MaxElapsed = cmp.Or(cfg.MaxElapsed, 30*time.Second)
	cfg.BaseBackoff = cmp.Or(cfg.BaseBackoff, defaultBaseBackoff)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, max(5*time.Second, cfg.BaseBackoff))
	c := &Client{cfg: cfg, eventsURL: strings.TrimSuffix(cfg.RelayURL, "/") + "/v1/events", http: cfg.HTTPClient}
	if c.http == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		c.http, c.ownHTTP = &http.Client{Transport: t}, true
	}
	return c, nil
}

// CloseIdleConnections closes the idle connections of the client's own
// transport (none when Config.HTTPClient was given). Emit still works after it.
func (c *Client) CloseIdleConnections() {
	if c.ownHTTP {
		c.http.CloseIdleConnections()
	}
}

// Emit sends ev to the relay and returns once the relay has it on disk, or
// with an error saying why not. Failures worth retrying (network errors,
// timeouts, 408, 429, 5xx but 501 and 505) are retried with the same key and
// the same bytes, so a retry is never a second event; the error after the
// last is a *GaveUpError. Other failures are returned at once:
// *ConflictError, *InvalidEventError (for both, Rejected(err) is true),
// *UnauthorizedError, *StatusError, or an error verifying the relay's TLS
// certificate.
func (c *Client) Emit(ctx context.Context, ev Event) (Result, error) {
	body, err := ev.encode()
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	budget := start.Add(c.cfg.MaxElapsed)
	gaveUp := func(attempts int, last, ctxErr error, reason string) error {
		return &GaveUpError{IdempotencyKey: ev.IdempotencyKey, Attempts: attempts, Elapsed: time.Since(start), Last: last, ContextErr: ctxErr, reason: reason}
	}
	var last error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return Result{}, gaveUp(attempt-1, last, err, "the context ended")
		}
		res, retryAfter, err := c.attempt(ctx, budget, body, ev.IdempotencyKey)
		if err == nil && res.IdempotencyKey != ev.IdempotencyKey {
			// Not this event's answer: something else listens at RelayURL.
			return Result{}, &StatusError{StatusCode: statusOf(res), Problem: Problem{
				Status: statusOf(res), Title: "Unexpected answer",
				Detail: fmt.Sprintf("the answer is for key %q, not %q", res.IdempotencyKey, ev.IdempotencyKey),
			}}
		}
		if err == nil {
			return res, nil
		}
		if retryAfter < 0 {
			return Result{}, err // not worth retrying
		}
		last = err
		switch {
		case ctx.Err() != nil:
			return Result{}, gaveUp(attempt, last, ctx.Err(), "the context ended")
		case attempt >= c.cfg.MaxAttempts:
			return Result{}, gaveUp(attempt, last, nil, fmt.Sprintf("MaxAttempts is %d", c.cfg.MaxAttempts))
		}
		wait := c.wait(attempt, retryAfter)
		// An attempt needs a moment to be worth sending: one started with a
		// few milliseconds left can only time out.
		next := time.Now().Add(wait + min(c.cfg.AttemptTimeout, minAttempt))
		if next.After(budget) {
			return Result{}, gaveUp(attempt, last, nil, fmt.Sprintf("the next attempt, in %s, would pass the %s budget", wait.Round(time.Millisecond), c.cfg.MaxElapsed))
		}
		if d, ok := ctx.Deadline(); ok && next.After(d) {
			return Result{}, gaveUp(attempt, last, context.DeadlineExceeded, fmt.Sprintf("the next attempt, in %s, would pass the context's deadline", wait.Round(time.Millisecond)))
		}
		if err := sleep(ctx, wait); err != nil {
			return Result{}, gaveUp(attempt, last, err, "the context ended")
		}
	}
}

// minAttempt is the least time left for an attempt to be started: a relay
// on loopback answers well within it.
const minAttempt = 100 * time.Millisecond

// wait is the pause before retry n (1 for the first). Without Retry-After it
// is drawn uniformly from [0, min(MaxBackoff, BaseBackoff·2ⁿ⁻¹)] (full
// jitter). With one, it is never shorter than the relay asked and up to a
// fifth longer, drawn at random, so that producers turned away together do
// not all come back in the same instant.
func (c *Client) wait(n int, retryAfter time.Duration) time.Duration {
	ceiling := c.cfg.BaseBackoff
	for i := 1; i < n && ceiling < c.cfg.MaxBackoff; i++ {
		ceiling *= 2
	}
	backoff := rand.N(min(ceiling, c.cfg.MaxBackoff) + 1)
	if retryAfter <= 0 {
		return backoff
	}
	return max(backoff, retryAfter+rand.N(retryAfter/5+1))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxAnswer bounds how much of an answer is read: the relay's are a few
// hundred bytes.
const maxAnswer = 64 << 10

// attempt sends body once. retryAfter is negative when err is not worth
// retrying; otherwise it is the wait the relay asked for (0 when none).
func (c *Client) attempt(ctx context.Context, budget time.Time, body []byte, key string) (res Result, retryAfter time.Duration, err error) {
	// The token first, within the budget but outside the attempt's timer:
	// the timer is for the relay's answer.
	tok, retryAfter, err := c.token(ctx, budget)
	if err != nil {
		return Result{}, retryAfter, err
	}
	timeout := min(c.cfg.AttemptTimeout, time.Until(budget))
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, c.eventsURL, bytes.NewReader(body))
	if err != nil {
		return Result{}, -1, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, application/problem+json")
	if keyFitsHeader(key) {
		// The relay checks it against the body's key. It also lets net/http
		// resend the request by itself when a kept-alive connection turns
		// out to be closed, instead of failing the attempt.
		req.Header.Set("Idempotency-Key", key)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	timedOut := func(err error) error {
		if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			// Not the caller's deadline: say so, without wrapping
			// context.DeadlineExceeded, which callers read as theirs.
			return &AttemptTimeoutError{After: timeout}
		}
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if certificateError(err) {
			return Result{}, -1, fmt.Errorf("the relay's TLS certificate: %w", err)
		}
		return Result{}, 0, timedOut(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		// The status may say the event is stored, but the answer is cut: the
		// retry, with the same key, gets it whole.
		return Result{}, 0, fmt.Errorf("read the relay's %d answer: %w", resp.StatusCode, timedOut(err))
	}
	return readAnswer(resp, raw, key)
}

// keyFitsHeader: the key travels unchanged as a bare Idempotency-Key value
// (printable ASCII, no surrounding space, not a quoted string).
func keyFitsHeader(key string) bool {
	if key == "" || key[0] == '"' || key[0] == ' ' || key[len(key)-1] == ' ' {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// certificateError: the relay's certificate cannot be verified, which no
// retry cures.
func certificateError(err error) bool {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host)
}

// token asks TokenSource, bounded by the budget. retryAfter is as in attempt.
func (c *Client) token(ctx context.Context, budget time.Time) (tok string, retryAfter time.Duration, err error) {
	if c.cfg.TokenSource == nil {
		return c.cfg.Token, 0, nil
	}
	tctx, cancel := context.WithDeadline(ctx, budget)
	defer cancel()
	tok, err = c.cfg.TokenSource(tctx)
	if err != nil {
		return "", 0, fmt.Errorf("bearer token: %w", err)
	}
	if err := checkToken(tok); err != nil {
		return "", -1, fmt.Errorf("bearer token from TokenSource: %w", err)
	}
	return tok, 0, nil
}

func statusOf(res Result) int {
	if res.Status == Duplicate {
		return http.StatusOK
	}
	return http.StatusAccepted
}

// readAnswer turns the relay's answer into a Result or a typed error, and
// says whether to retry as in attempt.
func readAnswer(resp *http.Response, raw []byte, key string) (Result, time.Duration, error) {
	code := resp.StatusCode
	switch code {
	case http.StatusAccepted, http.StatusOK:
		var a struct {
			Status         Status    `json:"status"`
			IdempotencyKey string    `json:"idempotency_key"`
			ReceivedAt     time.Time `json:"received_at"`
		}
		want := map[int]Status{http.StatusAccepted: Accepted, http.StatusOK: Duplicate}[code]
		if err := json.Unmarshal(raw, &a); err != nil || a.Status != want {
			// Not the relay's answer: something else listens at RelayURL.
			return Result{}, -1, &StatusError{StatusCode: code, Problem: Problem{
				Status: code, Title: "Unexpected answer", Detail: fmt.Sprintf("want the relay's %q answer, got %q", want, truncate(raw)),
			}}
		}
		return Result{Status: a.Status, IdempotencyKey: cmp.Or(a.IdempotencyKey, key), ReceivedAt: a.ReceivedAt}, 0, nil
	}
	p := readProblem(resp, raw)
	switch {
	case code == http.StatusUnprocessableEntity && p.Slug() == "idempotency-key-reused":
		return Result{}, -1, &ConflictError{IdempotencyKey: key, Problem: p}
	case code == http.StatusBadRequest || code == http.StatusRequestEntityTooLarge ||
		code == http.StatusUnsupportedMediaType || code == http.StatusUnprocessableEntity:
		return Result{}, -1, &InvalidEventError{StatusCode: code, Field: p.Field, Detail: p.Detail, Problem: p}
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return Result{}, -1, &UnauthorizedError{StatusCode: code, Challenge: resp.Header.Get("WWW-Authenticate"), Problem: p}
	case retryableStatus(code):
		wait, _ := retryafter.Parse(resp.Header.Get("Retry-After"), time.Now())
		return Result{}, wait, &StatusError{StatusCode: code, RetryAfter: wait, Problem: p}
	}
	return Result{}, -1, &StatusError{StatusCode: code, Problem: p}
}

// readProblem reads a problem document, or makes one of an answer that is not.
func readProblem(resp *http.Response, raw []byte) Problem {
	var p Problem
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/problem+json" || mt == "application/json" {
		if err := json.Unmarshal(raw, &p); err == nil && p.Type != "" {
			p.Status = cmp.Or(p.Status, resp.StatusCode)
			return p
		}
	}
	return Problem{Title: http.StatusText(resp.StatusCode), Status: resp.StatusCode, Detail: truncate(raw)}
}

func truncate(raw []byte) string {
	s := strings.TrimSpace(string(raw))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
