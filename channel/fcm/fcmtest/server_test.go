package fcmtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T) *Server {
	t.Helper()
	s, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// grant is the jwt.Config that asks s's token endpoint for a token as
// its account.
func grant(s *Server) *jwt.Config {
	sa := s.Account()
	der, _ := x509.MarshalPKCS8PrivateKey(sa.Key)
	return &jwt.Config{
		Email:        sa.ClientEmail,
		PrivateKey:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		PrivateKeyID: sa.PrivateKeyID,
		Scopes:       []string{Scope},
		TokenURL:     s.TokenURL(),
	}
}

func fetch(t *testing.T, cfg *jwt.Config) (*oauth2.Token, error) {
	t.Helper()
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	return cfg.TokenSource(context.WithValue(context.Background(), oauth2.HTTPClient, client)).Token()
}

func TestTheTokenEndpointTakesOnlyAGrantGoogleWould(t *testing.T) {
	t.Parallel()
	s := start(t)
	other, err := rsa.GenerateKey(rand.Reader, 1024) // small, to be quick: it only has to differ
	if err != nil {
		t.Fatal(err)
	}
	otherDER, _ := x509.MarshalPKCS8PrivateKey(other)
	for _, tc := range []struct {
		name string
		edit func(*jwt.Config)
		want string // "" : taken
	}{
		{"the account's grant", func(*jwt.Config) {}, ""},
		{"another audience", func(c *jwt.Config) { c.Audience = "https://oauth2.googleapis.com/token" }, "aud"},
		{"another scope", func(c *jwt.Config) { c.Scopes = []string{"https://www.googleapis.com/auth/cloud-platform"} }, "scope"},
		{"another issuer", func(c *jwt.Config) { c.Email = "someone@example.iam.gserviceaccount.com" }, "iss"},
		{"two hours long", func(c *jwt.Config) { c.Expires = 2 * time.Hour }, "short-lived"},
		{"an unknown key id", func(c *jwt.Config) { c.PrivateKeyID = "nope" }, `no key \"nope\"`},
		{"signed by another key", func(c *jwt.Config) {
			c.PrivateKey = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: otherDER})
		}, "signature"},
	} {
		cfg := grant(s)
		tc.edit(cfg)
		tok, err := fetch(t, cfg)
		var re *oauth2.RetrieveError
		switch {
		case tc.want == "" && (err != nil || tok.AccessToken == "" || time.Until(tok.Expiry) < 59*time.Minute):
			t.Errorf("%s: token %+v, %v; want an hour's token", tc.name, tok, err)
		case tc.want != "" && (!errors.As(err, &re) || re.Response.StatusCode != 400 ||
			!strings.Contains(string(re.Body), `"invalid_grant"`) || !strings.Contains(string(re.Body), tc.want)):
			t.Errorf("%s: %v, want 400 invalid_grant about %s", tc.name, err, tc.want)
		}
	}
	if s.TokensIssued() != 1 || s.RefusedGrants() != 6 {
		t.Errorf("%d issued, %d refused; want 1, 6", s.TokensIssued(), s.RefusedGrants())
	}
}

func TestTheFakeRefusesMessagesFCMWould(t *testing.T) {
	t.Parallel()
	s := start(t)
	tok, err := fetch(t, grant(s))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	const ok = `"token":"t1","android":{"collapse_key":"n1","priority":"HIGH","ttl":"60s"}`
	for _, tc := range []struct {
		name, project, bearer, body string
		status                      int
		want                        string
	}{
		{"a good message", "", "", `{"message":{` + ok + `,"data":{"id":"n1"}}}`, 200, `"name":"projects/spoolcast-test/messages/0:1"`},
		{"a message only to check", "", "", `{"message":{` + ok + `},"validate_only":true}`, 200, `"name":"projects/spoolcast-test/messages/fake_message_id"`},
		{"no bearer", "", "none", `{"message":{` + ok + `}}`, 401, `"status":"UNAUTHENTICATED"`},
		{"another project", "other", "", `{"message":{` + ok + `}}`, 403, `"status":"PERMISSION_DENIED"`},
		{"a number in data", "", "", `{"message":{` + ok + `,"data":{"a":"x","b":5}}}`, 400, `Invalid value at 'message.data[1].value' (TYPE_STRING), 5`},
		{"a reserved data key", "", "", `{"message":{` + ok + `,"data":{"from":"x"}}}`, 400, `Invalid data payload key: from`},
		{"a banner without a collapse key", "", "", `{"message":{"token":"t1","notification":{"title":"x"},"android":{"priority":"HIGH"}}}`, 400, `collapse_key`},
		{"no token", "", "", `{"message":{"android":{"collapse_key":"n1"}}}`, 400, `"errorCode":"INVALID_ARGUMENT"`},
		{"a field FCM does not know", "", "", `{"message":{` + ok + `,"collapseKey":"x"}}`, 400, `Invalid JSON payload`},
		{"a bad ttl", "", "", `{"message":{"token":"t1","android":{"collapse_key":"n1","ttl":"60"}}}`, 400, `message.android.ttl`},
	} {
		project, bearer := cmp.Or(tc.project, s.ProjectID()), cmp.Or(tc.bearer, tok.AccessToken)
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/projects/"+project+"/messages:send", strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("%s: %d %s, want %d with %s", tc.name, resp.StatusCode, b, tc.status, tc.want)
		}
		var e struct{ Error map[string]any }
		if tc.status != 200 && (json.Unmarshal(b, &e) != nil || e.Error["code"] != float64(tc.status)) {
			t.Errorf("%s: body %s is not Google's error shape", tc.name, b)
		}
	}
	if n := len(s.Messages()); n != 1 {
		t.Errorf("took %d messages, want 1", n)
	}
}
