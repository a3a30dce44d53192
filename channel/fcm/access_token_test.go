package fcm_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

func TestTheGrantIsSignedByTheAccountForFCMsScope(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	if out := ch.Send(context.Background(), []channel.Message{msg(1)}); out[0].Kind != channel.Delivered {
		t.Fatalf("outcome %+v", out[0])
	}
	grants, acct := fake.Grants(), fake.Account()
	if len(grants) != 1 {
		t.Fatalf("%d grants, want 1", len(grants))
	}
	g := grants[0]
	if g.KeyID != acct.PrivateKeyID || g.Issuer != acct.ClientEmail || g.Audience != fake.TokenURL() ||
		g.Scope != fcmtest.Scope || g.Expires.Sub(g.IssuedAt) != time.Hour {
		t.Errorf("grant %+v, want kid %s, iss %s, aud %s, scope %s, an hour long",
			g, acct.PrivateKeyID, acct.ClientEmail, fake.TokenURL(), fcmtest.Scope)
	}
	if got := fake.Messages()[0].Bearer; got == "" || fake.TokensIssued() != 1 {
		t.Errorf("bearer %q, %d tokens issued", got, fake.TokensIssued())
	}
}

func TestATokenIsReusedUntilNearItsExpiry(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	if out := ch.Send(context.Background(), msgs(100)); count(out, channel.Delivered) != 100 {
		t.Fatalf("outcomes %+v", out)
	}
	for i := range 10 {
		if out := ch.Send(context.Background(), []channel.Message{msg(i)}); out[0].Kind != channel.Delivered {
			t.Fatalf("outcome %+v", out[0])
		}
	}
	if n := fake.TokensIssued(); n != 1 {
		t.Errorf("%d tokens issued for 110 messages, want 1", n)
	}
}

// The refresh is timed by oauth2 on the wall clock, which no test can
// move: the token here is good for 1.5 s, then replaced.
func TestATokenIsReplacedBeforeItExpires(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{TokenLifetime: 4 * time.Second})
	ch := newChannel(t, fake, fcm.Config{TokenRefresh: 2500 * time.Millisecond})
	send := func() {
		t.Helper()
		if out := ch.Send(context.Background(), []channel.Message{msg(1)}); out[0].Kind != channel.Delivered {
			t.Fatalf("outcome %+v", out[0])
		}
	}
	send()
	fetched := time.Now() // the token was fetched before this
	send()
	if n := fake.TokensIssued(); n != 1 {
		t.Fatalf("%d tokens issued for two sends within the token's first 1.5 s, want 1", n)
	}
	time.Sleep(time.Until(fetched.Add(1550 * time.Millisecond)))
	send()
	got := fake.Messages()
	if n := fake.TokensIssued(); n != 2 || got[2].Bearer == got[0].Bearer {
		t.Errorf("%d tokens issued, the third send's bearer new: %v; want 2, true", n, got[2].Bearer != got[0].Bearer)
	}
	if n := fake.BadBearers(); n != 0 {
		t.Errorf("%d requests went with an expired token", n)
	}
}

// One 401 is a token FCM no longer takes (revoked, or expired early): the
// next Send's fresh token heals it, and no operator is paged. A fresh token
// refused too is the service account's, an operator's to fix; a token
// taken since makes the next 401 a first one again.
func TestOnlyAFreshTokenRefusedTooIsOurCredentials(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	fake.FailNext(2, fcmtest.Unauthenticated)
	first := ch.Send(context.Background(), msgs(1))[0]
	second := ch.Send(context.Background(), msgs(1))[0]
	if first.Kind != channel.RetryAfter || first.Credentials {
		t.Errorf("the first 401: %+v, want RetryAfter without Credentials", first)
	}
	if second.Kind != channel.RetryAfter || !second.Credentials {
		t.Errorf("a fresh token refused too: %+v, want RetryAfter, Credentials", second)
	}
	if out := ch.Send(context.Background(), msgs(1)); count(out, channel.Delivered) != 1 {
		t.Fatalf("the third send: %+v, want delivered", out)
	}
	fake.FailNext(1, fcmtest.Unauthenticated)
	if o := ch.Send(context.Background(), msgs(1))[0]; o.Kind != channel.RetryAfter || o.Credentials {
		t.Errorf("a 401 after a token was taken: %+v, want RetryAfter without Credentials", o)
	}
	if n := fake.TokensIssued(); n != 3 {
		t.Errorf("%d tokens issued, want 3 (the first, the fresh one refused, the one taken)", n)
	}
}

