package apns

import (
	"testing"
	"time"

	"github.com/sideshow/apns2/token"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
)

func TestTheFakeAcceptsOnlyTheTeamsKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		edit func(*Config)
		want channel.Outcome
	}{
		{"the team's key, key id and team id", func(*Config) {}, channel.Outcome{Kind: channel.Delivered, Status: 200}},
		{"another key", func(c *Config) { c.Key = apnstest.NewKey() }, refused("InvalidProviderToken")},
		{"another key id", func(c *Config) { c.KeyID = "OTHERKEY12" }, refused("InvalidProviderToken")},
		{"another team id", func(c *Config) { c.TeamID = "OTHERTEAM1" }, refused("InvalidProviderToken")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, c.edit)
			got := r.send(t, message(0))[0]
			got.ID, got.Reason = "", ""
			if got != c.want {
				t.Errorf("outcome %+v, want %+v", got, c.want)
			}
		})
	}
}

// refused is the outcome of a 403 refusing the provider token: final, and
// an operator's alert.
func refused(reason string) channel.Outcome {
	return channel.Outcome{Kind: channel.Failed, Status: 403, Code: reason, Credentials: true}
}

func TestAnAgingJWTIsSignedAgainBeforeTheHour(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.send(t, message(0))
	r.ch.token.Lock()
	r.ch.token.IssuedAt = time.Now().Unix() - token.TokenTimeout // apns2's renewal age
	r.ch.token.Unlock()

	if o := r.send(t, message(1))[0]; o.Kind != channel.Delivered {
		t.Fatalf("outcome %+v, want delivered", o)
	}
	reqs := r.fake.Requests()
	if reqs[1].JWT == reqs[0].JWT {
		t.Error("the second request carried the first JWT, want a new one")
	}
	if reqs[1].IssuedAt.Before(reqs[0].IssuedAt) || reqs[1].Status != 200 {
		t.Errorf("new JWT issued %v, answered %d; want issued no earlier than %v, and accepted",
			reqs[1].IssuedAt, reqs[1].Status, reqs[0].IssuedAt)
	}
	if n := r.fake.JWTs(); n != 2 {
		t.Errorf("the fake saw %d JWTs, want 2", n)
	}
}

func TestAJWTOlderThanAnHourIsRefusedThenRenewedOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.fake.SetClock(func() time.Time { return time.Now().Add(61 * time.Minute) })

	got := r.send(t, message(0))[0]
	got.Reason = ""
	// Expired: signed again and sent again, with no alert (it heals).
	if want := (channel.Outcome{Kind: channel.RetryAfter, Status: 403, Code: "ExpiredProviderToken"}); got != want {
		t.Fatalf("outcome %+v, want %+v", got, want)
	}
	expired := r.fake.Requests()[0].JWT

	// Another answer to the same JWT, come late, must not renew again.
	r.ch.renewToken("bearer " + expired)
	r.fake.SetClock(time.Now)
	for i, o := range r.send(t, messages(5)...) {
		if o.Kind != channel.Delivered {
			t.Errorf("message %d after renewal: %+v, want delivered", i, o)
		}
	}
	for _, req := range r.fake.Requests()[1:] {
		if req.JWT == expired {
			t.Error("a request after the refusal carried the expired JWT")
		}
	}
	if n := r.fake.JWTs(); n != 2 {
		t.Errorf("the fake saw %d JWTs, want 2: the expired one and one renewal", n)
	}
}
