package central_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/central"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

// Central's address opened in a browser, or tried with curl, says where to
// go: to the inbox when central serves it, or else where the API is.
func TestTheRootSendsABrowserToTheInboxOrSaysWhereTheAPIIs(t *testing.T) {
	t.Parallel()
	pool := pgtest.Connect(t, pgtest.DB(t))
	iss := oidctest.New(t)
	users, err := auth.NewUserVerifier(auth.UserVerifierConfig{JWKSURL: iss.JWKSURL(), Issuer: iss.URL(), Audience: oidctest.Audience, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(users.Close)
	serve := func(inbox bool) string {
		srv, err := central.New(central.Config{DB: pool, Users: users, Inbox: inbox, Registry: httpapi.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		ts := httptest.NewServer(srv)
		t.Cleanup(ts.Close)
		return ts.URL
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	t.Run("with the inbox, a redirect to it", func(t *testing.T) {
		resp, err := noRedirect.Get(serve(true) + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/inbox" {
			t.Errorf("GET / = %d, Location %q; want 302 to /inbox", resp.StatusCode, resp.Header.Get("Location"))
		}
	})
	t.Run("without it, a 404 naming the API, its description and the inbox", func(t *testing.T) {
		resp, err := noRedirect.Get(serve(false) + "/")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p struct{ Type, Detail string }
		if err := json.Unmarshal(raw, &p); err != nil || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("GET / = %d %s %q; want a problem document", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
		}
		if resp.StatusCode != http.StatusNotFound || !strings.HasSuffix(p.Type, ":not-found") {
			t.Errorf("GET / = %d %s; want 404 not-found", resp.StatusCode, p.Type)
		}
		for _, want := range []string{"/v1/notifications", "/openapi.yaml", "/inbox", "--inbox"} {
			if !strings.Contains(p.Detail, want) {
				t.Errorf("GET / detail %q does not mention %s", p.Detail, want)
			}
		}
	})
}
