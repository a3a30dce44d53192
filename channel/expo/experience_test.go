package expo_test

import (
	"context"
	"testing"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/expo/expotest"
)

// A request mixing two projects' tokens: this app's project is the one
// configured, else the one holding most of the request's tokens; the
// other's tokens are TokenForeign, and this app's are sent on their own.
func TestARequestMixingProjectsSendsThisAppsTokensAndNamesTheOthersForeign(t *testing.T) {
	t.Parallel()
	msgs := []channel.Message{
		{Token: "ExponentPushToken[a1]", ID: "n1", Title: "T"},
		{Token: "ExponentPushToken[b1]", ID: "n1", Title: "T"},
		{Token: "ExponentPushToken[a2]", ID: "n1", Title: "T"},
	}
	for _, tc := range []struct {
		name, experience string
		want             []channel.Kind
	}{
		{"by majority", "", []channel.Kind{channel.Accepted, channel.TokenForeign, channel.Accepted}},
		{"as configured", "@other/app", []channel.Kind{channel.TokenForeign, channel.Accepted, channel.TokenForeign}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fake := expotest.New()
			fake.SetExperience("ExponentPushToken[b1]", "@other/app")
			ch, err := expo.NewChannel(expo.ChannelConfig{Sender: newClient(t, fake), Experience: tc.experience})
			if err != nil {
				t.Fatal(err)
			}
			out := ch.Send(context.Background(), msgs)
			for i, o := range out {
				if o.Kind != tc.want[i] {
					t.Errorf("%s: %v (%s), want %v", msgs[i].Token, o.Kind, o.Reason, tc.want[i])
				}
				if o.Kind == channel.TokenForeign && (o.Code != expo.TooManyExperiences || o.Status != 400) {
					t.Errorf("%s: %+v, want Expo's 400 and code", msgs[i].Token, o)
				}
			}
			if got := fake.Requests("send"); got != 2 {
				t.Errorf("%d requests, want 2: the refused one and this app's own", got)
			}
		})
	}
}

// A request whose tokens are all of one project other than the configured
// one is not refused by Expo, and not second-guessed here either.
func TestARequestOfOneProjectIsSentAsItIs(t *testing.T) {
	t.Parallel()
	fake := expotest.New()
	ch, err := expo.NewChannel(expo.ChannelConfig{Sender: newClient(t, fake), Experience: "@other/app"})
	if err != nil {
		t.Fatal(err)
	}
	out := ch.Send(context.Background(), []channel.Message{{Token: "ExponentPushToken[a1]", ID: "n1", Title: "T"}})
	if out[0].Kind != channel.Accepted {
		t.Errorf("%+v, want accepted", out[0])
	}
}
