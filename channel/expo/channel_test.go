package expo_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/expo/expotest"
)

func newChannel(t *testing.T, fake *expotest.Server, results map[string]int) *expo.Channel {
	t.Helper()
	ch, err := expo.NewChannel(expo.ChannelConfig{Sender: newClient(t, fake), OnResult: func(r string) { results[r]++ }})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func TestEachTicketIsOneOutcomeOfTheChannelsVocabulary(t *testing.T) {
	t.Parallel()
	fake := expotest.New()
	fake.Unregister("ExponentPushToken[gone]")
	fake.ExceedRate("ExponentPushToken[busy]", 1)
	fake.FailAtTicket("ExponentPushToken[sender]", expo.MismatchSenderID)
	fake.FailAtTicket("ExponentPushToken[creds]", expo.InvalidCredentials)
	results := map[string]int{}
	ch := newChannel(t, fake, results)
	out := ch.Send(context.Background(), []channel.Message{
		{Token: "ExponentPushToken[ok]", ID: "n1", Title: "T", Category: "news", Urgent: true},
		{Token: "ExponentPushToken[gone]", ID: "n1"},
		{Token: "ExponentPushToken[busy]", ID: "n1"},
		{Token: "ExponentPushToken[sender]", ID: "n1"},
		{Token: "ExponentPushToken[creds]", ID: "n1"},
	})
	if out[0].Kind != channel.Accepted || out[0].ID == "" {
		t.Errorf("ok: %+v, want accepted with its ticket", out[0])
	}
	if out[1].Kind != channel.TokenGone || !strings.HasPrefix(out[1].Reason, expo.DeviceNotRegistered) {
		t.Errorf("gone: %+v", out[1])
	}
	if out[2].Kind != channel.RetryAfter || out[2].Wait != time.Minute {
		t.Errorf("busy: %+v, want retry after a minute", out[2])
	}
	if out[3].Kind != channel.TokenForeign || out[3].Credentials || !strings.HasPrefix(out[3].Reason, expo.MismatchSenderID) {
		t.Errorf("MismatchSenderId: %+v, want the token another app's, no credentials", out[3])
	}
	if out[4].Kind != channel.Failed || !out[4].Credentials || !strings.HasPrefix(out[4].Reason, expo.InvalidCredentials) {
		t.Errorf("InvalidCredentials: %+v, want failed on the deployment's credentials", out[4])
	}
	m := fake.Messages()[0]
	if m.Data["notification_id"] != "n1" || m.Data["category"] != "news" || m.Priority != "high" || m.Sound != "default" {
		t.Errorf("Expo got %+v", m)
	}
	if results[expo.ResultOK] != 1 || results[expo.ResultError] != 4 {
		t.Errorf("results %v", results)
	}
}

func TestARequestExpoDidNotTakeIsRetryAfterAndOneItMayHaveTakenIsUnknown(t *testing.T) {
	t.Parallel()
	fake := expotest.New()
	ch := newChannel(t, fake, map[string]int{})
	msg := []channel.Message{{Token: "ExponentPushToken[a]", ID: "n1"}}
	fake.SetFailing(http.StatusServiceUnavailable, "")
	if o := ch.Send(context.Background(), msg)[0]; o.Kind != channel.RetryAfter || o.Status != 503 {
		t.Errorf("503: %+v", o)
	}
	// A wait Expo named that the pass's lease cannot hold is handed on, for
	// the dispatcher to defer the push to it.
	fake.SetFailing(http.StatusTooManyRequests, "120")
	if o := ch.Send(channel.WithRetryBudget(context.Background(), time.Second), msg)[0]; o.Kind != channel.RetryAfter || o.Status != 429 || o.Wait != 2*time.Minute {
		t.Errorf("429 with Retry-After 120: %+v, want retry after 2m", o)
	}
	fake.SetFailing(0, "")
	fake.DropAnswers(1)
	if o := ch.Send(context.Background(), msg)[0]; o.Kind != channel.Unknown {
		t.Errorf("answer lost: %+v, want unknown", o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if o := ch.Send(ctx, msg)[0]; o.Kind != channel.NotSent {
		t.Errorf("ctx ended first: %+v, want not sent", o)
	}
}

func TestAMessageOverExposLimitIsShortenedNotRefused(t *testing.T) {
	t.Parallel()
	m := expo.Fit(expo.Message{To: "ExponentPushToken[a]", Title: "T", Body: strings.Repeat("é", 4000)})
	if size, _ := expo.Size(m); size > expo.MaxMessageBytes || !strings.HasSuffix(m.Body, "…") {
		t.Errorf("size %d, body ends %q", size, m.Body[len(m.Body)-4:])
	}
}
