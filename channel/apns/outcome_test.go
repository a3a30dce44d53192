package apns

import (
	"net/http"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
)

func TestEachAPNsAnswerIsOneOutcome(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	invalidSince := time.UnixMilli(1_700_000_000_123)
	cases := []struct {
		reply       apnstest.Reply
		kind        channel.Kind
		credentials bool
		wait        time.Duration
		reason      string
	}{
		{apnstest.Reply{Status: 200}, channel.Delivered, false, 0, "APNs 200 OK"},
		{apnstest.Reply{Status: 410, Reason: "Unregistered"}, channel.TokenGone, false, 0, "APNs 410 Unregistered"},
		{apnstest.Reply{Status: 410, Reason: "ExpiredToken"}, channel.TokenGone, false, 0, "APNs 410 ExpiredToken"},
		{apnstest.Reply{Status: 410, Reason: "Unregistered", Timestamp: invalidSince}, channel.TokenGone, false, 0, "APNs 410 Unregistered"},
		{apnstest.Reply{Status: 400, Reason: "BadDeviceToken"}, channel.TokenInvalid, false, 0, "APNs 400 BadDeviceToken"},
		{apnstest.Reply{Status: 400, Reason: "DeviceTokenNotForTopic"}, channel.TokenForeign, false, 0, "APNs 400 DeviceTokenNotForTopic"},
		{apnstest.Reply{Status: 400, Reason: "PayloadEmpty"}, channel.Failed, false, 0, "APNs 400 PayloadEmpty"},
		{apnstest.Reply{Status: 400, Reason: "BadCollapseId"}, channel.Failed, false, 0, "APNs 400 BadCollapseId"},
		{apnstest.Reply{Status: 400, Reason: "BadExpirationDate"}, channel.Failed, false, 0, "APNs 400 BadExpirationDate"},
		{apnstest.Reply{Status: 400, Reason: "BadPriority"}, channel.Failed, false, 0, "APNs 400 BadPriority"},
		{apnstest.Reply{Status: 400, Reason: "MissingTopic"}, channel.Failed, true, 0, "APNs 400 MissingTopic"},
		{apnstest.Reply{Status: 400, Reason: "TopicDisallowed"}, channel.Failed, true, 0, "APNs 400 TopicDisallowed"},
		{apnstest.Reply{Status: 400, Reason: "BadTopic"}, channel.Failed, true, 0, "APNs 400 BadTopic"},
		// Apple: "Don't retry ... Forbidden"; only an expired provider
		// token is signed again and retried, with no alert.
		{apnstest.Reply{Status: 403, Reason: "InvalidProviderToken"}, channel.Failed, true, 0, "APNs 403 InvalidProviderToken"},
		{apnstest.Reply{Status: 403, Reason: "ExpiredProviderToken"}, channel.RetryAfter, false, 0, "APNs 403 ExpiredProviderToken"},
		{apnstest.Reply{Status: 403, Reason: "MissingProviderToken"}, channel.Failed, true, 0, "APNs 403 MissingProviderToken"},
		{apnstest.Reply{Status: 403, Reason: "BadCertificate"}, channel.Failed, true, 0, "APNs 403 BadCertificate"},
		{apnstest.Reply{Status: 403, Reason: "Forbidden"}, channel.Failed, true, 0, "APNs 403 Forbidden"},
		{apnstest.Reply{Status: 404, Reason: "BadPath"}, channel.Failed, false, 0, "APNs 404 BadPath"},
		{apnstest.Reply{Status: 413, Reason: "PayloadTooLarge"}, channel.Failed, false, 0, "APNs 413 PayloadTooLarge"},
		{apnstest.Reply{Status: 429, Reason: "TooManyRequests", RetryAfter: 7 * time.Second}, channel.RetryAfter, false, 7 * time.Second, "APNs 429 TooManyRequests"},
		{apnstest.Reply{Status: 429, Reason: "TooManyRequests"}, channel.RetryAfter, false, TooManyWait, "APNs 429 TooManyRequests"},
		{apnstest.Reply{Status: 429, Reason: "TooManyProviderTokenUpdates"}, channel.RetryAfter, true, 0, "APNs 429 TooManyProviderTokenUpdates"},
		{apnstest.Reply{Status: 500, Reason: "InternalServerError"}, channel.RetryAfter, false, 0, "APNs 500 InternalServerError"},
		{apnstest.Reply{Status: 503, Reason: "ServiceUnavailable"}, channel.RetryAfter, false, 0, "APNs 503 ServiceUnavailable"},
		{apnstest.Reply{Status: 503, Reason: "Shutdown", RetryAfter: time.Minute}, channel.RetryAfter, false, time.Minute, "APNs 503 Shutdown"},
		{apnstest.Reply{Status: 502}, channel.Unknown, false, 0, "APNs 502 Bad Gateway"},
	}
	msgs := messages(len(cases))
	for i, c := range cases {
		r.fake.Answer(msgs[i].Token, c.reply)
	}
	outs := r.send(t, msgs...)
	seen := byToken(r.fake.Requests())
	for i, c := range cases {
		got := outs[i]
		want := channel.Outcome{
			Kind: c.kind, Status: c.reply.Status, Code: c.reply.Reason,
			Reason: c.reason, Credentials: c.credentials, Wait: c.wait,
		}
		if c.kind == channel.Delivered {
			want.ID = seen[msgs[i].Token].APNsID
		}
		// A 410 says since when the token is invalid: the fake's time of
		// answering, or the one it was told, to the millisecond.
		switch {
		case c.reply.Status == http.StatusGone && !c.reply.Timestamp.IsZero() && !got.InvalidSince.Equal(c.reply.Timestamp):
			t.Errorf("APNs 410 with timestamp %v: InvalidSince %v", c.reply.Timestamp, got.InvalidSince)
		case c.reply.Status == http.StatusGone && c.reply.Timestamp.IsZero() && time.Since(got.InvalidSince) > time.Minute:
			t.Errorf("APNs 410: InvalidSince %v, want the fake's timestamp, just now", got.InvalidSince)
		case c.reply.Status != http.StatusGone && !got.InvalidSince.IsZero():
			t.Errorf("APNs %d: InvalidSince %v, want none", c.reply.Status, got.InvalidSince)
		}
		got.InvalidSince = time.Time{}
		if got != want {
			t.Errorf("APNs %d %s:\n got %+v\nwant %+v", c.reply.Status, c.reply.Reason, got, want)
		}
	}
	if got := outs[0].ID; len(got) != 36 {
		t.Errorf("delivered ID %q, want the apns-id the fake answered, a UUID", got)
	}
}

