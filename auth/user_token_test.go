package auth_test

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/oidctest"
)

func newVerifier(t *testing.T, iss *oidctest.Issuer, cfg auth.UserVerifierConfig) *auth.UserVerifier {
	t.Helper()
	cfg.JWKSURL, cfg.Issuer, cfg.Audience = iss.JWKSURL(), iss.URL(), oidctest.Audience
	cfg.Logger = slog.New(slog.DiscardHandler)
	v, err := auth.NewUserVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

func TestValidTokensNameTheUserAndRoles(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := newVerifier(t, iss, auth.UserVerifierConfig{})
	u, err := v.Verify(context.Background(), iss.Token("u_123", "admin", "support"))
	if err != nil {
		t.Fatal(err)
	}
	if u.ID != "u_123" || !u.HasRole("admin") || !u.HasRole("support") {
		t.Errorf("user = %+v", u)
	}
	iss.UseKey("ec-2")
	if u, err := v.Verify(context.Background(), iss.Token("u_ec")); err != nil || u.ID != "u_ec" {
		t.Errorf("ES256 token: %+v, %v", u, err)
	}
}

func TestEntraStyleClaimsAreConfigurable(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := newVerifier(t, iss, auth.UserVerifierConfig{UserClaim: "oid", RolesClaim: "scp"})
	c := iss.Claims("ignored-sub")
	c["oid"] = "00000000-0000-0000-0000-000000000042"
	c["scp"] = "feed.read admin"
	u, err := v.Verify(context.Background(), iss.Sign(c))
	if err != nil {
		t.Fatal(err)
	}
	if u.ID != "00000000-0000-0000-0000-000000000042" || !u.HasRole("admin") {
		t.Errorf("user = %+v", u)
	}
}

func TestTokenAttacksAreRefused(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := newVerifier(t, iss, auth.UserVerifierConfig{})
	rsaKey := iss.Key("rsa-1").(*rsa.PrivateKey)
	pubDER, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})

	with := func(mutate func(jwt.MapClaims)) string {
		c := iss.Claims("u_1")
		mutate(c)
		return iss.Sign(c)
	}
	none := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodNone, iss.Claims("u_1"))
		tok.Header["kid"] = "rsa-1"
		s, _ := tok.SignedString(jwt.UnsafeAllowNoneSignatureType)
		return s
	}
	hsWithPublicKey := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, iss.Claims("u_1"))
		tok.Header["kid"] = "rsa-1"
		s, _ := tok.SignedString(pubPEM)
		return s
	}
	rsaKeyAsES := func() string { // an RSA kid with an ES256 signature from another key
		tok := jwt.NewWithClaims(jwt.SigningMethodES256, iss.Claims("u_1"))
		tok.Header["kid"] = "rsa-1"
		s, _ := tok.SignedString(iss.Key("ec-2"))
		return s
	}
	noKID := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, iss.Claims("u_1"))
		s, _ := tok.SignedString(rsaKey)
		return s
	}
	for _, tc := range []struct{ name, token, reason string }{
		{"alg none", none(), "an algorithm this API does not accept"},
		{"HS256 signed with the RSA public key", hsWithPublicKey(), "an algorithm this API does not accept"},
		{"an RSA key's kid on an ES256 token", rsaKeyAsES(), ""},
		{"expired", with(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }), "expired"},
		{"no expiry", with(func(c jwt.MapClaims) { delete(c, "exp") }), "lacks a required claim"},
		{"not yet valid", with(func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() }), "not valid yet"},
		{"issued in the future", with(func(c jwt.MapClaims) { c["iat"] = time.Now().Add(time.Hour).Unix() }), "not valid yet"},
		{"wrong issuer", with(func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }), "another issuer"},
		{"wrong audience", with(func(c jwt.MapClaims) { c["aud"] = "another-app" }), "another audience"},
		{"missing user claim", with(func(c jwt.MapClaims) { delete(c, "sub") }), `lacks the "sub" claim`},
		{"unknown kid", iss.SignWith("forged-kid", rsaKey, iss.Claims("u_1")), "key the issuer does not publish"},
		// Right after: the key set may not be fetched again so soon, which
		// must still read as an unknown key.
		{"another unknown kid at once", iss.SignWith("forged-kid-2", rsaKey, iss.Claims("u_1")), "key the issuer does not publish"},
		{"no kid", noKID(), "names no signing key"},
		{"garbage", "not-a-jwt", "not a well-formed JWT"},
		{"a tampered signature", tamperSignature(iss.Token("u_1")), "signature does not verify"},
		{"a tampered payload", iss.Token("u_1")[:40] + "x" + iss.Token("u_1")[41:], ""},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), tc.token)
			if !errors.Is(err, auth.ErrBadToken) {
				t.Errorf("Verify = %v; want ErrBadToken", err)
			}
			reason := auth.Reason(err)
			if tc.reason != "" && !strings.Contains(reason, tc.reason) {
				t.Errorf("Reason = %q, want it to say %q", reason, tc.reason)
			}
			if strings.Contains(reason, tc.token) {
				t.Errorf("Reason repeats the token")
			}
		})
	}
}

