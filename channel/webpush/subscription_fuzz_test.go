package webpush

import (
	"encoding/base64"
	"errors"
	"testing"
)

// FuzzParseSubscription holds ParseSubscription to its contract on any
// input: no panic; an error wraps ErrBadSubscription and comes with nothing
// else; a subscription it returns is one Send takes, in canonical form, and
// reads back the same from its own JSON. The seeds are in
// testdata/fuzz/FuzzParseSubscription.
func FuzzParseSubscription(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, err := ParseSubscription(raw)
		if err != nil {
			if !errors.Is(err, ErrBadSubscription) || s != (Subscription{}) {
				t.Fatalf("ParseSubscription(%q) = %+v, %v", raw, s, err)
			}
			return
		}
		if _, err := s.check(); err != nil {
			t.Fatalf("ParseSubscription(%q) = %+v, which Send refuses: %v", raw, s, err)
		}
		if len(s.Endpoint) > MaxEndpointLength {
			t.Fatalf("ParseSubscription(%q) took a %d-byte endpoint", raw, len(s.Endpoint))
		}
		for _, key := range []string{s.P256dh, s.Auth} {
			if b, err := base64.RawURLEncoding.Strict().DecodeString(key); err != nil || base64.RawURLEncoding.EncodeToString(b) != key {
				t.Fatalf("ParseSubscription(%q): key %q is not canonical base64url", raw, key)
			}
		}
		b, err := s.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseSubscription(b); err != nil || back != s {
			t.Fatalf("ParseSubscription(%q) = %+v, whose JSON %s reads back as %+v, %v", raw, s, b, back, err)
		}
	})
}
