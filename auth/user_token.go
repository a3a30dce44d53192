package auth

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// ErrNoRole: the user's token is valid but lacks the role a route needs (answer 403).
var ErrNoRole = errors.New("token lacks the required role")

// userAlgorithms are the signing algorithms user tokens may use.
var userAlgorithms = []string{jwt.SigningMethodRS256.Alg(), jwt.SigningMethodES256.Alg()}

// User is the caller a verified OIDC token names.
type User struct {
	// ID is the value of the configured user claim (sub, or oid for Microsoft Entra).
	ID    string
	Roles []string
}

// HasRole reports whether the user holds role.
func (u User) HasRole(role string) bool { return slices.Contains(u.Roles, role) }

// UserVerifierConfig configures OIDC bearer token checks.
type UserVerifierConfig struct {
	// JWKSURL is where the issuer publishes its signing keys. Required.
	JWKSURL string
	// Issuer is the exact iss the tokens must carry. Required.
	Issuer string
	// Audience is one value the aud claim must contain. Required.
	Audience string
	// UserClaim names the claim holding the user id. Default "sub".
	UserClaim string
	// RolesClaim names the claim holding the user's roles (a list, or a
	// space-separated string). Default "roles".
	RolesClaim string
	// Leeway is the clock skew tolerated on exp, nbf and iat. Default 30s.
	Leeway time.Duration
	// RefreshInterval is how often the JWKS is fetched again. Default 1h.
	RefreshInterval time.Duration
	// UnknownKIDRefresh is the least time between fetches caused by tokens with
	// an unknown kid (key rotation), so that forged kids cannot flood the issuer. Default 30s.
	UnknownKIDRefresh time.Duration
	// HTTPClient fetches the JWKS. Default a client with a 10s timeout.
	HTTPClient *http.Client
	// Logger receives refresh errors. Default slog.Default().
	Logger *slog.Logger
}

// Validate reports the first setting a user must fix.
func (c UserVerifierConfig) Validate() error {
	switch {
	case c.JWKSURL == "":
		return errors.New("the JWKS URL (--jwks-url) is required to check user tokens")
	case c.Issuer == "":
		return errors.New("the OIDC issuer (--oidc-issuer) is required to check user tokens")
	case c.Audience == "":
		return errors.New("the OIDC audience (--oidc-audience) is required to check user tokens")
	}
	return nil
}

// UserVerifier checks OIDC bearer tokens (RS256 or ES256) against the issuer's
// JWKS. A token's key must be named by kid; the algorithm is pinned by the
// key's type, so a token cannot choose how it is checked (no "none", no HS256
// signed with a public key).
type UserVerifier struct {
	cfg    UserVerifierConfig
	keys   keyfunc.Keyfunc
	parser *jwt.Parser
	cancel context.CancelFunc
}

// NewUserVerifier starts fetching the JWKS in the background. Close stops it.
// An unreachable JWKS does not fail start-up; tokens are refused until it answers.
func NewUserVerifier(cfg UserVerifierConfig) (*UserVerifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.UserClaim = cmp.Or(cfg.UserClaim, "sub")
	cfg.RolesClaim = cmp.Or(cfg.RolesClaim, "roles")
	cfg.Leeway = cmp.Or(cfg.Leeway, Leeway)
	cfg.RefreshInterval = cmp.Or(cfg.RefreshInterval, time.Hour)
	cfg.UnknownKIDRefresh = cmp.Or(cfg.UnknownKIDRefresh, 30*time.Second)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("component", "auth")
	ctx, cancel := context.WithCancel(context.Background())
	keys, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{
		Client:            cfg.HTTPClient,
		RefreshInterval:   cfg.RefreshInterval,
		RefreshUnknownKID: rate.NewLimiter(rate.Every(cfg.UnknownKIDRefresh), 1),
		// jwkset bounds both the wait for the refresh limiter and the refresh
		// request itself by this one timeout, so it must fit a JWKS fetch. A
		// request whose refresh is more than this away is refused at once.
		RateLimitWaitMax: 5 * time.Second,
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(_ context.Context, err error) { log.Warn("refresh JWKS", "url", u, "err", err) }
		},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("JWKS at %s: %w", cfg.JWKSURL, err)
	}
	return &UserVerifier{
		cfg:  cfg,
		keys: keys,
		parser: jwt.NewParser(
			jwt.WithValidMethods(userAlgorithms),
			jwt.WithIssuer(cfg.Issuer),
			jwt.WithAudience(cfg.Audience),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(cfg.Leeway),
		),
		cancel: cancel,
	}, nil
}

// Close stops the background JWKS refresh.
func (v *UserVerifier) Close() { v.cancel() }

// Verify checks token and returns the user it names.
func (v *UserVerifier) Verify(ctx context.Context, token string) (User, error) {
	claims := jwt.MapClaims{}
	keyFor := v.keys.KeyfuncCtx(ctx)
	_, err := v.parser.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		if _, ok := t.Header["kid"].(string); !ok {
			return nil, errNoKeyID
		}
		key, err := keyFor(t)
		if err != nil {
			// Not in the key set, and a refresh did not bring it (or was
			// not allowed yet: unknown ids refresh at a limited rate).
			return nil, fmt.Errorf("%w: %w", errUnknownKey, err)
		}
		// Pin the algorithm to the key's type.
		switch k := key.(type) {
		case *rsa.PublicKey:
			if t.Method != jwt.SigningMethodRS256 {
				return nil, fmt.Errorf("RSA key used with %s", t.Method.Alg())
			}
		case *ecdsa.PublicKey:
			if t.Method != jwt.SigningMethodES256 || k.Curve != elliptic.P256() {
				return nil, fmt.Errorf("EC key used with %s", t.Method.Alg())
			}
		default:
			return nil, fmt.Errorf("unsupported key type %T", key)
		}
		return key, nil
	})
	if err != nil {
		if errors.Is(err, jwt.ErrTokenSignatureInvalid) {
			// Also what the parser says of an algorithm it does not take
			// (HS256, none): tell that apart, from the unverified header.
			if t, _, perr := jwt.NewParser().ParseUnverified(token, jwt.MapClaims{}); perr == nil && !slices.Contains(userAlgorithms, t.Method.Alg()) {
				return User{}, fmt.Errorf("%w: %w %s", ErrBadToken, errAlgorithm, t.Method.Alg())
			}
		}
		return User{}, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	id, _ := claims[v.cfg.UserClaim].(string)
	if strings.TrimSpace(id) == "" {
		return User{}, fmt.Errorf("%w: %w", ErrBadToken, &missingClaimError{v.cfg.UserClaim})
	}
	return User{ID: id, Roles: rolesOf(claims[v.cfg.RolesClaim])}, nil
}

// Authorize verifies the request's bearer token; with a role, it also requires it.
func (v *UserVerifier) Authorize(r *http.Request, role string) (User, error) {
	token, err := BearerToken(r)
	if err != nil {
		return User{}, err
	}
	u, err := v.Verify(r.Context(), token)
	if err != nil {
		return User{}, err
	}
	if role != "" && !u.HasRole(role) {
		return u, fmt.Errorf("%w %q", ErrNoRole, role)
	}
	return u, nil
}

func rolesOf(v any) []string {
	switch t := v.(type) {
	case string:
		return strings.Fields(t)
	case []any:
		roles := make([]string, 0, len(t))
		for _, r := range t {
			if s, ok := r.(string); ok {
				roles = append(roles, s)
			}
		}
		return roles
	}
	return nil
}
