package apns

import (
	"context"
	"crypto/ecdsa"
	"fmt"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TokenStore keeps one provider token per signing key for a whole
// deployment. Apple refuses a key's token renewed more often than every 20
// minutes (429 TooManyProviderTokenUpdates) and lets one token serve any
// number of provider servers: with a store, one replica signs and every
// replica sends the same token, however many there are.
type TokenStore interface {
	// Token answers the stored token of keyID and teamID and when it was
	// issued. When there is none, it was issued before staleBefore, or it
	// is refused (the bearer APNs answered ExpiredProviderToken to; ""
	// for none), it calls sign and stores what sign answers, one caller at
	// a time across the deployment, so that a token is renewed once
	// however many replicas find it stale together.
	Token(ctx context.Context, keyID, teamID string, staleBefore time.Time, refused string,
		sign func() (bearer string, issuedAt time.Time, err error)) (bearer string, issuedAt time.Time, err error)
}

// Provider tokens' ages: a shared token is renewed once it is
// sharedTokenRenewAge old, past Apple's 20 minutes between renewals and
// well within its hour of validity (and apns2's own 50 minutes, past which
// it would sign one of its own); the store is read at most every
// sharedTokenReadEvery, so that a token another replica renewed early is
// taken up.
const (
	sharedTokenRenewAge  = 40 * time.Minute
	sharedTokenReadEvery = 5 * time.Minute
	sharedTokenTimeout   = 5 * time.Second
)

// sharedToken is a Channel's copy of the deployment's provider token.
type sharedToken struct {
	store         TokenStore
	key           *ecdsa.PrivateKey
	keyID, teamID string

	mu       sync.Mutex // one read of the store at a time
	bearer   string
	issuedAt time.Time
	readAt   time.Time
	refused  string // a bearer APNs called expired, to be replaced at the next read
}

// sign signs a provider token issued at now: ES256, kid the key id, iss
// the team id, iat now, as Apple asks.
func sign(key *ecdsa.PrivateKey, keyID, teamID string, now time.Time) (string, error) {
	t := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": teamID, "iat": now.Unix()})
	t.Header["kid"] = keyID
	s, err := t.SignedString(key)
	if err != nil {
		return "", fmt.Errorf("apns: sign a provider token: %w", err)
	}
	return s, nil
}

// useShared makes c's requests carry the deployment's token, read from the
// store when c's copy is due for it. A store out of reach keeps the copy
// (apns2 signs one of its own only once the copy is 50 minutes old).
func (c *Channel) useShared(ctx context.Context) {
	s := c.shared
	if s == nil {
		return
	}
	now := c.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused == "" && now.Sub(s.readAt) < sharedTokenReadEvery && now.Sub(s.issuedAt) < sharedTokenRenewAge {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sharedTokenTimeout)
	defer cancel()
	bearer, issuedAt, err := s.store.Token(ctx, s.keyID, s.teamID, now.Add(-sharedTokenRenewAge), s.refused, func() (string, time.Time, error) {
		at := c.clock.Now()
		b, err := sign(s.key, s.keyID, s.teamID, at)
		return b, at, err
	})
	if err != nil {
		c.tokenLog.Do(func(suppressed int64) {
			c.log.Warn("the deployment's APNs provider token could not be read; this replica keeps its own copy meanwhile", "err", err, "suppressed", suppressed)
		})
		return
	}
	s.bearer, s.issuedAt, s.readAt, s.refused = bearer, issuedAt, now, ""
	c.token.Lock()
	c.token.Bearer, c.token.IssuedAt = bearer, issuedAt.Unix()
	c.token.Unlock()
}

// refuseShared marks bearer, which APNs answered ExpiredProviderToken to,
// for the store to replace at the next Send's read.
func (s *sharedToken) refuse(bearer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if bearer == "bearer "+s.bearer {
		s.refused = s.bearer
	}
}
