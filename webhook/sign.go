package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// secretPrefix starts every signing secret, as Standard Webhooks has it.
const secretPrefix = "whsec_"

// secretBytes is the size of a new secret's key: the HMAC's block-size
// guidance for SHA-256 asks for at least 32.
const secretBytes = 32

// NewSecret returns a fresh signing secret, whsec_ + base64 of 32 random bytes.
func NewSecret() string {
	key := make([]byte, secretBytes)
	rand.Read(key) // never fails: crypto/rand panics rather than return short
	return secretPrefix + base64.StdEncoding.EncodeToString(key)
}

// secretKey is the HMAC key of a whsec_ secret.
func secretKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, secretPrefix))
	if err != nil || len(key) == 0 {
		return nil, errors.New("webhook: a signing secret is whsec_ and base64")
	}
	return key, nil
}

// Sign returns the webhook-signature header of one attempt: "v1,"+base64
// HMAC-SHA256 over id.timestamp.body for each secret, space-separated, so
// that during a rotation a receiver holding either secret verifies it.
func Sign(secrets []string, id string, timestamp int64, body []byte) (string, error) {
	var sb strings.Builder
	ts := strconv.FormatInt(timestamp, 10)
	for i, s := range secrets {
		key, err := secretKey(s)
		if err != nil {
			return "", err
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString("v1,")
		sb.WriteString(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	return sb.String(), nil
}

// Verification errors.
var (
	ErrNoSignature   = errors.New("webhook: no webhook-id, webhook-timestamp or webhook-signature header")
	ErrStale         = errors.New("webhook: webhook-timestamp is more than the tolerance away from now")
	ErrBadSignature  = errors.New("webhook: no signature matches")
	DefaultTolerance = 5 * time.Minute
)

// Verify checks a delivery as a receiver does: the timestamp within
// tolerance of now (0: DefaultTolerance), and one of the v1 signatures in
// signature made with secret over id.timestamp.body.
func Verify(secret, id, timestamp, signature string, body []byte, now time.Time, tolerance time.Duration) error {
	if id == "" || timestamp == "" || signature == "" {
		return ErrNoSignature
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return ErrStale
	}
	if tolerance == 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	want, err := Sign([]string{secret}, id, ts, body)
	if err != nil {
		return err
	}
	for _, sig := range strings.Fields(signature) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return ErrBadSignature
}