func TestSmallClockSkewIsTolerated(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := newVerifier(t, iss, auth.UserVerifierConfig{})
	c := iss.Claims("u_1")
	c["exp"] = time.Now().Add(-10 * time.Second).Unix()
	c["nbf"] = time.Now().Add(10 * time.Second).Unix()
	if _, err := v.Verify(context.Background(), iss.Sign(c)); err != nil {
		t.Errorf("10s of skew refused: %v", err)
	}
}

func TestRotatedKeysAreFetchedOnFirstSightAtALimitedRate(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	v := newVerifier(t, iss, auth.UserVerifierConfig{UnknownKIDRefresh: time.Hour})
	if _, err := v.Verify(context.Background(), iss.Token("u_1")); err != nil {
		t.Fatal(err)
	}
	before := iss.Fetches.Load()
	iss.UseKey(iss.AddECKey()) // the issuer rotates
	if _, err := v.Verify(context.Background(), iss.Token("u_1")); err != nil {
		t.Fatalf("token signed with the rotated-in key: %v", err)
	}
	if iss.Fetches.Load() != before+1 {
		t.Errorf("JWKS fetched %d times for the new kid, want once", iss.Fetches.Load()-before)
	}
	// Forged kids cannot make it fetch again within the interval.
	for range 5 {
		if _, err := v.Verify(context.Background(), iss.SignWith("forged", iss.Key("rsa-1"), iss.Claims("u_1"))); err == nil {
			t.Fatal("forged kid accepted")
		}
	}
	if iss.Fetches.Load() != before+1 {
		t.Errorf("forged kids caused %d more fetches; want none within the refresh interval", iss.Fetches.Load()-before-1)
	}
}

func TestServiceTokensNeedTheirScope(t *testing.T) {
	t.Parallel()
	secret := []byte("a-service-secret-of-at-least-32-bytes!")
	v, err := auth.NewServiceVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := auth.SignServiceToken(secret, "billing", []string{"prefs:read", "push:emit"}, time.Now(), time.Minute)
	c, err := v.Verify(tok)
	if err != nil || c.Subject != "billing" || !c.HasScope("push:emit") || c.HasScope("admin") {
		t.Errorf("claims = %+v, %v", c, err)
	}
	if _, err := auth.NewServiceVerifier([]byte("short")); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
	forever, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "billing", "scope": "push:emit"}).SignedString(secret)
	expired, _ := auth.SignServiceToken(secret, "billing", []string{"push:emit"}, time.Now(), -time.Hour)
	otherSecret, _ := auth.SignServiceToken([]byte("another-service-secret-of-32-bytes!!"), "billing", []string{"push:emit"}, time.Now(), time.Minute)
	for _, tc := range []struct{ name, token, reason string }{
		{"without exp", forever, "lacks a required claim"},
		{"expired", expired, "has expired"},
		{"signed with another secret", otherSecret, "signature does not verify"},
	} {
		_, err := v.Verify(tc.token)
		if !errors.Is(err, auth.ErrBadToken) || !strings.Contains(auth.Reason(err), tc.reason) {
			t.Errorf("a service token %s = %v, reason %q; want ErrBadToken saying %q", tc.name, err, auth.Reason(err), tc.reason)
		}
	}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
	if _, err := auth.BearerToken(r); !strings.Contains(auth.Reason(err), "not a Bearer token") {
		t.Errorf("Basic credentials = %v, reason %q; want it to say they are not a Bearer token", err, auth.Reason(err))
	}
}

// tamperSignature flips a character in the token's signature.
func tamperSignature(tok string) string {
	i := len(tok) - 10
	c := byte('A')
	if tok[i] == 'A' {
		c = 'B'
	}
	return tok[:i] + string(c) + tok[i+1:]
}
