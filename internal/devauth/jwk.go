package devauth

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
)

// JWK is a public JSON Web Key as an issuer publishes it (RFC 7517).
type JWK struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	Crv string `json:"crv,omitempty"`
	X   string `json:"x,omitempty"`
	Y   string `json:"y,omitempty"`
	N   string `json:"n,omitempty"`
	E   string `json:"e,omitempty"`
}

// PublicJWK describes a P-256 or RSA public key as a signing JWK.
func PublicJWK(kid string, pub any) (JWK, error) {
	b64 := base64.RawURLEncoding.EncodeToString
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		raw, err := k.ECDH()
		if err != nil {
			return JWK{}, err
		}
		b := raw.Bytes() // 0x04 || X || Y
		n := (len(b) - 1) / 2
		return JWK{Kty: "EC", Kid: kid, Alg: "ES256", Use: "sig", Crv: "P-256", X: b64(b[1 : 1+n]), Y: b64(b[1+n:])}, nil
	case *rsa.PublicKey:
		return JWK{Kty: "RSA", Kid: kid, Alg: "RS256", Use: "sig", N: b64(k.N.Bytes()), E: b64(big.NewInt(int64(k.E)).Bytes())}, nil
	}
	return JWK{}, fmt.Errorf("unsupported public key %T", pub)
}

// JWKSet encodes keys as a JWK Set document.
func JWKSet(keys ...JWK) []byte {
	b, _ := json.Marshal(struct {
		Keys []JWK `json:"keys"`
	}{keys})
	return b
}
