package auth

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/spoolcast/spoolcast/internal/clock"
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
	// CachedTokens is how many verified tokens are kept, by their SHA-256,
	// so that the next request with one skips the signature check: each
	// until its exp, and only while the JWKS still holds the keys that
	// verified it. Full, the one kept longest goes. Default
	// DefaultCachedTokens (10,000); negative keeps none.
	CachedTokens int
	// Logger receives refresh errors. Default slog.Default().
	Logger *slog.Logger
	// Clock tells the time tokens are checked at (exp, nbf, iat, and the
	// cached tokens' validity). Default the wall clock.
	Clock clock.Clock
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
	cfg     UserVerifierConfig
	keys    keyfunc.Keyfunc
	keySet  *keySet
	parser  *jwt.Parser
	checked *tokenCache // nil when CachedTokens is negative
	cancel  context.CancelFunc
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
	cfg.CachedTokens = cmp.Or(cfg.CachedTokens, DefaultCachedTokens)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	log := cfg.Logger.With("component", "auth")
	ctx, cancel := context.WithCancel(context.Background())
	// What keyfunc.NewDefaultOverrideCtx builds, over a key set whose
	// changes the token cache follows.
	keySet := newKeySet()
	remote, err := jwkset.NewStorageFromHTTP(cfg.JWKSURL, jwkset.HTTPClientStorageOptions{
		Client:                    cfg.HTTPClient,
		Ctx:                       ctx,
		NoErrorReturnFirstHTTPReq: true,
		RefreshErrorHandler:       func(_ context.Context, err error) { log.Warn("refresh JWKS", "url", cfg.JWKSURL, "err", err) },
		RefreshInterval:           cfg.RefreshInterval,
		Storage:                   keySet,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("JWKS at %s: %w", cfg.JWKSURL, err)
	}
	storage, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
		HTTPURLs:          map[string]jwkset.Storage{cfg.JWKSURL: remote},
		RefreshUnknownKID: rate.NewLimiter(rate.Every(cfg.UnknownKIDRefresh), 1),
		// jwkset bounds both the wait for the refresh limiter and the refresh
		// request itself by this one timeout, so it must fit a JWKS fetch. A
		// request whose refresh is more than this away is refused at once.
		RateLimitWaitMax: 5 * time.Second,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("JWKS at %s: %w", cfg.JWKSURL, err)
	}
	keys, err := keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: storage})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("JWKS at %s: %w", cfg.JWKSURL, err)
	}
	v := &UserVerifier{
		cfg:    cfg,
		keys:   keys,
		keySet: keySet,
		parser: jwt.NewParser(
			jwt.WithValidMethods(userAlgorithms),
			jwt.WithIssuer(cfg.Issuer),
			jwt.WithAudience(cfg.Audience),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(cfg.Leeway),
			jwt.WithTimeFunc(cfg.Clock.Now),
		),
		cancel: cancel,
	}
	if cfg.CachedTokens > 0 {
		v.checked = newTokenCache(cfg.CachedTokens)
	}
	return v, nil
}

// Close stops the background JWKS refresh.
func (v *UserVerifier) Close() { v.cancel() }

// TokenCacheStats counts the answers of a verifier's cache of verified tokens.
type TokenCacheStats struct {
	// Hits are tokens answered from the cache; Misses, those verified
	// (valid or not).
	Hits, Misses uint64
	// Entries are the tokens kept now.
	Entries int
}

// TokenCacheStats returns the counts of the verifier's token cache; zero
// without one.
func (v *UserVerifier) TokenCacheStats() TokenCacheStats {
	if v.checked == nil {
		return TokenCacheStats{}
	}
	return TokenCacheStats{Hits: v.checked.hits.Load(), Misses: v.checked.misses.Load(), Entries: v.checked.len()}
}

// Verify checks token and returns the user it names: from the cache of
// verified tokens when it holds the token, still valid, under the key set
// that verified it; else by its signature and claims.
func (v *UserVerifier) Verify(ctx context.Context, token string) (User, error) {
	if v.checked == nil {
		u, _, err := v.verify(ctx, token)
		return u, err
	}
	key := sha256.Sum256([]byte(token))
	// Read before the check: a key set that changes during it leaves the
	// entry stale at once.
	generation := v.keySet.generation.Load()
	if u, ok := v.checked.get(key, v.cfg.Clock.Now(), generation); ok {
		return u, nil
	}
	u, valid, err := v.verify(ctx, token)
	if err != nil {
		return User{}, err
	}
	valid.generation = generation
	v.checked.put(key, valid)
	return u, nil
}

// verify checks token's signature and claims, and returns the user it names
// and when that answer holds (for the cache).
func (v *UserVerifier) verify(ctx context.Context, token string) (User, cachedToken, error) {
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
				return User{}, cachedToken{}, fmt.Errorf("%w: %w %s", ErrBadToken, errAlgorithm, t.Method.Alg())
			}
		}
		return User{}, cachedToken{}, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	id, _ := claims[v.cfg.UserClaim].(string)
	if strings.TrimSpace(id) == "" {
		return User{}, cachedToken{}, fmt.Errorf("%w: %w", ErrBadToken, &missingClaimError{v.cfg.UserClaim})
	}
	u := User{ID: id, Roles: rolesOf(claims[v.cfg.RolesClaim])}
	return u, validity(u, claims, v.cfg.Leeway), nil
}

// validity is when a verified token passes the parser's time checks: from
// its nbf and iat, until its exp (required), each with the leeway.
func validity(u User, claims jwt.MapClaims, leeway time.Duration) cachedToken {
	e := cachedToken{user: u}
	if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
		e.notAfter = exp.Add(leeway)
	}
	for _, get := range []func() (*jwt.NumericDate, error){claims.GetNotBefore, claims.GetIssuedAt} {
		if t, err := get(); err == nil && t != nil && t.Add(-leeway).After(e.notBefore) {
			e.notBefore = t.Add(-leeway)
		}
	}
	return e
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
