package apnstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// NewKey generates a P-256 key, the kind Apple issues as a team's .p8 key.
// It panics only if the system's randomness fails.
func NewKey() *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(fmt.Sprintf("apnstest: generate key: %v", err))
	}
	return key
}

// P8 encodes key as Apple's .p8 files hold it: PKCS #8, PEM.
func P8(key *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		panic(fmt.Sprintf("apnstest: marshal key: %v", err)) // only for a key off its curve
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// WriteP8 writes key to path as a .p8 file, readable by its owner only.
func WriteP8(path string, key *ecdsa.PrivateKey) error {
	return os.WriteFile(path, P8(key), 0o600)
}

// selfSigned makes the fake's certificate for the loopback addresses, and
// the pool a client trusts it through.
func selfSigned() (tls.Certificate, *x509.CertPool) {
	key := NewKey()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "apnstest"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // its own root, so that a pool of it verifies it
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(fmt.Sprintf("apnstest: certificate: %v", err))
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		panic(fmt.Sprintf("apnstest: certificate: %v", err))
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
