package auth

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Scopes that routes require.
const (
	// ScopeEmit lets a service send events.
	ScopeEmit = "push:emit"
	// ScopeTopics lets a service create topics, open or close them, and
	// change their members.
	ScopeTopics = "topics:manage"
	// ScopePrefsRead is what central's own token carries when it asks the
	// product's API for a user's push preferences: never enough to emit.
	ScopePrefsRead = "prefs:read"
)

// Sentinel errors callers branch on.
var (
	// ErrNoToken: the request carries no bearer token (answer 401).
	ErrNoToken = errors.New("no bearer token")
	// ErrBadToken: the token is malformed, badly signed, expired or not for us (answer 401).
	ErrBadToken = errors.New("invalid bearer token")
	// ErrForbidden: the token is valid but lacks the scope or role (answer 403).
	ErrForbidden = errors.New("token lacks the required scope")
)

// minSecretLen is the shortest HS256 secret accepted: RFC 7518 wants at least
// the hash size, 256 bits.
const minSecretLen = 32

// ServiceClaims are the claims of a verified service token.
type ServiceClaims struct {
	Subject string
	Scopes  []string
}

// HasScope reports whether the token grants scope.
func (c ServiceClaims) HasScope(scope string) bool { return slices.Contains(c.Scopes, scope) }

// ServiceVerifier checks HS256 service tokens against one shared secret. A
// token must carry exp; nbf and iat are checked when present.
type ServiceVerifier struct {
	secret []byte
	parser *jwt.Parser
}

// Leeway is the clock skew tolerated on exp, nbf and iat.
const Leeway = 30 * time.Second

// NewServiceVerifier returns a verifier for tokens signed with secret.
func NewServiceVerifier(secret []byte) (*ServiceVerifier, error) {
	if len(secret) < minSecretLen {
		return nil, fmt.Errorf("service JWT secret is %d bytes; it must be at least %d", len(secret), minSecretLen)
	}
	return &ServiceVerifier{
		secret: secret,
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithExpirationRequired(), // a leaked token must stop working some day
			jwt.WithIssuedAt(),
			jwt.WithLeeway(Leeway),
		),
	}, nil
}

// ReadSecretFile reads a service JWT secret, trimming a trailing newline.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read service JWT secret: %w", err)
	}
	return []byte(strings.TrimRight(string(b), "\r\n")), nil
}

type serviceClaims struct {
	Scope string `json:"scope"`
	jwt.RegisteredClaims
}

// Verify checks the token's signature and times and returns its claims.
func (v *ServiceVerifier) Verify(token string) (ServiceClaims, error) {
	var claims serviceClaims
	_, err := v.parser.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return v.secret, nil })
	if err != nil {
		return ServiceClaims{}, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	return ServiceClaims{Subject: claims.Subject, Scopes: strings.Fields(claims.Scope)}, nil
}

// Authorize verifies the request's bearer token and requires scope.
func (v *ServiceVerifier) Authorize(r *http.Request, scope string) (ServiceClaims, error) {
	token, err := BearerToken(r)
	if err != nil {
		return ServiceClaims{}, err
	}
	claims, err := v.Verify(token)
	if err != nil {
		return ServiceClaims{}, err
	}
	if !claims.HasScope(scope) {
		return claims, fmt.Errorf("%w %q", ErrForbidden, scope)
	}
	return claims, nil
}

// SignServiceToken mints an HS256 service token issued at now and valid for
// ttl: what a sibling service sends to /internal routes, and what central
// sends to the services it calls.
func SignServiceToken(secret []byte, subject string, scopes []string, now time.Time, ttl time.Duration) (string, error) {
	claims := serviceClaims{
		Scope: strings.Join(scopes, " "),
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   subject,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}

// BearerToken returns the token of an "Authorization: Bearer" header.
func BearerToken(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", ErrNoToken
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", fmt.Errorf("%w: %w", ErrBadToken, errNotBearer)
	}
	return strings.TrimSpace(token), nil
}

// Challenge is the WWW-Authenticate value for a 401 or 403 caused by err.
func Challenge(err error) string {
	switch {
	case errors.Is(err, ErrForbidden), errors.Is(err, ErrNoRole):
		return `Bearer error="insufficient_scope"`
	case errors.Is(err, ErrBadToken):
		return `Bearer error="invalid_token"`
	default:
		return `Bearer`
	}
}
