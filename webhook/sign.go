package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
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
