package webpush

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// MaxPayload is the most plaintext a message carries: a push service takes
// at least 4096 bytes of body (RFC 8291 §4), of which the aes128gcm header
// takes 86, the GCM tag 16 and the padding delimiter 1.
const MaxPayload = maxBody - headerLen - tagLen - 1

// DefaultTTL is Message.TTL's default: four weeks, about what push services
// keep a message at most.
const DefaultTTL = 28 * 24 * time.Hour

// Urgencies (RFC 8030 §5.3): a device on battery may wait for a message of
// lower urgency until it wakes for another reason.
const (
	UrgencyVeryLow = "very-low"
	UrgencyLow     = "low"
	UrgencyNormal  = "normal"
	UrgencyHigh    = "high"
)

// maxTopic is a Topic's longest (RFC 8030 §5.4).
const maxTopic = 32

// ErrBadMessage is wrapped by the errors about a Message's Urgency or Topic.
var ErrBadMessage = errors.New("bad push message")

// Message is one push to one subscription.
type Message struct {
	// Payload is what the browser's service worker receives; it is sent
	// encrypted, and is at most MaxPayload bytes. Empty is a push without
	// data.
	Payload []byte
	// TTL is how long the push service keeps the message for a browser that
	// is offline, in whole seconds. Default (0) DefaultTTL; a negative TTL
	// keeps it not at all: delivered now, or never.
	TTL time.Duration
	// Urgency is UrgencyVeryLow, UrgencyLow, UrgencyNormal or UrgencyHigh.
	// Default ("") none sent, which push services take as normal.
	Urgency string
	// Topic, when set, makes the message replace an undelivered one of the
	// same topic: at most 32 characters of the base64url alphabet. TopicFor
	// makes one of any key.
	Topic string
}

// PayloadTooLargeError is a Message whose Payload is over MaxPayload.
type PayloadTooLargeError struct{ Size int }

func (e *PayloadTooLargeError) Error() string {
	return fmt.Sprintf("push payload of %d bytes, over the %d a push message carries", e.Size, MaxPayload)
}

// TopicFor derives a valid Topic from any collapse key: 32 characters of
// base64url, of the first 24 bytes of key's SHA-256.
func TopicFor(key string) string {
	sum := sha256.Sum256([]byte(key))
	return base64.RawURLEncoding.EncodeToString(sum[:24])
}

// ttlHeader is the TTL header's value for m.
func (m Message) ttlHeader() string {
	switch {
	case m.TTL == 0:
		return strconv.FormatInt(int64(DefaultTTL/time.Second), 10)
	case m.TTL < 0:
		return "0"
	}
	return strconv.FormatInt(int64(m.TTL/time.Second), 10)
}

// check reports what is wrong with m, if anything.
func (m Message) check() error {
	if len(m.Payload) > MaxPayload {
		return &PayloadTooLargeError{Size: len(m.Payload)}
	}
	switch m.Urgency {
	case "", UrgencyVeryLow, UrgencyLow, UrgencyNormal, UrgencyHigh:
	default:
		return fmt.Errorf("%w: urgency %q: want very-low, low, normal or high", ErrBadMessage, m.Urgency)
	}
	if !validTopic(m.Topic) {
		return fmt.Errorf("%w: topic %q: want at most %d characters of A-Z, a-z, 0-9, - and _ (see TopicFor)", ErrBadMessage, m.Topic, maxTopic)
	}
	return nil
}

func validTopic(topic string) bool {
	if len(topic) > maxTopic {
		return false
	}
	for _, c := range []byte(topic) {
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
