package fcm_test

import (
	"context"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
	"github.com/spoolcast/spoolcast/internal/clock"
)

func TestAMessageFCMTakesIsDeliveredUnderFCMsName(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	out := ch.Send(context.Background(), []channel.Message{msg(1)})
	got := fake.Messages()
	if len(got) != 1 {
		t.Fatalf("fake took %d messages, want 1", len(got))
	}
	want := channel.Outcome{Kind: channel.Delivered, ID: "projects/spoolcast-test/messages/0:1", Status: 200}
	if len(out) != 1 || out[0] != want || got[0].Name != want.ID {
		t.Errorf("outcome %+v (fake named it %q), want %+v", out, got[0].Name, want)
	}
	if ch.Provider() != "fcm" || ch.MaxBatch() != 500 {
		t.Errorf("Provider %q, MaxBatch %d", ch.Provider(), ch.MaxBatch())
	}
}

func TestTheBodyCarriesTheNotificationItsDataAndHowToDeliverIt(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	fake := startFake(t, fcmtest.Config{})
	ch := newChannel(t, fake, fcm.Config{Clock: clock.Frozen(now)})
	urgent := channel.Message{
		Token: token(1), ID: "ntf_01", Title: "Build failed", Body: "main is red <again> & again", Category: "ci",
		Data: map[string]any{
			"note": "as is", "count": 3, "ok": true, "digest": []any{"a", "b"}, "nothing": nil,
			"id": "spoofed", "from": "x", "google.c.a.e": "1", "gcm.n.e": "1", // FCM's own keys are left out
		},
		Urgent: true, Expires: now.Add(90 * time.Second),
	}
	digest := channel.Message{Token: token(2), ID: "ntf_02", Body: "3 new", CollapseKey: "digest:u1"}
	silent := channel.Message{Token: token(3), ID: "ntf_03"}
	out := ch.Send(context.Background(), []channel.Message{urgent, digest, silent})
	if count(out, channel.Delivered) != 3 {
		t.Fatalf("outcomes %+v", out)
	}
	got := byToken(fake)

	want := fcmtest.Message{
		Token:        token(1),
		Notification: &fcmtest.Notification{Title: "Build failed", Body: "main is red <again> & again"},
		Data: map[string]string{"id": "ntf_01", "category": "ci", "note": "as is", "count": "3", "ok": "true",
			"digest": `["a","b"]`, "nothing": "null"},
		Android: fcmtest.Android{CollapseKey: "ntf_01", Priority: "HIGH", TTL: "90s", Notification: &fcmtest.AndroidNotification{Tag: "ntf_01"}},
		APNs: fcmtest.APNs{Headers: map[string]string{"apns-collapse-id": "ntf_01", "apns-priority": "10",
			"apns-expiration": unix(now.Add(90 * time.Second))}},
	}
	if g := strip(got[token(1)]); !reflect.DeepEqual(g, want) {
		t.Errorf("urgent message:\n got %+v\nwant %+v", g, want)
	}

	want = fcmtest.Message{
		Token:        token(2),
		Notification: &fcmtest.Notification{Body: "3 new"},
		Data:         map[string]string{"id": "ntf_02"},
		Android:      fcmtest.Android{CollapseKey: "digest:u1", Priority: "NORMAL", TTL: "86400s", Notification: &fcmtest.AndroidNotification{Tag: "digest:u1"}},
		APNs: fcmtest.APNs{Headers: map[string]string{"apns-collapse-id": "digest:u1", "apns-priority": "5",
			"apns-expiration": unix(now.Add(24 * time.Hour))}},
	}
	if g := strip(got[token(2)]); !reflect.DeepEqual(g, want) {
		t.Errorf("digest message:\n got %+v\nwant %+v", g, want)
	}

	// No title and no body: a data message, with no notification to tag.
	if g := got[token(3)]; g.Notification != nil || g.Android.Notification != nil || g.Data["id"] != "ntf_03" {
		t.Errorf("silent message %+v, want data alone", strip(g))
	}
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// strip leaves what the test compares: no name, bearer or raw body.
func strip(m fcmtest.Message) fcmtest.Message {
	m.Name, m.Bearer, m.Body = "", "", nil
	return m
}

func TestAMessageWhoseDataCannotBeSentFailsAloneAndTheRestGo(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	batch := msgs(3)
	batch[1].Data = map[string]any{"f": func() {}}
	out := ch.Send(context.Background(), batch)
	if k := kinds(out); !reflect.DeepEqual(k, []channel.Kind{channel.Delivered, channel.Failed, channel.Delivered}) {
		t.Fatalf("kinds %v (%+v)", k, out)
	}
	if out[1].Reason == "" || len(fake.Messages()) != 2 {
		t.Errorf("failed outcome %+v; fake took %d", out[1], len(fake.Messages()))
	}
}

func TestEachFCMErrorGivesItsOutcome(t *testing.T) {
	t.Parallel()
	with := func(e fcmtest.Error, retryAfter string) fcmtest.Error { e.RetryAfter = retryAfter; return e }
	notFound := fcmtest.Error{Code: 404, Status: "NOT_FOUND", Message: "Requested entity was not found."}
	for _, tc := range []struct {
		name string
		err  fcmtest.Error
		want channel.Outcome
	}{
		{"UNREGISTERED: the token is gone", fcmtest.Unregistered, channel.Outcome{Kind: channel.TokenGone, Status: 404, Code: "UNREGISTERED",
			Reason: "FCM 404 UNREGISTERED: Requested entity was not found."}},
		{"INVALID_ARGUMENT in words about the token: the token is invalid", fcmtest.InvalidToken, channel.Outcome{Kind: channel.TokenInvalid, Status: 400, Code: "INVALID_ARGUMENT",
			Reason: "FCM 400 INVALID_ARGUMENT: The registration token is not a valid FCM registration token"}},
		{"INVALID_ARGUMENT on the field message.token: the token is invalid", fcmtest.InvalidTokenField, channel.Outcome{Kind: channel.TokenInvalid, Status: 400, Code: "INVALID_ARGUMENT",
			Reason: `FCM 400 INVALID_ARGUMENT: Invalid value at 'message.token' (TYPE_STRING), "x"`}},
		{"INVALID_ARGUMENT on another field: the message failed", fcmtest.InvalidArgument, channel.Outcome{Kind: channel.Failed, Status: 400, Code: "INVALID_ARGUMENT",
			Reason: `FCM 400 INVALID_ARGUMENT: Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), "x"`}},
		{"SENDER_ID_MISMATCH: the token is another project's app's", fcmtest.SenderIDMismatch, channel.Outcome{Kind: channel.TokenForeign, Status: 403, Code: "SENDER_ID_MISMATCH",
			Reason: "FCM 403 SENDER_ID_MISMATCH: SenderId mismatch"}},
		{"QUOTA_EXCEEDED without Retry-After waits FCM's minute", fcmtest.QuotaExceeded, channel.Outcome{Kind: channel.RetryAfter, Wait: time.Minute, Status: 429, Code: "QUOTA_EXCEEDED",
			Reason: "FCM 429 QUOTA_EXCEEDED: Sending limit exceeded for the message target."}},
		{"QUOTA_EXCEEDED waits its Retry-After", with(fcmtest.QuotaExceeded, "30"), channel.Outcome{Kind: channel.RetryAfter, Wait: 30 * time.Second, Status: 429, Code: "QUOTA_EXCEEDED",
			Reason: "FCM 429 QUOTA_EXCEEDED: Sending limit exceeded for the message target."}},
		{"UNAVAILABLE is tried again", fcmtest.Unavailable, channel.Outcome{Kind: channel.RetryAfter, Status: 503, Code: "UNAVAILABLE",
			Reason: "FCM 503 UNAVAILABLE: The service is currently unavailable."}},
		{"UNAVAILABLE waits its Retry-After", with(fcmtest.Unavailable, "120"), channel.Outcome{Kind: channel.RetryAfter, Wait: 2 * time.Minute, Status: 503, Code: "UNAVAILABLE",
			Reason: "FCM 503 UNAVAILABLE: The service is currently unavailable."}},
		{"INTERNAL is tried again", fcmtest.Internal, channel.Outcome{Kind: channel.RetryAfter, Status: 500, Code: "INTERNAL",
			Reason: "FCM 500 INTERNAL: Internal error encountered."}},
		{"THIRD_PARTY_AUTH_ERROR fails on the app's credentials", fcmtest.ThirdPartyAuth, channel.Outcome{Kind: channel.Failed, Status: 401, Code: "THIRD_PARTY_AUTH_ERROR", Credentials: true,
			Reason: "FCM 401 THIRD_PARTY_AUTH_ERROR: Auth error from APNS or Web Push Service"}},
		{"UNAUTHENTICATED once is a token to fetch again, tried again", fcmtest.Unauthenticated, channel.Outcome{Kind: channel.RetryAfter, Status: 401, Code: "UNAUTHENTICATED",
			Reason: "FCM 401 UNAUTHENTICATED: " + fcmtest.Unauthenticated.Message}},
		{"PERMISSION_DENIED is our credentials, tried again", fcmtest.PermissionDenied, channel.Outcome{Kind: channel.RetryAfter, Status: 403, Code: "PERMISSION_DENIED", Credentials: true,
			Reason: "FCM 403 PERMISSION_DENIED: " + fcmtest.PermissionDenied.Message}},
		{"NOT_FOUND without UNREGISTERED disables no token", notFound, channel.Outcome{Kind: channel.Failed, Status: 404, Code: "NOT_FOUND",
			Reason: "FCM 404 NOT_FOUND: Requested entity was not found."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fake, ch := setup(t)
			fake.FailToken(token(1), tc.err)
			out := ch.Send(context.Background(), []channel.Message{msg(1), msg(2)})
			if out[0] != tc.want {
				t.Errorf("outcome\n got %+v\nwant %+v", out[0], tc.want)
			}
			if out[1].Kind != channel.Delivered {
				t.Errorf("the other message: %+v, want delivered", out[1])
			}
		})
	}
}

func TestRetryAfterAsAnHTTPDateIsTheWaitUntilThen(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	fake := startFake(t, fcmtest.Config{})
	ch := newChannel(t, fake, fcm.Config{Clock: clock.Frozen(now)})
	e := fcmtest.Unavailable
	e.RetryAfter = now.Add(45 * time.Second).Format(http.TimeFormat)
	fake.FailNext(1, e)
	q := fcmtest.QuotaExceeded
	q.RetryAfter = now.Add(10 * time.Minute).Format(http.TimeFormat)
	fake.FailNext(1, q)
	for _, want := range []time.Duration{45 * time.Second, 10 * time.Minute} {
		if out := ch.Send(context.Background(), []channel.Message{msg(1)}); out[0].Kind != channel.RetryAfter || out[0].Wait != want {
			t.Errorf("outcome %+v, want RetryAfter after %v", out[0], want)
		}
	}
	if out := ch.Send(context.Background(), []channel.Message{msg(1)}); out[0].Kind != channel.Delivered {
		t.Errorf("after the outage: %+v, want delivered", out[0])
	}
}

func TestOutcomesComeInTheOrderOfTheMessages(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	fake.FailToken(token(1), fcmtest.Unregistered)
	fake.FailToken(token(3), fcmtest.InvalidToken)
	out := ch.Send(context.Background(), msgs(5))
	want := []channel.Kind{channel.Delivered, channel.TokenGone, channel.Delivered, channel.TokenInvalid, channel.Delivered}
	if !reflect.DeepEqual(kinds(out), want) {
		t.Fatalf("kinds %v, want %v", kinds(out), want)
	}
	got := byToken(fake)
	for _, i := range []int{0, 2, 4} {
		if out[i].ID != got[token(i)].Name {
			t.Errorf("message %d: id %q, fake named it %q", i, out[i].ID, got[token(i)].Name)
		}
	}
}

func TestRequestsInFlightAreCappedAcrossSends(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{})
	ch := newChannel(t, fake, fcm.Config{Concurrency: 3})
	fake.SetDelay(20 * time.Millisecond)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if out := ch.Send(context.Background(), msgs(6)); count(out, channel.Delivered) != 6 {
				t.Errorf("outcomes %+v", out)
			}
		})
	}
	wg.Wait()
	if got := fake.MaxInFlight(); got != 3 {
		t.Errorf("at most %d requests in flight, want 3", got)
	}
}

func TestAProjectOtherThanTheAccountsIsRefusedAsOurCredentials(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{})
	ch := newChannel(t, fake, fcm.Config{ProjectID: "someone-else"})
	out := ch.Send(context.Background(), []channel.Message{msg(1)})
	if o := out[0]; o.Kind != channel.RetryAfter || !o.Credentials || o.Code != "PERMISSION_DENIED" {
		t.Errorf("outcome %+v, want RetryAfter, Credentials, PERMISSION_DENIED", o)
	}
}
