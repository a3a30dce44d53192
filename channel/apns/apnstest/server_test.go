package apnstest_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	keyID  = "KEY1234567"
	teamID = "TEAM123456"
	token  = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
)

// jwtFor signs a provider token as apns2 does.
func jwtFor(t *testing.T, key *ecdsa.PrivateKey, kid, iss string, iat time.Time) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": iss, "iat": iat.Unix()})
	tok.Header["kid"] = kid
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func start(t *testing.T) (*apnstest.Server, *ecdsa.PrivateKey, *http.Client) {
	t.Helper()
	key := apnstest.NewKey()
	fake := apnstest.New(keyID, teamID, &key.PublicKey)
	tr := &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: fake.CertPool()}}
	t.Cleanup(func() { tr.CloseIdleConnections(); fake.Close() })
	return fake, key, &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func TestTheFakeRefusesHTTP1(t *testing.T) {
	t.Parallel()
	fake, _, _ := start(t)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: fake.CertPool()}} // HTTP/1.1 only
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Post(fake.URL()+"/3/device/"+token, "application/json", strings.NewReader("{}"))
	if err == nil {
		res.Body.Close()
		t.Fatalf("HTTP/1.1 answered %s, want the connection refused", res.Status)
	}
}

func TestTheFakeChecksWhatAPNsChecks(t *testing.T) {
	t.Parallel()
	fake, key, client := start(t)
	now := time.Now()
	good := jwtFor(t, key, keyID, teamID, now)
	cases := []struct {
		name    string
		bearer  string
		header  map[string]string
		payload string
		status  int
		reason  string
	}{
		{"a good request", good, nil, `{"aps":{}}`, 200, ""},
		{"no provider token", "", nil, `{}`, 403, "MissingProviderToken"},
		{"another key's signature", jwtFor(t, apnstest.NewKey(), keyID, teamID, now), nil, `{}`, 403, "InvalidProviderToken"},
		{"another key id", jwtFor(t, key, "OTHERKEY12", teamID, now), nil, `{}`, 403, "InvalidProviderToken"},
		{"another team", jwtFor(t, key, keyID, "OTHERTEAM1", now), nil, `{}`, 403, "InvalidProviderToken"},
		{"issued in the future", jwtFor(t, key, keyID, teamID, now.Add(time.Minute)), nil, `{}`, 403, "InvalidProviderToken"},
		{"issued over an hour ago", jwtFor(t, key, keyID, teamID, now.Add(-61*time.Minute)), nil, `{}`, 403, "ExpiredProviderToken"},
		{"no topic", good, map[string]string{"apns-topic": ""}, `{}`, 400, "MissingTopic"},
		{"a collapse id of 65 bytes", good, map[string]string{"apns-collapse-id": strings.Repeat("c", 65)}, `{}`, 400, "BadCollapseId"},
		{"a payload of 4097 bytes", good, nil, `"` + strings.Repeat("p", 4095) + `"`, 413, "PayloadTooLarge"},
		{"no payload", good, nil, ``, 400, "PayloadEmpty"},
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for _, c := range cases {
		req, _ := http.NewRequest(http.MethodPost, fake.URL()+"/3/device/"+token, bytes.NewReader([]byte(c.payload)))
		req.Header.Set("apns-topic", "com.example.app")
		if c.bearer != "" {
			req.Header.Set("authorization", "bearer "+c.bearer)
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var body struct{ Reason string }
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != c.status || body.Reason != c.reason || !uuid.MatchString(res.Header.Get("apns-id")) {
			t.Errorf("%s: %d %q apns-id %q, want %d %q and a UUID", c.name, res.StatusCode, body.Reason, res.Header.Get("apns-id"), c.status, c.reason)
		}
	}
	if n := len(fake.Requests()); n != len(cases) {
		t.Errorf("%d requests recorded, want %d", n, len(cases))
	}
	if got := fake.Requests()[0]; got.Status != 200 || got.IssuedAt.Unix() != now.Unix() || got.JWT != good {
		t.Errorf("first request recorded as %d, iat %v; want 200, iat %v", got.Status, got.IssuedAt, now)
	}
}

func TestTheFakeEchoesARequestsAPNsID(t *testing.T) {
	t.Parallel()
	fake, key, client := start(t)
	req, _ := http.NewRequest(http.MethodPost, fake.URL()+"/3/device/"+token, strings.NewReader(`{}`))
	req.Header.Set("apns-topic", "com.example.app")
	req.Header.Set("apns-id", "123e4567-e89b-12d3-a456-426655440000")
	req.Header.Set("authorization", "bearer "+jwtFor(t, key, keyID, teamID, time.Now()))
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if got := res.Header.Get("apns-id"); got != "123e4567-e89b-12d3-a456-426655440000" {
		t.Errorf("apns-id %q, want the request's", got)
	}
}
