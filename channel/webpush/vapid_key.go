package webpush

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// VAPIDKey is the application server's key pair (RFC 8292): it signs the
// VAPID tokens, and its public half is what browsers subscribe with.
type VAPIDKey struct {
	private *ecdsa.PrivateKey
	public  string // base64url of the uncompressed point
}

// LoadVAPIDKey reads a P-256 private key from PEM: SEC 1 ("EC PRIVATE KEY",
// what `openssl ecparam -name prime256v1 -genkey -noout` writes, an "EC
// PARAMETERS" block before it allowed) or PKCS #8 ("PRIVATE KEY").
func LoadVAPIDKey(pemBytes []byte) (*VAPIDKey, error) {
	for rest := pemBytes; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("VAPID key: no PEM block (want EC PRIVATE KEY or PRIVATE KEY)")
		}
		if _, ok := block.Headers["Proc-Type"]; ok || block.Type == "ENCRYPTED PRIVATE KEY" {
			return nil, errors.New("VAPID key: the PEM block is encrypted; decrypt it first (openssl ec -in key.pem -out plain.pem)")
		}
		var key any
		var err error
		switch block.Type {
		case "EC PARAMETERS":
			continue
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		default:
			return nil, fmt.Errorf("VAPID key: PEM block %q: want EC PRIVATE KEY or PRIVATE KEY", block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("VAPID key: %w (want a P-256 key: openssl ecparam -name prime256v1 -genkey -noout)", err)
		}
		return newVAPIDKey(key)
	}
}

// LoadVAPIDKeyFile is LoadVAPIDKey of the file at path.
func LoadVAPIDKeyFile(path string) (*VAPIDKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("VAPID key: %w", err)
	}
	k, err := LoadVAPIDKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

func newVAPIDKey(key any) (*VAPIDKey, error) {
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("VAPID key: a %T, want an EC P-256 key", key)
	}
	if ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("VAPID key: on curve %s, want P-256 (prime256v1)", ec.Curve.Params().Name)
	}
	point, err := ec.PublicKey.Bytes()
	if err != nil {
		return nil, fmt.Errorf("VAPID key: %w", err)
	}
	return &VAPIDKey{private: ec, public: base64.RawURLEncoding.EncodeToString(point)}, nil
}

// PublicKey is the public key as browsers take it for applicationServerKey,
// and as the VAPID header's k: base64url, unpadded, of the 65-byte
// uncompressed point.
func (k *VAPIDKey) PublicKey() string { return k.public }

// GenerateVAPIDKeyPEM makes a new P-256 key, in SEC 1 PEM as openssl writes it.
func GenerateVAPIDKeyPEM() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate VAPID key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("generate VAPID key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}
