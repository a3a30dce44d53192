package webpush

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

const (
	maxBody    = 4096            // the body every push service must take
	recordSize = 4096            // rs of the one record a message is
	headerLen  = 16 + 4 + 1 + 65 // salt, rs, idlen, keyid (the sender's public key)
	tagLen     = 16              // AES-GCM's
)

// encrypt seals plaintext for a user agent (RFC 8291 §3.4): as is the
// sender's key pair and salt the random salt, both used for this message
// only. The result is the aes128gcm body (RFC 8188 §2): a header naming as's
// public key, then one record, the plaintext and its delimiter, unpadded.
func encrypt(plaintext []byte, ua *ecdh.PublicKey, auth []byte, as *ecdh.PrivateKey, salt []byte) ([]byte, error) {
	secret, err := as.ECDH(ua)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	asPublic := as.PublicKey().Bytes()
	ikm, err := hkdf.Key(sha256.New, secret, auth, "WebPush: info\x00"+string(ua.Bytes())+string(asPublic), 32)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	prk, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	cek, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	nonce, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}

	body := make([]byte, 0, headerLen+len(plaintext)+1+tagLen)
	body = append(body, salt...)
	body = binary.BigEndian.AppendUint32(body, recordSize)
	body = append(body, byte(len(asPublic)))
	body = append(body, asPublic...)
	// The record: plaintext, then 0x02, the delimiter of a last record.
	record := append(append(make([]byte, 0, len(plaintext)+1), plaintext...), 2)
	return gcm.Seal(body, nonce, record, nil), nil
}
