package auth

import (
	"errors"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

// Reason says in a few words why a token was refused, for a 401's detail
// and the log: what the caller can act on, never the token itself.
func Reason(err error) string {
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
	case errors.Is(err, jwkset.ErrKeyNotFound):
		return "the token is signed by a key the issuer does not publish"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "the token's signature does not verify"
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "the token is not a well-formed JWT"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "the token lacks a required claim"
	case errors.Is(err, ErrBadToken):
		return "the token is not valid"
	}
	return "the token could not be checked"
}
