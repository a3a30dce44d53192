package webpush

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Keys of RFC 8291's example user agent.
const (
	testP256dh = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
	testAuth   = "BTBZMqHH6r4Tts7J_aSIgg"
)

// stdBase64 is key in the standard alphabet, padded, as some libraries write it.
func stdBase64(key string) string {
	b, _ := base64.RawURLEncoding.DecodeString(key)
	return base64.StdEncoding.EncodeToString(b)
}

func subscriptionJSONOf(endpoint, p256dh, auth string) string {
	return fmt.Sprintf(`{"endpoint": %q, "expirationTime": null, "keys": {"p256dh": %q, "auth": %q}}`, endpoint, p256dh, auth)
}

func TestParseSubscriptionTakesWhatBrowsersSend(t *testing.T) {
	t.Parallel()
	fcm := "https://fcm.googleapis.com/fcm/send/dpH5lCsTSSM:APA91bHqjZxM0VImWWqDRN7U0a3AycjUf4O-byuxb_wJsKRaKvV_iKw56s16ekq6FUqoCF7k2nqOHHzO2eNqQ7V6spq9xOdYEkqVX4rWBTo6eIwKqjjEjUhfKm-nwUjx9I9RNhXr8KPb"
	want := Subscription{Endpoint: fcm, P256dh: testP256dh, Auth: testAuth}
	cases := map[string]string{
		"Chrome's toJSON()":                  subscriptionJSONOf(fcm, testP256dh, testAuth),
		"keys base64url padded":              subscriptionJSONOf(fcm, testP256dh+"=", testAuth+"=="),
		"keys in standard base64":            subscriptionJSONOf(fcm, stdBase64(testP256dh), stdBase64(testAuth)),
		"keys in standard base64, unpadded":  subscriptionJSONOf(fcm, strings.TrimRight(stdBase64(testP256dh), "="), strings.TrimRight(stdBase64(testAuth), "=")),
		"an expirationTime, unknown fields":  `{"endpoint": "` + fcm + `", "expirationTime": 1767225600000.5, "keys": {"p256dh": "` + testP256dh + `", "auth": "` + testAuth + `", "x": 1}, "clientHash": "ab"}`,
		"without expirationTime, keys first": `{"keys": {"auth": "` + testAuth + `", "p256dh": "` + testP256dh + `"}, "endpoint": "` + fcm + `"}`,
	}
	for name, raw := range cases {
		got, err := ParseSubscription([]byte(raw))
		if err != nil || got != want {
			t.Errorf("%s: %+v, %v", name, got, err)
		}
	}

	// Written back, it is what the browser wrote.
	b, err := want.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if s := `{"endpoint":"` + fcm + `","expirationTime":null,"keys":{"p256dh":"` + testP256dh + `","auth":"` + testAuth + `"}}`; string(b) != s {
		t.Errorf("MarshalJSON:\n got %s\nwant %s", b, s)
	}
}

func TestParseSubscriptionTakesHTTPOnlyToLoopback(t *testing.T) {
	t.Parallel()
	for endpoint, ok := range map[string]bool{
		"http://localhost:8090/notify/ab": true,
		"http://LOCALHOST/notify/ab":      true,
		"http://127.0.0.1:8090/notify/ab": true,
		"http://127.8.9.10/notify/ab":     true,
		"http://[::1]:8090/notify/ab":     true,
		"http://push.example/notify/ab":   false,
		"http://10.0.0.1/notify/ab":       false,
		"http://localhost.example/ab":     false,
	} {
		_, err := ParseSubscription([]byte(subscriptionJSONOf(endpoint, testP256dh, testAuth)))
		if (err == nil) != ok {
			t.Errorf("%s: %v", endpoint, err)
		}
	}
}

func TestParseSubscriptionRefusesWhatIsUnusableNamingTheField(t *testing.T) {
	t.Parallel()
	const endpoint = "https://updates.push.services.mozilla.com/wpush/v2/gAAAAAB"
	p := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	offCurve := p(append([]byte{4}, bytes.Repeat([]byte{1}, 64)...))
	compressed := p(append([]byte{2}, bytes.Repeat([]byte{1}, 64)...))
	cases := []struct {
		name, raw, want string
	}{
		{"not JSON", `{"endpoint": `, "unexpected end of JSON"},
		{"an array", `[]`, "cannot unmarshal array"},
		{"null", `null`, "endpoint: missing"},
		{"an endpoint of another type", `{"endpoint": 1}`, "endpoint"},
		{"no endpoint", subscriptionJSONOf("", testP256dh, testAuth), "endpoint: missing"},
		{"a relative endpoint", subscriptionJSONOf("/wpush/v2/x", testP256dh, testAuth), "endpoint: scheme"},
		{"an http endpoint", subscriptionJSONOf("http://push.example/x", testP256dh, testAuth), "endpoint: scheme \"http\""},
		{"an ftp endpoint", subscriptionJSONOf("ftp://push.example/x", testP256dh, testAuth), "endpoint: scheme \"ftp\""},
		{"no host", subscriptionJSONOf("https:///x", testP256dh, testAuth), "endpoint: no host"},
		{"an opaque URL", subscriptionJSONOf("https:push.example", testP256dh, testAuth), "endpoint: no host"},
		{"credentials", subscriptionJSONOf("https://u:p@push.example/x", testP256dh, testAuth), "endpoint: has credentials"},
		{"a fragment", subscriptionJSONOf("https://push.example/x#y", testP256dh, testAuth), "endpoint: has a fragment"},
		{"a bad port", subscriptionJSONOf("https://push.example:x/", testP256dh, testAuth), "endpoint: not a URL"},
		{"a long endpoint", subscriptionJSONOf(endpoint+"/"+strings.Repeat("a", MaxEndpointLength), testP256dh, testAuth), "over the 2048 allowed"},
		{"no p256dh", subscriptionJSONOf(endpoint, "", testAuth), "keys.p256dh: 0 bytes"},
		{"p256dh not base64", subscriptionJSONOf(endpoint, "B*"+testP256dh[2:], testAuth), "keys.p256dh: not base64"},
		{"p256dh badly padded", subscriptionJSONOf(endpoint, testP256dh+"==", testAuth), "keys.p256dh: not base64"},
		{"p256dh short", subscriptionJSONOf(endpoint, testP256dh[:43], testAuth), "keys.p256dh: 32 bytes"},
		{"p256dh compressed", subscriptionJSONOf(endpoint, compressed, testAuth), "keys.p256dh: starts 0x02"},
		{"p256dh off the curve", subscriptionJSONOf(endpoint, offCurve, testAuth), "keys.p256dh: not a point of P-256"},
		{"no auth", subscriptionJSONOf(endpoint, testP256dh, ""), "keys.auth: 0 bytes"},
		{"auth not base64", subscriptionJSONOf(endpoint, testP256dh, "!!"+testAuth[2:]), "keys.auth: not base64"},
		{"auth short", subscriptionJSONOf(endpoint, testP256dh, testAuth[:20]), "keys.auth: 15 bytes"},
		{"auth long", subscriptionJSONOf(endpoint, testP256dh, testAuth+"AAAA"), "keys.auth: 19 bytes"},
	}
	for _, c := range cases {
		got, err := ParseSubscription([]byte(c.raw))
		if !errors.Is(err, ErrBadSubscription) || !strings.Contains(err.Error(), c.want) || got != (Subscription{}) {
			t.Errorf("%s: %+v, %v; want an error saying %q", c.name, got, err, c.want)
		}
	}
}
