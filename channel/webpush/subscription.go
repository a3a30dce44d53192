package webpush

import (
	"crypto/ecdh"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// MaxEndpointLength bounds a subscription's endpoint URL. Browsers' are
// under 600 bytes; the bound keeps a stored subscription small.
const MaxEndpointLength = 2048

// ErrBadSubscription is wrapped by every error about a subscription's
// content: the subscription is unusable as it is.
var ErrBadSubscription = errors.New("bad push subscription")

// Subscription is a browser's push subscription: where to send, and the
// keys to encrypt for. Its JSON is that of PushSubscription.toJSON():
//
//	{"endpoint": "https://…", "expirationTime": null, "keys": {"p256dh": "…", "auth": "…"}}
type Subscription struct {
	Endpoint string // the push resource URL (RFC 8030 §5)
	P256dh   string // the user agent's P-256 public key, base64url
	Auth     string // the 16-byte authentication secret, base64url
}

// subscriptionJSON is the JSON of a Subscription. ExpirationTime is written
// null and read as anything: browsers write null, or a time of their own.
type subscriptionJSON struct {
	Endpoint       string `json:"endpoint"`
	ExpirationTime any    `json:"expirationTime"`
	Keys           struct {
		P256dh string `json:"p256dh"`
		Auth   string `json:"auth"`
	} `json:"keys"`
}

// MarshalJSON writes the shape of PushSubscription.toJSON().
func (s Subscription) MarshalJSON() ([]byte, error) {
	var j subscriptionJSON
	j.Endpoint, j.Keys.P256dh, j.Keys.Auth = s.Endpoint, s.P256dh, s.Auth
	return json.Marshal(j)
}

// UnmarshalJSON reads the shape of PushSubscription.toJSON(), without
// checking the values (ParseSubscription does). Fields it does not know are
// ignored, and so is expirationTime.
func (s *Subscription) UnmarshalJSON(b []byte) error {
	var j subscriptionJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Subscription{Endpoint: j.Endpoint, P256dh: j.Keys.P256dh, Auth: j.Keys.Auth}
	return nil
}

// ParseSubscription reads a subscription as a browser sends it and checks
// it: the endpoint an absolute https URL of at most MaxEndpointLength bytes
// (http only to a loopback host: a push service stand-in in tests), p256dh a
// P-256 point and auth 16 bytes, both base64 — url or standard alphabet,
// padded or not, as browsers and libraries write them. The keys come back
// in one form, base64url unpadded, so that a subscription stored twice
// compares equal. Errors wrap ErrBadSubscription and name the field.
func ParseSubscription(raw []byte) (Subscription, error) {
	var s Subscription
	if err := json.Unmarshal(raw, &s); err != nil {
		return Subscription{}, fmt.Errorf("%w: %w", ErrBadSubscription, err)
	}
	keys, err := s.check()
	if err != nil {
		return Subscription{}, err
	}
	s.P256dh = base64.RawURLEncoding.EncodeToString(keys.p256dh.Bytes())
	s.Auth = base64.RawURLEncoding.EncodeToString(keys.auth)
	return s, nil
}

// parsedSubscription is a subscription checked: its endpoint parsed, its
// keys decoded.
type parsedSubscription struct {
	endpoint *url.URL
	p256dh   *ecdh.PublicKey
	auth     []byte
}

// check validates s and decodes its keys.
func (s Subscription) check() (parsedSubscription, error) {
	u, err := checkEndpoint(s.Endpoint)
	if err != nil {
		return parsedSubscription{}, fmt.Errorf("%w: endpoint: %w", ErrBadSubscription, err)
	}
	point, err := decodeKey(s.P256dh)
	if err != nil {
		return parsedSubscription{}, fmt.Errorf("%w: keys.p256dh: %w", ErrBadSubscription, err)
	}
	switch {
	case len(point) != 65:
		return parsedSubscription{}, fmt.Errorf("%w: keys.p256dh: %d bytes, want 65 (an uncompressed P-256 point)", ErrBadSubscription, len(point))
	case point[0] != 4:
		return parsedSubscription{}, fmt.Errorf("%w: keys.p256dh: starts %#02x, want 0x04 (an uncompressed P-256 point)", ErrBadSubscription, point[0])
	}
	pub, err := ecdh.P256().NewPublicKey(point)
	if err != nil {
		return parsedSubscription{}, fmt.Errorf("%w: keys.p256dh: not a point of P-256", ErrBadSubscription)
	}
	auth, err := decodeKey(s.Auth)
	if err != nil {
		return parsedSubscription{}, fmt.Errorf("%w: keys.auth: %w", ErrBadSubscription, err)
	}
	if len(auth) != 16 {
		return parsedSubscription{}, fmt.Errorf("%w: keys.auth: %d bytes, want 16", ErrBadSubscription, len(auth))
	}
	return parsedSubscription{endpoint: u, p256dh: pub, auth: auth}, nil
}

func checkEndpoint(endpoint string) (*url.URL, error) {
	switch {
	case endpoint == "":
		return nil, errors.New("missing")
	case len(endpoint) > MaxEndpointLength:
		return nil, fmt.Errorf("%d bytes, over the %d allowed", len(endpoint), MaxEndpointLength)
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which can be long
		}
		return nil, fmt.Errorf("not a URL: %w", err)
	}
	switch {
	case u.Scheme != "https" && !(u.Scheme == "http" && loopback(u.Hostname())):
		return nil, fmt.Errorf("scheme %q, want https (http only to a loopback host)", u.Scheme)
	case u.Opaque != "" || u.Hostname() == "":
		return nil, errors.New("no host")
	case u.User != nil:
		return nil, errors.New("has credentials")
	case u.Fragment != "" || strings.HasSuffix(endpoint, "#"):
		return nil, errors.New("has a fragment")
	}
	return u, nil
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// decodeKey decodes base64 in either alphabet, padded or not.
func decodeKey(s string) ([]byte, error) {
	s = strings.NewReplacer("+", "-", "/", "_").Replace(s)
	enc := base64.RawURLEncoding
	if strings.HasSuffix(s, "=") {
		enc = base64.URLEncoding
	}
	b, err := enc.DecodeString(s)
	if err != nil {
		return nil, errors.New("not base64")
	}
	return b, nil
}