func TestATokenExpiringWithinTheRefreshMarginIsFetchedForEachSend(t *testing.T) {
	t.Parallel()
	// A minute's token under the default five minutes' margin: never
	// good enough to keep, and never sent expired.
	fake := startFake(t, fcmtest.Config{TokenLifetime: time.Minute})
	ch := newChannel(t, fake, fcm.Config{})
	for range 3 {
		if out := ch.Send(context.Background(), msgs(2)); count(out, channel.Delivered) != 2 {
			t.Fatalf("outcomes %+v", out)
		}
	}
	if n, bad := fake.TokensIssued(), fake.BadBearers(); n != 3 || bad != 0 {
		t.Errorf("%d tokens issued, %d requests with an expired one; want 3 (one a Send), 0", n, bad)
	}
}

func TestATokenFCMRefusesIsReplacedForTheNextSend(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	ch.Send(context.Background(), []channel.Message{msg(1)})
	fake.ExpireTokens() // revoked, or expired by a clock ahead of ours
	out := ch.Send(context.Background(), msgs(3))
	for _, o := range out {
		if o.Kind != channel.RetryAfter || o.Credentials || o.Code != "UNAUTHENTICATED" || o.Status != 401 {
			t.Errorf("outcome %+v, want RetryAfter (401 UNAUTHENTICATED), not yet our credentials: a fresh token heals it", o)
		}
	}
	if out := ch.Send(context.Background(), msgs(3)); count(out, channel.Delivered) != 3 {
		t.Errorf("the next send: %+v, want delivered with a new token", out)
	}
	if n := fake.TokensIssued(); n != 2 {
		t.Errorf("%d tokens issued, want 2", n)
	}
}

func TestARefusedGrantIsRetryAfterOnOurCredentialsAndSendsNothing(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	fake.RefuseGrants(true)
	want := channel.Outcome{Kind: channel.RetryAfter, Code: "invalid_grant", Credentials: true,
		Reason: "OAuth token endpoint 400 invalid_grant: Invalid JWT Signature."}
	for _, o := range ch.Send(context.Background(), msgs(3)) {
		if o != want {
			t.Errorf("outcome\n got %+v\nwant %+v", o, want)
		}
	}
	if n := fake.Requests(); n != 0 {
		t.Errorf("FCM got %d requests, want none", n)
	}
	fake.RefuseGrants(false)
	if out := ch.Send(context.Background(), msgs(3)); count(out, channel.Delivered) != 3 {
		t.Errorf("once the grant is taken: %+v", out)
	}
}

func TestAGrantFromAnAccountTheEndpointDoesNotKnowIsRefused(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{})
	stranger := *fake.Account()
	stranger.PrivateKeyID = "a-deleted-key"
	ch := newChannel(t, fake, fcm.Config{Credentials: stranger.JSON()})
	o := ch.Send(context.Background(), []channel.Message{msg(1)})[0]
	if o.Kind != channel.RetryAfter || !o.Credentials || o.Code != "invalid_grant" {
		t.Errorf("outcome %+v, want RetryAfter, Credentials, invalid_grant", o)
	}
	if fake.RefusedGrants() != 1 || fake.Requests() != 0 {
		t.Errorf("%d grants refused, %d requests to FCM; want 1, 0", fake.RefusedGrants(), fake.Requests())
	}
}

func TestATokenEndpointThatIsDownIsRetryAfterNotOurCredentials(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	fake.FailTokens(http.StatusServiceUnavailable)
	want := channel.Outcome{Kind: channel.RetryAfter, Code: "internal_failure",
		Reason: "OAuth token endpoint 503 internal_failure: Backend Error"}
	if o := ch.Send(context.Background(), []channel.Message{msg(1)})[0]; o != want {
		t.Errorf("outcome\n got %+v\nwant %+v", o, want)
	}
}

func TestATokenEndpointOutOfReachIsRetryAfterNotOurCredentials(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{})
	acct := *fake.Account()
	acct.TokenURI = closedURL(t) + "/token"
	path := filepath.Join(t.TempDir(), "sa.json")
	if err := acct.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	ch := newChannel(t, fake, fcm.Config{CredentialsFile: path})
	o := ch.Send(context.Background(), []channel.Message{msg(1)})[0]
	if o.Kind != channel.RetryAfter || o.Credentials || o.Reason == "" {
		t.Errorf("outcome %+v, want RetryAfter, not Credentials, with a reason", o)
	}
	if fake.Requests() != 0 {
		t.Errorf("FCM got %d requests, want none", fake.Requests())
	}
}

// closedURL is the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}
