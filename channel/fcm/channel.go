package fcm

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2/jwt"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/sendtrace"
)

// DefaultEndpoint is FCM's API.
const DefaultEndpoint = "https://fcm.googleapis.com"

const (
	// maxBatch is the most messages a Send takes: FCM's old batch limit,
	// which keeps a Send's wait for the semaphore reasonable.
	maxBatch = 500
	// maxAnswer is the most of an answer's body read.
	maxAnswer = 64 << 10
)

// Config configures a Channel.
type Config struct {
	// CredentialsFile is the service account key file
	// (--fcm-credentials-file): its key signs the grants that buy access
	// tokens. Exactly one of CredentialsFile and Credentials.
	CredentialsFile string
	// Credentials is a key file's contents, in place of CredentialsFile.
	Credentials []byte
	// ProjectID is the Firebase project sent for. Default the key file's
	// project_id.
	ProjectID string
	// Endpoint is the base URL of FCM's API. Default DefaultEndpoint; a
	// fake's (fcmtest) in tests.
	Endpoint string
	// HTTPClient sends to FCM and to the token endpoint; it is copied and
	// never follows a redirect. Default a client of the Channel's own:
	// HTTP/2 (one connection multiplexes many requests),
	// a ping after 30 s of silence so that a dead connection is found
	// within 40 s, and Timeout per request.
	HTTPClient *http.Client
	// Concurrency caps requests in flight, across all Sends. Default 100,
	// the streams Google's servers commonly allow an HTTP/2 connection.
	Concurrency int
	// Timeout bounds a request, from dial to answer, and a token fetch.
	// Default 10s.
	Timeout time.Duration
	// DefaultTTL is how long FCM keeps a message whose Expires is zero
	// for a device that is offline. Default 24h.
	DefaultTTL time.Duration
	// TokenRefresh is how long before its access token expires a new one
	// is fetched, so that none expires on its way. Default 5m (Google's
	// tokens last an hour).
	TokenRefresh time.Duration
	// Clock tells the time for TTLs and Retry-After dates. Default the
	// wall clock.
	Clock clock.Clock
}

// Validate reports what in cfg cannot work, in words an operator can act on.
func (cfg Config) Validate() error {
	var errs []error
	if (cfg.CredentialsFile == "") == (len(cfg.Credentials) == 0) {
		errs = append(errs, errors.New("fcm: set --fcm-credentials-file (Config.CredentialsFile or Credentials, not both) to a service account key file"))
	}
	if cfg.Endpoint != "" {
		if u, err := url.Parse(cfg.Endpoint); err != nil || u.Scheme != "https" && u.Scheme != "http" || u.Host == "" {
			errs = append(errs, fmt.Errorf("fcm: endpoint %q: want a URL like %s", cfg.Endpoint, DefaultEndpoint))
		}
	}
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"concurrency", cfg.Concurrency < 0},
		{"timeout", cfg.Timeout < 0},
		{"default TTL", cfg.DefaultTTL < 0},
		{"token refresh", cfg.TokenRefresh < 0},
	} {
		if f.neg {
			errs = append(errs, fmt.Errorf("fcm: %s is negative; 0 is the default", f.name))
		}
	}
	return errors.Join(errs...)
}

// Channel sends messages with FCM's HTTP v1 API, one request per message.
// It is safe for concurrent use.
type Channel struct {
	cfg         Config
	sendURL     string
	client      *http.Client
	tokenClient *http.Client
	transport   *http.Transport // the default client's, closed by Close; nil with Config.HTTPClient
	grant       *jwt.Config
	sem         chan struct{} // a slot per request in flight

	mu     sync.Mutex
	tokens *tokenSource
}

var _ channel.Channel = (*Channel)(nil)

