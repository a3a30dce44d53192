package webpush

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func openssl(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	path, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl not installed")
	}
	cmd := exec.Command(path, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// checkPublicKey holds PublicKey to what browsers take: base64url without
// padding of a 65-byte uncompressed point.
func checkPublicKey(t *testing.T, k *VAPIDKey) []byte {
	t.Helper()
	point, err := base64.RawURLEncoding.Strict().DecodeString(k.PublicKey())
	if err != nil || len(point) != 65 || point[0] != 4 {
		t.Fatalf("PublicKey %q: %d bytes, %v; want 65 starting 0x04", k.PublicKey(), len(point), err)
	}
	return point
}

func TestAKeyOpenSSLMadeLoads(t *testing.T) {
	t.Parallel()
	pemBytes := openssl(t, nil, "ecparam", "-name", "prime256v1", "-genkey", "-noout")
	k, err := LoadVAPIDKey(pemBytes)
	if err != nil {
		t.Fatalf("%v\n%s", err, pemBytes)
	}
	point := checkPublicKey(t, k)
	// openssl's own view of the public key: a SubjectPublicKeyInfo whose
	// last 65 bytes are the uncompressed point.
	spki := openssl(t, pemBytes, "ec", "-pubout", "-outform", "DER")
	if !bytes.HasSuffix(spki, point) {
		t.Errorf("PublicKey %x is not openssl's %x", point, spki)
	}

	withParams := openssl(t, nil, "ecparam", "-name", "prime256v1", "-genkey")
	if _, err := LoadVAPIDKey(withParams); err != nil {
		t.Errorf("with its EC PARAMETERS block: %v\n%s", err, withParams)
	}
}

func TestAKeyNotOnP256IsRefused(t *testing.T) {
	t.Parallel()
	for _, curve := range []string{"secp384r1", "secp256k1"} {
		pemBytes := openssl(t, nil, "ecparam", "-name", curve, "-genkey", "-noout")
		_, err := LoadVAPIDKey(pemBytes)
		if err == nil || !strings.Contains(err.Error(), "P-256") {
			t.Errorf("a %s key: %v, want an error naming P-256", curve, err)
		}
	}
}

func TestAPKCS8KeyLoads(t *testing.T) {
	t.Parallel()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(key)
	sec1, _ := x509.MarshalECPrivateKey(key)
	fromPKCS8, err := LoadVAPIDKey(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}))
	if err != nil {
		t.Fatal(err)
	}
	fromSEC1, err := LoadVAPIDKey(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}))
	if err != nil {
		t.Fatal(err)
	}
	checkPublicKey(t, fromPKCS8)
	if fromPKCS8.PublicKey() != fromSEC1.PublicKey() {
		t.Error("one key, two public keys")
	}
}

func TestWhatIsNotAVAPIDKeyIsRefusedSayingWhy(t *testing.T) {
	t.Parallel()
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	edPKCS8, _ := x509.MarshalPKCS8PrivateKey(edKey)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p384DER, _ := x509.MarshalECPrivateKey(p384)
	cases := []struct {
		name string
		pem  []byte
		want string
	}{
		{"nothing", nil, "no PEM block"},
		{"not PEM", []byte("BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIg"), "no PEM block"},
		{"a certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), `"CERTIFICATE"`},
		{"an Ed25519 key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: edPKCS8}), "ed25519"},
		{"a P-384 key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: p384DER}), "P-384"},
		{"a broken key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{0x30, 1, 2}}), "prime256v1"},
		{"an encrypted key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: []byte{1}}), "encrypted"},
		{"an encrypted PKCS#8 key", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}), "encrypted"},
	}
	for _, c := range cases {
		_, err := LoadVAPIDKey(c.pem)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %s", c.name, err, c.want)
		}
	}
}

func TestAGeneratedKeyIsWhatOpenSSLWrites(t *testing.T) {
	t.Parallel()
	pemBytes, err := GenerateVAPIDKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(pemBytes, []byte("-----BEGIN EC PRIVATE KEY-----\n")) {
		t.Errorf("GenerateVAPIDKeyPEM:\n%s", pemBytes)
	}
	path := filepath.Join(t.TempDir(), "vapid.pem")
	if err := os.WriteFile(path, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadVAPIDKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	point := checkPublicKey(t, k)
	if spki := openssl(t, pemBytes, "ec", "-pubout", "-outform", "DER"); !bytes.HasSuffix(spki, point) {
		t.Errorf("openssl reads another public key: %x", spki)
	}

	missing := filepath.Join(t.TempDir(), "missing.pem")
	if _, err := LoadVAPIDKeyFile(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing file: %v, want an error naming it", err)
	}
}
