package auth

import (
	"errors"
	"fmt"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

// Reason says in a few words why a token was refused, for a 401's detail
// and the log: what the caller can act on, never the token itself.
func Reason(err error) string {
	var missing *missingClaimError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNoToken):
		return "no bearer token was sent"
	case errors.Is(err, jwt.ErrTokenExpired):
		return "the token has expired: get a new one"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "the token is not valid yet: check the issuer's clock"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "the token is for another audience than this API"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "the token is from another issuer than this API trusts"
	case errors.Is(err, errNotBearer):
		return "the Authorization header is not a Bearer token"
	case errors.Is(err, errNoKeyID):
		return "the token names no signing key (kid)"
	case errors.Is(err, errAlgorithm):
		return "the token is signed with an algorithm this API does not accept (RS256 or ES256)"
	case errors.Is(err, errUnknownKey), errors.Is(err, jwkset.ErrKeyNotFound):
		return "the token is signed by a key the issuer does not publish"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "the token's signature does not verify"
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "the token is not a well-formed JWT"
	case errors.As(err, &missing):
		return fmt.Sprintf("the token lacks the %q claim", missing.name)
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "the token lacks a required claim"
	case errors.Is(err, ErrBadToken):
		return "the token is not valid"
	}
	return "the token could not be checked"
}

var (
	errNotBearer  = errors.New("Authorization is not a Bearer token")
	errNoKeyID    = errors.New("token has no kid")
	errUnknownKey = errors.New("no key with the token's kid")
	errAlgorithm  = errors.New("signing algorithm not accepted:")
)

// missingClaimError is a token without a claim this API needs (the user
// claim).
type missingClaimError struct{ name string }

func (e *missingClaimError) Error() string { return fmt.Sprintf("no %q claim", e.name) }
