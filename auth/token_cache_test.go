package auth_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/oidctest"
)

// publisher serves a chosen part of an oidctest issuer's keys as the JWKS,
// so that a test can stop publishing one, as an issuer does at the end of
// a rotation.
type publisher struct {
	iss    *oidctest.Issuer
	url    string
	mu     sync.Mutex
	kids   []string
	server *httptest.Server
}

func newPublisher(t *testing.T, iss *oidctest.Issuer, kids ...string) *publisher {
	p := &publisher{iss: iss, kids: kids}
	p.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		var jwks []devauth.JWK
		for _, kid := range p.kids {
			jwk, err := devauth.PublicJWK(kid, &iss.Key(kid).(*ecdsa.PrivateKey).PublicKey)
			if err != nil {
				t.Error(err)
			}
			jwks = append(jwks, jwk)
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(devauth.JWKSet(jwks...))
	}))
	t.Cleanup(p.server.Close)
	p.url = p.server.URL
	return p
}

// publish makes kids the whole key set served from now on.
func (p *publisher) publish(kids ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kids = kids
}

func cachingVerifier(t *testing.T, iss *oidctest.Issuer, jwksURL string, cfg auth.UserVerifierConfig) *auth.UserVerifier {
	t.Helper()
	cfg.JWKSURL, cfg.Issuer, cfg.Audience = jwksURL, iss.URL(), oidctest.Audience
	cfg.Logger = slog.New(slog.DiscardHandler)
	v, err := auth.NewUserVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

// verified verifies token and wants it accepted for user.
func verified(t *testing.T, v *auth.UserVerifier, token, user string) {
	t.Helper()
	u, err := v.Verify(context.Background(), token)
	if err != nil || u.ID != user {
		t.Fatalf("Verify = %+v, %v; want %s", u, err, user)
	}
}

func TestARepeatedTokenIsAnsweredFromTheCacheWithItsUserAndRoles(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := cachingVerifier(t, iss, iss.JWKSURL(), auth.UserVerifierConfig{})
	token := iss.Token("u_1", "admin")
	for range 3 {
		u, err := v.Verify(context.Background(), token)
		if err != nil || u.ID != "u_1" || !u.HasRole("admin") {
			t.Fatalf("Verify = %+v, %v", u, err)
		}
	}
	if s := v.TokenCacheStats(); s.Hits != 2 || s.Misses != 1 || s.Entries != 1 {
		t.Errorf("stats = %+v; want the first verified and the two after answered from the cache", s)
	}
	verified(t, v, iss.Token("u_2"), "u_2")
	if s := v.TokenCacheStats(); s.Hits != 2 || s.Misses != 2 {
		t.Errorf("stats after another token = %+v; want it verified", s)
	}
}

func TestRefusedTokensAreNeverCached(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := cachingVerifier(t, iss, iss.JWKSURL(), auth.UserVerifierConfig{})
	expired := iss.Claims("u_1")
	expired["exp"] = time.Now().Add(-time.Hour).Unix()
	for _, token := range []string{iss.Sign(expired), tamperSignature(iss.Token("u_1")), "not-a-jwt"} {
		for range 2 {
			if _, err := v.Verify(context.Background(), token); !errors.Is(err, auth.ErrBadToken) {
				t.Fatalf("Verify = %v; want ErrBadToken", err)
			}
		}
	}
	if s := v.TokenCacheStats(); s.Hits != 0 || s.Entries != 0 {
		t.Errorf("stats = %+v; want nothing kept and nothing answered from the cache", s)
	}
}

func TestACachedTokenIsRefusedOnceItExpires(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	clk := clock.NewFake(time.Now())
	v := cachingVerifier(t, iss, iss.JWKSURL(), auth.UserVerifierConfig{Clock: clk})
	c := iss.Claims("u_1")
	c["exp"] = clk.Now().Add(time.Minute).Unix()
	token := iss.Sign(c)
	verified(t, v, token, "u_1")

	clk.Advance(time.Minute + auth.Leeway - 2*time.Second) // within the leeway
	verified(t, v, token, "u_1")
	if s := v.TokenCacheStats(); s.Hits != 1 {
		t.Fatalf("stats = %+v; want the token answered from the cache within its leeway", s)
	}
	clk.Advance(3 * time.Second)
	_, err := v.Verify(context.Background(), token)
	if !errors.Is(err, auth.ErrBadToken) || !strings.Contains(auth.Reason(err), "expired") {
		t.Errorf("a cached token past exp and the leeway = %v (%q); want it refused as expired", err, auth.Reason(err))
	}
	if s := v.TokenCacheStats(); s.Hits != 1 {
		t.Errorf("stats = %+v; want no hit past exp", s)
	}
}

func TestACachedTokenIsRefusedOnceTheIssuerDropsItsKey(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	old, kept := iss.AddECKey(), iss.AddECKey()
	jwks := newPublisher(t, iss, old, kept)
	// Each new kid fetches the key set again at once.
	v := cachingVerifier(t, iss, jwks.url, auth.UserVerifierConfig{UnknownKIDRefresh: time.Nanosecond})
	byOld := iss.SignWith(old, iss.Key(old), iss.Claims("u_old"))
	byKept := iss.SignWith(kept, iss.Key(kept), iss.Claims("u_kept"))
	verified(t, v, byOld, "u_old")
	verified(t, v, byKept, "u_kept")

	// A key added moves nothing: the cached tokens still answer from it.
	added := iss.AddECKey()
	jwks.publish(old, kept, added)
	verified(t, v, iss.SignWith(added, iss.Key(added), iss.Claims("u_new")), "u_new") // an unknown kid: the JWKS is fetched again
	hits := v.TokenCacheStats().Hits
	verified(t, v, byOld, "u_old")
	if got := v.TokenCacheStats().Hits; got != hits+1 {
		t.Errorf("hits = %d; want the token by a key still published answered from the cache after a key was added", got)
	}

	// The rotation ends: the issuer drops the old key, and the next fetch sees it.
	newest := iss.AddECKey()
	jwks.publish(kept, added, newest)
	verified(t, v, iss.SignWith(newest, iss.Key(newest), iss.Claims("u_newest")), "u_newest")
	_, err := v.Verify(context.Background(), byOld)
	if !errors.Is(err, auth.ErrBadToken) || !strings.Contains(auth.Reason(err), "key the issuer does not publish") {
		t.Errorf("a cached token whose key was dropped = %v (%q); want it refused", err, auth.Reason(err))
	}
	// A token by a key still published is checked again, and passes.
	verified(t, v, byKept, "u_kept")
}

func TestTheTokenCacheNeverHoldsMoreThanItsBound(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := cachingVerifier(t, iss, iss.JWKSURL(), auth.UserVerifierConfig{CachedTokens: 3})
	var tokens []string
	for i := range 10 {
		tokens = append(tokens, iss.Token("u_"+string(rune('a'+i))))
		verified(t, v, tokens[i], "u_"+string(rune('a'+i)))
		if s := v.TokenCacheStats(); s.Entries > 3 {
			t.Fatalf("after %d tokens the cache holds %d; want at most 3", i+1, s.Entries)
		}
	}
	before := v.TokenCacheStats()
	for _, tok := range tokens[7:] { // the three newest
		_, _ = v.Verify(context.Background(), tok)
	}
	_, _ = v.Verify(context.Background(), tokens[0]) // the oldest, long forgotten
	after := v.TokenCacheStats()
	if after.Hits-before.Hits != 3 || after.Misses-before.Misses != 1 || after.Entries != 3 {
		t.Errorf("stats %+v → %+v; want the three newest answered from the cache, the oldest verified again, 3 kept", before, after)
	}
}

func TestANegativeCacheSizeVerifiesEveryToken(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := cachingVerifier(t, iss, iss.JWKSURL(), auth.UserVerifierConfig{CachedTokens: -1})
	token := iss.Token("u_1")
	verified(t, v, token, "u_1")
	verified(t, v, token, "u_1")
	if s := v.TokenCacheStats(); s != (auth.TokenCacheStats{}) {
		t.Errorf("stats = %+v; want none", s)
	}
}

func TestConcurrentRequestsShareTheCache(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := cachingVerifier(t, iss, iss.JWKSURL(), auth.UserVerifierConfig{CachedTokens: 4})
	tokens := []string{iss.Token("u_0"), iss.Token("u_1"), iss.Token("u_2"), iss.Token("u_3"), iss.Token("u_4"), iss.Token("u_5")}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				n := (g + i) % len(tokens)
				if u, err := v.Verify(context.Background(), tokens[n]); err != nil || u.ID != "u_"+string(rune('0'+n)) {
					t.Errorf("Verify = %+v, %v", u, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if s := v.TokenCacheStats(); s.Entries > 4 || s.Hits+s.Misses != 400 {
		t.Errorf("stats = %+v; want at most 4 kept and every request counted", s)
	}
}
