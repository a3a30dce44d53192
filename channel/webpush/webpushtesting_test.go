package webpush

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/webpush/webpushtest"
	"github.com/spoolcast/spoolcast/internal/clock"
)

// TestWebPushTestingTakesWhatWeSend holds the sender to an implementation
// of the protocol we did not write: web-push-testing (npm), a push service
// stand-in that decrypts every message with the subscription's private key
// (http_ece) and verifies its VAPID token (jsonwebtoken, against the
// subscription's applicationServerKey) before it keeps the plaintext. It
// does not report the TTL, Urgency and Topic headers (it checks only that
// TTL is a number); TestSendPostsOneEncryptedMessageWithItsHeaders does.
func TestWebPushTestingTakesWhatWeSend(t *testing.T) {
	t.Parallel()
	svc := webpushtest.Start(t)
	key := newKey(t)

	t.Run("messages arrive decrypted, byte for byte", func(t *testing.T) {
		t.Parallel()
		sub, hash := subscribe(t, svc, key.PublicKey())
		sender := newSender(t, key)
		payloads := []string{
			`{"title":"Build finished","body":"spoolcast#1234 passed"}`,
			"héllo, wörld ✓ 🚀",
			"",
			strings.Repeat("x", MaxPayload),
		}
		msgs := []Message{
			{TTL: time.Hour, Urgency: UrgencyHigh, Topic: TopicFor("build:1234")},
			{TTL: -1, Urgency: UrgencyVeryLow},
			{},
			{Urgency: UrgencyNormal},
		}
		for i, p := range payloads {
			msgs[i].Payload = []byte(p)
			res := sender.Send(context.Background(), sub, msgs[i])
			if res.Outcome != Delivered || res.Status != http.StatusCreated {
				t.Fatalf("send %d: %v %d: %v", i, res.Outcome, res.Status, res.Err)
			}
		}
		got := svc.Messages(t, hash)
		if len(got) != len(payloads) {
			t.Fatalf("the push service has %d messages, want %d", len(got), len(payloads))
		}
		for i := range payloads {
			if got[i] != payloads[i] {
				t.Errorf("message %d decrypted as %.80q, want %.80q", i, got[i], payloads[i])
			}
		}
	})

	t.Run("a token signed with another key is rejected", func(t *testing.T) {
		t.Parallel()
		sub, hash := subscribe(t, svc, key.PublicKey())
		other := newKey(t)
		// Another key, named in k: refused as not the subscription's.
		res := newSender(t, other).Send(context.Background(), sub, Message{Payload: []byte("a")})
		if res.Outcome != Rejected || res.Status != http.StatusBadRequest {
			t.Errorf("another key: %v %d (%v), want rejected 400", res.Outcome, res.Status, res.Err)
		}
		// The subscription's key in k, but signed by another: refused when
		// the signature is checked.
		forged := *other
		forged.public = key.public
		res = newSender(t, &forged).Send(context.Background(), sub, Message{Payload: []byte("b")})
		if res.Outcome != Rejected || res.Status != http.StatusBadRequest {
			t.Errorf("forged signature: %v %d (%v), want rejected 400", res.Outcome, res.Status, res.Err)
		}
		if got := svc.Messages(t, hash); len(got) != 0 {
			t.Errorf("the push service kept %q", got)
		}
	})

	t.Run("an expired token is rejected", func(t *testing.T) {
		t.Parallel()
		sub, _ := subscribe(t, svc, key.PublicKey())
		sender := newSender(t, key)
		sender.clock = clock.NewFake(time.Now().Add(-tokenLifetime - time.Minute))
		res := sender.Send(context.Background(), sub, Message{Payload: []byte("late")})
		if res.Outcome != Rejected || res.Status != http.StatusBadRequest {
			t.Errorf("a token expired a minute ago: %v %d (%v), want rejected", res.Outcome, res.Status, res.Err)
		}
	})

	t.Run("an expired subscription is gone", func(t *testing.T) {
		t.Parallel()
		sub, hash := subscribe(t, svc, key.PublicKey())
		svc.Expire(t, hash)
		res := newSender(t, key).Send(context.Background(), sub, Message{Payload: []byte("anyone?")})
		if res.Outcome != Gone || res.Status != http.StatusGone {
			t.Errorf("%v %d (%v), want gone 410", res.Outcome, res.Status, res.Err)
		}
	})
}

// subscribe makes a subscription at svc for applicationServerKey.
func subscribe(t *testing.T, svc *webpushtest.Service, applicationServerKey string) (Subscription, string) {
	t.Helper()
	raw, hash := svc.Subscribe(t, applicationServerKey)
	sub, err := ParseSubscription(raw)
	if err != nil {
		t.Fatalf("the subscription web-push-testing made, %s: %v", raw, err)
	}
	return sub, hash
}
