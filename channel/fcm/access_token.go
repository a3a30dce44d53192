package fcm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"golang.org/x/oauth2"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/retryafter"
)

// scope is the OAuth scope that sending with FCM takes.
const scope = "https://www.googleapis.com/auth/firebase.messaging"

// tokenSource is one cache of access tokens. A Channel replaces its
// source, and so its cached token, when FCM refuses that token.
type tokenSource struct {
	oauth2.TokenSource
	// afterRefusal: this source replaced one whose token FCM refused. A
	// token refused once (revoked, or expired early by a clock ahead of
	// ours) heals with a fresh one; a fresh one refused too is the
	// service account's, an operator's to fix. Cleared by a token taken.
	afterRefusal atomic.Bool
}

// newTokenSource is a cache, refreshed TokenRefresh before the token
// expires, in front of the JWT grant, which fetches with tokenClient.
func (c *Channel) newTokenSource() *tokenSource {
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, c.tokenClient)
	return &tokenSource{TokenSource: oauth2.ReuseTokenSourceWithExpiry(nil, c.grant.TokenSource(ctx), c.cfg.TokenRefresh)}
}

func (c *Channel) currentTokens() *tokenSource {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tokens
}

// forget drops src's token, which FCM refused (revoked, or expired early
// by a clock ahead of ours), so that the next Send fetches another rather
// than being refused with it until it expires. Many requests refused at
// once replace the source once.
func (c *Channel) forget(src *tokenSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tokens == src {
		c.tokens = c.newTokenSource()
		c.tokens.afterRefusal.Store(true)
	}
}

// accessToken is src's token, fetched from the token endpoint when it has
// none still good. oauth2's fetch takes no context (it is bounded by
// tokenClient's timeout), so it runs on its own and a Send whose ctx ends
// first does not wait for it. ok false: the outcome of every message.
func (c *Channel) accessToken(ctx context.Context, src *tokenSource) (token string, o channel.Outcome, ok bool) {
	type result struct {
		t   *oauth2.Token
		err error
	}
	done := make(chan result, 1)
	go func() {
		t, err := src.Token()
		done <- result{t, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return "", c.tokenFailure(r.err), false
		}
		return r.t.AccessToken, channel.Outcome{}, true
	case <-ctx.Done():
		return "", notSent(ctx.Err()), false
	}
}

// tokenFailure is the outcome of messages that had no access token:
// RetryAfter, since nothing was sent; Credentials when the token endpoint
// refused the grant (a 4xx: a deleted key, a disabled account), not when
// it was down or out of reach.
func (c *Channel) tokenFailure(err error) channel.Outcome {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.Response == nil {
		return channel.Outcome{Kind: channel.RetryAfter, Reason: "OAuth token endpoint: " + err.Error()}
	}
	var body struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	_ = json.Unmarshal(re.Body, &body)
	status := re.Response.StatusCode
	reason := fmt.Sprintf("OAuth token endpoint %d", status)
	if body.Error != "" {
		reason += " " + body.Error
	}
	if body.Description != "" {
		reason += ": " + body.Description
	}
	wait, _ := retryafter.Parse(re.Response.Header.Get("Retry-After"), c.cfg.Clock.Now())
	return channel.Outcome{
		Kind:        channel.RetryAfter,
		Wait:        wait,
		Code:        body.Error,
		Reason:      reason,
		Credentials: status >= 400 && status < 500 && status != http.StatusTooManyRequests && status != http.StatusRequestTimeout,
	}
}
