// Package oidctest is a small OIDC issuer for tests: it serves a real JWKS over
// HTTP on loopback, signs RS256 and ES256 tokens, rotates keys, and counts JWKS
// fetches so tests can see refreshes. It can also fail, as a real issuer can.
package oidctest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/spoolcast/spoolcast/internal/devauth"
)

// Audience is the audience the issuer's tokens carry by default.
const Audience = "spoolcast-test"

// Issuer is a running test issuer.
type Issuer struct {
	t       testing.TB
	server  *httptest.Server
	mu      sync.Mutex
	keys    map[string]any // kid → private key
	current string         // kid that signs new tokens
	seq     int
	Fetches atomic.Int64
	Down    atomic.Bool // when set, the JWKS endpoint answers 503
}

// New starts an issuer with one RSA key (signing) and one EC key.
func New(t testing.TB) *Issuer {
	t.Helper()
	iss := &Issuer{t: t, keys: map[string]any{}}
	iss.server = httptest.NewServer(http.HandlerFunc(iss.serveJWKS))
	t.Cleanup(iss.server.Close)
	iss.AddRSAKey()
	iss.AddECKey()
	iss.UseKey("rsa-1")
	return iss
}

// URL is the issuer identifier (iss).
func (iss *Issuer) URL() string { return iss.server.URL }

// JWKSURL is where the key set is served.
func (iss *Issuer) JWKSURL() string { return iss.server.URL + "/jwks.json" }

func (iss *Issuer) serveJWKS(w http.ResponseWriter, r *http.Request) {
	iss.Fetches.Add(1)
	if iss.Down.Load() {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	iss.mu.Lock()
	var jwks []devauth.JWK
	for kid, k := range iss.keys {
		var pub any
		switch key := k.(type) {
		case *rsa.PrivateKey:
			pub = &key.PublicKey
		case *ecdsa.PrivateKey:
			pub = &key.PublicKey
		}
		jwk, err := devauth.PublicJWK(kid, pub)
		if err != nil {
			iss.t.Error(err)
		}
		jwks = append(jwks, jwk)
	}
	iss.mu.Unlock()
	w.Header().Set("Content-Type", "application/jwk-set+json")
	_, _ = w.Write(devauth.JWKSet(jwks...))
}

// AddRSAKey publishes a new RSA key and returns its kid.
func (iss *Issuer) AddRSAKey() string {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		iss.t.Fatal(err)
	}
	return iss.add("rsa", k)
}

// AddECKey publishes a new P-256 key and returns its kid.
func (iss *Issuer) AddECKey() string {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		iss.t.Fatal(err)
	}
	return iss.add("ec", k)
}

func (iss *Issuer) add(kind string, k any) string {
	iss.mu.Lock()
	defer iss.mu.Unlock()
	iss.seq++
	kid := fmt.Sprintf("%s-%d", kind, iss.seq)
	iss.keys[kid] = k
	return kid
}

// UseKey makes kid sign new tokens.
func (iss *Issuer) UseKey(kid string) {
	iss.mu.Lock()
	defer iss.mu.Unlock()
	iss.current = kid
}

// Key returns the private key published under kid.
func (iss *Issuer) Key(kid string) any {
	iss.mu.Lock()
	defer iss.mu.Unlock()
	return iss.keys[kid]
}

// Claims returns valid claims for user, to be altered by attack tests.
func (iss *Issuer) Claims(user string, roles ...string) jwt.MapClaims {
	now := time.Now()
	c := jwt.MapClaims{"iss": iss.URL(), "aud": Audience, "sub": user, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	if len(roles) > 0 {
		c["roles"] = roles
	}
	return c
}

// Token signs a valid token for user with the current key.
func (iss *Issuer) Token(user string, roles ...string) string {
	return iss.Sign(iss.Claims(user, roles...))
}

// Sign signs claims with the current key, naming it by kid.
func (iss *Issuer) Sign(claims jwt.MapClaims) string {
	iss.mu.Lock()
	kid := iss.current
	key := iss.keys[kid]
	iss.mu.Unlock()
	return iss.SignWith(kid, key, claims)
}

// SignWith signs claims with key under kid, choosing the algorithm by key type.
func (iss *Issuer) SignWith(kid string, key any, claims jwt.MapClaims) string {
	var method jwt.SigningMethod
	switch key.(type) {
	case *rsa.PrivateKey:
		method = jwt.SigningMethodRS256
	case *ecdsa.PrivateKey:
		method = jwt.SigningMethodES256
	default:
		iss.t.Fatalf("no signing method for %T", key)
	}
	t := jwt.NewWithClaims(method, claims)
	t.Header["kid"] = kid
	s, err := t.SignedString(key)
	if err != nil {
		iss.t.Fatal(err)
	}
	return s
}
