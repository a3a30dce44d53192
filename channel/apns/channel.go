package apns

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"

	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/token"
	"golang.org/x/net/http2"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
)

// Channel sends to APNs over one HTTP/2 client.
type Channel struct {
	client     *apns2.Client
	token      *token.Token
	topic      string
	timeout    time.Duration
	expiration time.Duration
	clock      clock.Clock
	// sem holds a slot per request in flight, across every Send.
	sem chan struct{}
	// shared is the deployment's provider token (Config.Tokens); nil:
	// this replica signs its own.
	shared   *sharedToken
	log      *slog.Logger
	tokenLog *lograte.Limiter
}

var _ channel.Channel = (*Channel)(nil)

// New checks cfg, reads the key and signs a first JWT, so that a key that
// cannot sign fails here and not on the first push. It does not connect:
// the first Send does.
func New(cfg Config) (*Channel, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key := cfg.Key
	if key == nil {
		var err error
		if key, err = token.AuthKeyFromFile(cfg.KeyFile); err != nil {
			return nil, fmt.Errorf("apns: --apns-key-file %s: want the team's .p8 key (PKCS #8 PEM, P-256): %w", cfg.KeyFile, err)
		}
	}
	tok := &token.Token{AuthKey: key, KeyID: cfg.KeyID, TeamID: cfg.TeamID}
	if _, err := tok.Generate(); err != nil {
		return nil, fmt.Errorf("apns: --apns-key-file: cannot sign an ES256 token with this key: %w", err)
	}

	client := apns2.NewTokenClient(tok)
	client.Host = apns2.HostProduction
	if cfg.Sandbox {
		client.Host = apns2.HostDevelopment
	}
	if cfg.Host != "" {
		client.Host = strings.TrimSuffix(cfg.Host, "/")
	}
	if cfg.RootCAs != nil {
		client.HTTPClient = &http.Client{Transport: &http2.Transport{
			TLSClientConfig: &tls.Config{RootCAs: cfg.RootCAs},
			ReadIdleTimeout: apns2.ReadIdleTimeout,
		}}
	}
	// Config.Timeout bounds each request through its ctx instead, where a
	// timeout can be told from the caller's cancel.
	client.HTTPClient.Timeout = 0
	client.HTTPClient.Transport = &observer{next: client.HTTPClient.Transport}

	c := &Channel{
		client:     client,
		token:      tok,
		topic:      cfg.Topic,
		timeout:    cmp.Or(cfg.Timeout, defaultTimeout),
		expiration: cmp.Or(cfg.DefaultExpiration, defaultExpiration),
		clock:      clock.Or(cfg.Clock),
		sem:        make(chan struct{}, cmp.Or(cfg.Concurrency, defaultConcurrency)),
		log:        cmp.Or(cfg.Logger, slog.Default()).With("component", "apns"),
		tokenLog:   lograte.New(time.Minute),
	}
	if cfg.Tokens != nil {
		c.shared = &sharedToken{store: cfg.Tokens, key: key, keyID: cfg.KeyID, teamID: cfg.TeamID}
	}
	return c, nil
}

// Provider is "apns".
func (c *Channel) Provider() string { return "apns" }

// MaxBatch is 500: a Send's requests are streams on one connection, and
// the batch bounds a dispatcher pass, not a request.
func (c *Channel) MaxBatch() int { return 500 }

// Close closes the idle connection; a Send in flight keeps its own until
// it ends. Safe to call twice.
func (c *Channel) Close() error {
	c.client.CloseIdleConnections()
	return nil
}

// Send sends every message concurrently, within Config.Concurrency
// streams shared by every Send, and answers one outcome per message, in
// order. It returns when every request has its outcome.
func (c *Channel) Send(ctx context.Context, msgs []channel.Message) []channel.Outcome {
	c.useShared(ctx)
	out := make([]channel.Outcome, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		if !ValidToken(m.Token) {
			out[i] = channel.Outcome{Kind: channel.TokenInvalid, Reason: "not an APNs device token: want 64 to 200 hex characters"}
			continue
		}
		n, failed := c.notification(m)
		if failed != nil {
			out[i] = *failed
			continue
		}
		// A stream slot is taken before the request's goroutine starts,
		// so a batch waits here rather than as hundreds of goroutines.
		select {
		case c.sem <- struct{}{}:
		case <-ctx.Done():
			out[i] = notSent(ctx)
			continue
		}
		wg.Go(func() {
			defer func() { <-c.sem }()
			out[i] = c.send(ctx, n)
		})
	}
	wg.Wait()
	return out
}

// send sends one notification, holding a stream slot.
func (c *Channel) send(ctx context.Context, n *apns2.Notification) channel.Outcome {
	if ctx.Err() != nil { // both were ready; select chose at random
		return notSent(ctx)
	}

	reqCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	x := &exchange{ctx: reqCtx}
	reqCtx = httptrace.WithClientTrace(context.WithValue(reqCtx, exchangeKey{}, x), x.trace())
	res, err := c.client.PushWithContext(reqCtx, n)

	status, reason, id := x.status, "", x.apnsID
	if err == nil {
		status, reason, id = res.StatusCode, res.Reason, res.ApnsID
	}
	if status == 0 {
		return unanswered(ctx, x, err)
	}
	// A status without err is an answer apns2 read; with err, one whose
	// body it could not read: Apple still decided, by the status.
	o := answered(status, reason, id, x.wait(c.clock.Now()), x.invalidSince)
	if status == http.StatusForbidden && reason == apns2.ReasonExpiredProviderToken {
		c.renewToken(x.bearer)
	}
	return o
}

// renewToken makes the next request sign a new JWT, unless one was signed
// since bearer: the many answers to one expired JWT renew it once.
func (c *Channel) renewToken(bearer string) {
	if c.shared != nil {
		c.shared.refuse(bearer) // the store renews it, once for the deployment
		return
	}
	c.token.Lock()
	defer c.token.Unlock()
	if "bearer "+c.token.Bearer == bearer {
		c.token.IssuedAt = 0 // apns2's GenerateIfExpired signs again
	}
}

func notSent(ctx context.Context) channel.Outcome {
	return channel.Outcome{Kind: channel.NotSent, Reason: "APNs: not sent: " + context.Cause(ctx).Error()}
}

// ValidToken reports whether s can be an APNs device token: hex, whole
// bytes, 64 to 200 characters. Tokens are 32 bytes today (64 hex
// characters), but Apple says they are of variable length and not to
// hard-code their size: up to 100 bytes leaves them room to grow.
func ValidToken(s string) bool {
	if len(s) < 64 || len(s) > 200 || len(s)%2 != 0 {
		return false
	}
	for i := range len(s) {
		b := s[i]
		if (b < '0' || b > '9') && (b < 'a' || b > 'f') && (b < 'A' || b > 'F') {
			return false
		}
	}
	return true
}

// Platforms: APNs reaches iOS apps.
func (*Channel) Platforms() []string { return []string{"ios"} }

// ValidToken is the package's ValidToken, for the dispatcher and device
// registration.
func (*Channel) ValidToken(s string) bool { return ValidToken(s) }

// Canonical is the token in lowercase hex: APNs takes either case, and
// apps print it in either (a Data's description, a hex encoding of their
// own).
func (*Channel) Canonical(s string) string { return strings.ToLower(s) }

var _ channel.Registrar = (*Channel)(nil)
