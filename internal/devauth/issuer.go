// Package devauth mints the tokens of the local dev stack: user tokens from a
// signing key kept in a file, served as a JWKS, so that `spoolcast dev token`
// in another process mints tokens the running stack accepts. Never for
// production: there, an OIDC provider issues user tokens.
package devauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Issuer is the local OIDC issuer of `spoolcast dev`: one ES256 key kept in a file.
type Issuer struct {
	key      *ecdsa.PrivateKey
	kid      string
	Issuer   string
	Audience string
}

// LoadIssuer reads the signing key at keyPath, creating it if missing.
func LoadIssuer(keyPath, issuer, audience string) (*Issuer, error) {
	var key *ecdsa.PrivateKey
	b, err := os.ReadFile(keyPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(keyPath), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, fmt.Errorf("write dev signing key: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("read dev signing key: %w", err)
	default:
		block, _ := pem.Decode(b)
		if block == nil {
			return nil, fmt.Errorf("dev signing key %s is not PEM", keyPath)
		}
		parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("dev signing key %s: %w", keyPath, err)
		}
		var ok bool
		if key, ok = parsed.(*ecdsa.PrivateKey); !ok {
			return nil, fmt.Errorf("dev signing key %s is not an EC key", keyPath)
		}
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(pub)
	return &Issuer{key: key, kid: base64.RawURLEncoding.EncodeToString(sum[:12]), Issuer: issuer, Audience: audience}, nil
}

// JWKS serves the issuer's public key set.
func (d *Issuer) JWKS() http.Handler {
	jwk, _ := PublicJWK(d.kid, &d.key.PublicKey)
	doc := JWKSet(jwk)
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(doc)
	})
}

// Mint signs a user token valid for ttl.
func (d *Issuer) Mint(user string, roles []string, ttl time.Duration) (string, error) {
	now := time.Now()
	claims := jwt.MapClaims{
		"iss": d.Issuer, "aud": d.Audience, "sub": user,
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(ttl).Unix(),
	}
	if len(roles) > 0 {
		claims["roles"] = roles
	}
	t := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	t.Header["kid"] = d.kid
	return t.SignedString(d.key)
}