// New checks cfg and its key file and returns a Channel. It fetches no
// token: the first Send does.
func New(cfg Config) (*Channel, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Endpoint = cmp.Or(cfg.Endpoint, DefaultEndpoint)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 100)
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Second)
	cfg.DefaultTTL = cmp.Or(cfg.DefaultTTL, 24*time.Hour)
	cfg.TokenRefresh = cmp.Or(cfg.TokenRefresh, 5*time.Minute)
	cfg.Clock = clock.Or(cfg.Clock)
	sa, err := loadServiceAccount(cfg.CredentialsFile, cfg.Credentials, cfg.ProjectID)
	if err != nil {
		return nil, err
	}

	c := &Channel{
		cfg:     cfg,
		sendURL: strings.TrimSuffix(cfg.Endpoint, "/") + "/v1/projects/" + url.PathEscape(sa.ProjectID) + "/messages:send",
		sem:     make(chan struct{}, cfg.Concurrency),
		grant: &jwt.Config{
			Email:        sa.ClientEmail,
			PrivateKey:   []byte(sa.PrivateKey),
			PrivateKeyID: sa.PrivateKeyID,
			Scopes:       []string{scope},
			TokenURL:     sa.TokenURI,
		},
	}
	if cfg.HTTPClient != nil {
		copied := *cfg.HTTPClient
		c.client = &copied
	} else {
		c.transport = http.DefaultTransport.(*http.Transport).Clone()
		c.transport.MaxIdleConnsPerHost = cfg.Concurrency // over HTTP/1.1 (a proxy, a fake), a connection per request
		c.transport.HTTP2 = &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 10 * time.Second}
		c.client = &http.Client{Transport: c.transport}
	}
	// FCM does not redirect; one elsewhere would take the bearer token along.
	c.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	// A token fetch takes no context: only a client timeout bounds it.
	tc := *c.client
	tc.Timeout = cmp.Or(tc.Timeout, cfg.Timeout)
	c.tokenClient = &tc
	c.tokens = c.newTokenSource()
	return c, nil
}

// Provider is "fcm".
func (c *Channel) Provider() string { return "fcm" }

// MaxBatch is the most messages a Send takes.
func (c *Channel) MaxBatch() int { return maxBatch }

// Close closes the idle connections of the Channel's own client. It is
// safe to call twice.
func (c *Channel) Close() error {
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
	return nil
}

// Send sends each message in its own request, at most Concurrency in
// flight across all Sends, and answers their outcomes in order. All of
// them go with one access token, fetched first (or reused): when there is
// none, each message has the same outcome and no request is made.
func (c *Channel) Send(ctx context.Context, msgs []channel.Message) []channel.Outcome {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return channel.All(len(msgs), notSent(err))
	}
	src := c.currentTokens()
	token, o, ok := c.accessToken(ctx, src)
	if !ok {
		return channel.All(len(msgs), o)
	}
	out := make([]channel.Outcome, len(msgs))
	var wg sync.WaitGroup
	for i := range msgs {
		select {
		case c.sem <- struct{}{}:
		case <-ctx.Done():
			for j := i; j < len(msgs); j++ {
				out[j] = notSent(ctx.Err())
			}
			wg.Wait()
			return out
		}
		wg.Go(func() {
			defer func() { <-c.sem }()
			out[i] = c.send(ctx, src, token, msgs[i])
		})
	}
	wg.Wait()
	return out
}

// send makes m's request. Whether FCM may have received it whole
// (sendtrace) tells a request FCM never had (a dial or TLS error, a
// connection that broke as it was written: RetryAfter, or NotSent when ctx
// had ended) from one it may have taken (no answer after it was written,
// or a timeout while it was being written: Unknown), erring towards at
// most once.
func (c *Channel) send(ctx context.Context, src *tokenSource, token string, m channel.Message) channel.Outcome {
	if err := ctx.Err(); err != nil {
		return notSent(err)
	}
	body, err := c.body(m)
	if err != nil {
		return channel.Outcome{Kind: channel.Failed, Reason: "FCM message not sent: " + err.Error()}
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	rctx, trace := sendtrace.With(rctx)
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, c.sendURL, bytes.NewReader(body))
	if err != nil {
		return channel.Outcome{Kind: channel.Failed, Reason: "FCM message not sent: " + err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json; charset=UTF-8")
	resp, err := c.client.Do(req)
	switch {
	case err != nil && trace.MaybeReceived():
		return channel.Outcome{Kind: channel.Unknown, Reason: fmt.Sprintf("FCM gave no answer: %v (it may have been delivered)", err)}
	case err != nil && ctx.Err() != nil:
		return notSent(ctx.Err())
	case err != nil:
		return channel.Outcome{Kind: channel.RetryAfter, Reason: fmt.Sprintf("FCM request not sent: %v", err)}
	}
	defer resp.Body.Close()
	// Read to its end, so that the connection is used again; an answer
	// cut short still has its status.
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	o, unauthenticated := c.answer(resp.StatusCode, resp.Header, b)
	switch {
	case unauthenticated:
		// A first refusal of a token heals with the next one: no alert.
		o.Credentials = src.afterRefusal.Load()
		c.forget(src)
	case resp.StatusCode < 300:
		src.afterRefusal.Store(false)
	}
	return o
}

func notSent(err error) channel.Outcome {
	return channel.Outcome{Kind: channel.NotSent, Reason: "not sent: " + err.Error()}
}

// Canonical is the token as it is: registration tokens are case-sensitive.
func (*Channel) Canonical(s string) string { return s }

var _ channel.Registrar = (*Channel)(nil)