func TestFailuresScriptedForTheNextRequestsAreRetried(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.Concurrency = 1 })
	r.fake.FailNext(2, apnstest.Reply{Status: http.StatusServiceUnavailable, Reason: "Shutdown"})
	count := map[channel.Kind]int{}
	for _, o := range r.send(t, messages(3)...) {
		count[o.Kind]++
	}
	if count[channel.RetryAfter] != 2 || count[channel.Delivered] != 1 {
		t.Errorf("outcomes %v, want 2 retry_after then 1 delivered", count)
	}
}

func TestAMessageThatCannotBeSentIsAnsweredWithoutARequest(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	bad := message(0)
	bad.Token = "not-hex/../../"
	huge := message(1)
	huge.Data = map[string]any{"digest": string(make([]byte, 5000))}
	unencodable := message(2)
	unencodable.Data = map[string]any{"f": func() {}}

	outs := r.send(t, bad, huge, unencodable)
	if o := outs[0]; o.Kind != channel.TokenInvalid || o.Status != 0 {
		t.Errorf("malformed token: %+v, want token_invalid without an answer", o)
	}
	if o := outs[1]; o.Kind != channel.Failed || o.Code != "PayloadTooLarge" || o.Status != 0 {
		t.Errorf("data over 4096 bytes: %+v, want failed PayloadTooLarge without an answer", o)
	}
	if o := outs[2]; o.Kind != channel.Failed || o.Status != 0 {
		t.Errorf("data that is not JSON: %+v, want failed without an answer", o)
	}
	if n := len(r.fake.Requests()); n != 0 {
		t.Errorf("the fake received %d requests, want none", n)
	}
}
