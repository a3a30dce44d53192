package fcmtest

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Scope is the OAuth scope a grant must ask for to send with FCM.
const Scope = "https://www.googleapis.com/auth/firebase.messaging"

const (
	jwtBearer = "urn:ietf:params:oauth:grant-type:jwt-bearer"
	// maxGrantLife is the longest a grant may live (exp - iat), as Google takes them.
	maxGrantLife = time.Hour
	// skew is how far ahead of ours a signer's clock may be.
	skew = time.Minute
)

// Grant is a JWT grant the token endpoint took: its header's kid and its claims.
type Grant struct {
	KeyID    string
	Issuer   string // iss: the service account's client_email
	Audience string // aud: the token endpoint
	Scope    string
	IssuedAt time.Time
	Expires  time.Time
}

// serveToken is Google's token endpoint for service accounts
// (https://developers.google.com/identity/protocols/oauth2/service-account#httprest):
// POST grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>.
func (s *Server) serveToken(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.tokenRequests++
	failure := s.tokenFailure
	s.mu.Unlock()
	switch {
	case r.Method != http.MethodPost:
		oauthError(w, http.StatusMethodNotAllowed, "invalid_request", "POST only")
		return
	case failure == http.StatusBadRequest:
		oauthError(w, failure, "invalid_grant", "Invalid JWT Signature.")
		return
	case failure != 0:
		oauthError(w, failure, "internal_failure", "Backend Error")
		return
	}
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if gt := r.PostForm.Get("grant_type"); gt != jwtBearer {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "Invalid grant_type: "+gt)
		return
	}
	g, err := s.verify(r.PostForm.Get("assertion"))
	if err != nil {
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		oauthError(w, http.StatusBadRequest, "invalid_grant", err.Error())
		return
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails
	token := "ya29.fake-" + base64.RawURLEncoding.EncodeToString(b)
	s.mu.Lock()
	lifetime := s.lifetime
	s.issued[token] = time.Now().Add(lifetime)
	s.grants = append(s.grants, g)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": token,
		"token_type":   "Bearer",
		"expires_in":   int(lifetime / time.Second),
	})
}

// verify checks a grant as Google does: signed RS256 by the key its kid
// names, issued by that key's account, for this endpoint, asking for FCM's
// scope, and living at most an hour from an iat that is not in the future.
func (s *Server) verify(assertion string) (Grant, error) {
	var sa *ServiceAccount
	claims := jwt.MapClaims{}
	tok, err := jwt.ParseWithClaims(assertion, claims, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		s.mu.Lock()
		sa = s.accounts[kid]
		s.mu.Unlock()
		if sa == nil {
			return nil, fmt.Errorf("no key %q", kid)
		}
		return &sa.Key.PublicKey, nil
	}, jwt.WithValidMethods([]string{"RS256"}), jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(skew))
	if err != nil {
		return Grant{}, fmt.Errorf("invalid JWT: %w", err)
	}
	g := Grant{KeyID: sa.PrivateKeyID}
	g.Issuer, _ = claims["iss"].(string)
	g.Audience, _ = claims["aud"].(string)
	g.Scope, _ = claims["scope"].(string)
	iat, err := claims.GetIssuedAt()
	if err != nil || iat == nil {
		return Grant{}, errors.New("invalid JWT: no iat")
	}
	exp, _ := claims.GetExpirationTime() // required above
	g.IssuedAt, g.Expires = iat.Time, exp.Time
	switch {
	case !tok.Valid:
		return Grant{}, errors.New("invalid JWT signature")
	case g.Issuer != sa.ClientEmail:
		return Grant{}, fmt.Errorf("invalid JWT: iss %q is not the key's account", g.Issuer)
	case g.Audience != s.tokenURL:
		return Grant{}, fmt.Errorf("invalid JWT: aud %q is not %q", g.Audience, s.tokenURL)
	case !slices.Contains(strings.Fields(g.Scope), Scope):
		return Grant{}, fmt.Errorf("invalid JWT: scope %q lacks %s", g.Scope, Scope)
	case g.Expires.Sub(g.IssuedAt) > maxGrantLife:
		return Grant{}, errors.New("invalid JWT: token must be a short-lived token (60 minutes) and in a reasonable timeframe")
	}
	return g, nil
}

func oauthError(w http.ResponseWriter, status int, code, description string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": description})
}
