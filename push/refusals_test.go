package push_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/push"
)

// A device refusal (this token is another app's) disables that device and
// counts on the devices' metric; it never counts as the deployment's
// credentials, which page.
func TestOneDevicesRefusalDisablesThatDeviceAndPagesNoOne(t *testing.T) {
	t.Parallel()
	s := newChannelStack(t)
	otherApp, iphone := strings.Repeat("3a", 32), strings.Repeat("3b", 32)
	otherSender, android := "fcm-other-"+strings.Repeat("y", 140), "fcm-token-"+strings.Repeat("z", 140)
	s.apns.Answer(otherApp, apnstest.Reply{Status: 400, Reason: "DeviceTokenNotForTopic"})
	s.fcm.FailToken(otherSender, fcmtest.SenderIDMismatch)
	s.registerDirect("u1", otherApp, otherSender)
	s.registerDirect("u2", iphone, android)
	s.ingest("k1", "news", "u1", "u2")
	s.drain()

	for _, tok := range []string{otherApp, otherSender} {
		if got := s.disabledReason(tok); got != devices.DisabledForeign {
			t.Errorf("%.12s…: disabled_reason %q, want %q", tok, got, devices.DisabledForeign)
		}
		if state, why := s.dispatchError(tok); state != push.StateFailed || !strings.Contains(why, "the token is disabled") {
			t.Errorf("%.12s…'s dispatch: %s %q, want failed, the token disabled", tok, state, why)
		}
	}
	for _, tok := range []string{iphone, android} {
		if state, _ := s.dispatchError(tok); state != push.StateDelivered || s.disabledReason(tok) != "" {
			t.Errorf("%.12s…: %s, disabled %q; want delivered and enabled", tok, state, s.disabledReason(tok))
		}
	}
	for _, p := range []string{"apns", "fcm"} {
		if got := s.counter("spoolcast_push_credentials_refused_total", "provider", p); got != 0 {
			t.Errorf("credentials refused (%s) = %v, want 0: one device's refusal is not the deployment's", p, got)
		}
		if got := s.counter("spoolcast_push_refusals_held_total", "provider", p); got != 0 {
			t.Errorf("refusals held (%s) = %v, want 0", p, got)
		}
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", devices.DisabledForeign); got != 2 {
		t.Errorf("tokens disabled as another app's = %v, want 2", got)
	}
}

// A wrong --apns-sandbox makes APNs answer BadDeviceToken for every
// iPhone. None is disabled: the pushes wait, the refusals are counted for
// the page, and once the setting is right every phone gets its push.
func TestAWrongAPNsEnvironmentDisablesNoPhoneAndKeepsThePushes(t *testing.T) {
	t.Parallel()
	s := newChannelStack(t)
	ctx := context.Background()
	var phones, users []string
	for i := range 12 {
		tok := fmt.Sprintf("%02x", i) + strings.Repeat("4c", 31)
		user := fmt.Sprintf("u%d", i)
		if _, err := s.devices.RegisterWith(ctx, user, "apns", tok, devices.IOS); err != nil {
			t.Fatal(err)
		}
		phones, users = append(phones, tok), append(users, user)
	}
	s.apns.OtherEnvironment(true)
	s.ingest("k1", "news", users...)
	s.drain()

	for _, tok := range phones {
		if got := s.disabledReason(tok); got != "" {
			t.Errorf("%.8s… disabled (%q) for the deployment's wrong environment", tok, got)
		}
		if state, why := s.dispatchError(tok); state != push.StateDeferred || !strings.Contains(why, "--apns-sandbox") {
			t.Errorf("%.8s…'s dispatch: %s %q, want deferred, naming --apns-sandbox", tok, state, why)
		}
	}
	if got := s.counter("spoolcast_push_refusals_held_total", "provider", "apns"); got != 12 {
		t.Errorf("refusals held = %v, want 12", got)
	}
	if got := s.counter("spoolcast_tokens_disabled_total"); got != 0 {
		t.Errorf("tokens disabled = %v, want 0", got)
	}

	// The operator sets --apns-sandbox right; the held pushes come due.
	s.apns.OtherEnvironment(false)
	if _, err := s.pool.Exec(ctx, `UPDATE push_queue SET due_at = now()`); err != nil {
		t.Fatal(err)
	}
	s.drain()
	if got := s.states(); got[push.StateDelivered] != 12 {
		t.Errorf("states once the environment is right: %v, want 12 delivered", got)
	}
}

// A browser subscribed with the VAPID key before a key change answers 403
// (RFC 8292 §4.2): that browser's subscription is disabled, and no one is
// paged.
func TestABrowserRefusingTheVAPIDKeyIsDisabledAndPagesNoOne(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newWebStack(t, clk)
	svc := newPushService(t, 0, http.StatusForbidden)
	dev := s.subscribe("u1", fakeSubscription(t, svc.URL+"/push/old-key"))
	s.emit(`{"idempotency_key":"v1","type":"t","category":"c","recipients":["u1"],"title":"Hi"}`)
	s.drain()
	s.waitForState("the 403 to end the push", dev.Token, push.StateFailed)
	// Sent beside the pass: the device is disabled just after the outcome is written.
	testsignal.Eventually(t, "the subscription made with another VAPID key to be disabled", 10*time.Second, func() bool { return !s.enabled(dev.Token) })
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", devices.DisabledForeign); got != 1 {
		t.Errorf("tokens disabled as another app's = %v, want 1", got)
	}
	if got := s.counter("spoolcast_push_credentials_refused_total", "provider", push.ProviderWebPush); got != 0 {
		t.Errorf("credentials refused = %v, want 0", got)
	}
}

// Expo's receipts: InvalidCredentials is the project's credentials at
// Expo (paged), MismatchSenderId one device's app (disabled). When most
// devices' receipts say MismatchSenderId, it is the project's FCM
// credentials: none is disabled.
func TestExpoReceiptsPageForCredentialsAndDisableOnlyAStrayDevice(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	refusedCreds, stray, fine := "ExponentPushToken[creds]", "ExponentPushToken[stray]", "ExponentPushToken[fine%d]"
	s.register("u1", refusedCreds, stray)
	for i := range 5 {
		s.register(fmt.Sprintf("ok%d", i), fmt.Sprintf(fine, i))
	}
	s.fake.FailAtReceipt(refusedCreds, expo.InvalidCredentials)
	s.fake.FailAtReceipt(stray, expo.MismatchSenderID)
	s.ingest("e1", "general", "u1", "ok0", "ok1", "ok2", "ok3", "ok4")
	s.drain()
	if err := s.receipts.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.counter("spoolcast_push_credentials_refused_total", "provider", push.ProviderExpo); got != 1 {
		t.Errorf("credentials refused (expo) = %v, want 1 (the InvalidCredentials receipt)", got)
	}
	if !s.enabled(refusedCreds) {
		t.Error("the device whose receipt said InvalidCredentials was disabled: the credentials are the project's")
	}
	if s.enabled(stray) {
		t.Error("the device whose receipt said MismatchSenderId is still enabled")
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", devices.DisabledForeign); got != 1 {
		t.Errorf("tokens disabled as another app's = %v, want 1", got)
	}

	// The project's FCM credentials at Expo go wrong: every Android
	// device's receipt says MismatchSenderId.
	for i := range 5 {
		s.fake.FailAtReceipt(fmt.Sprintf(fine, i), expo.MismatchSenderID)
	}
	s.ingest("e2", "general", "ok0", "ok1", "ok2", "ok3", "ok4")
	s.drain()
	if err := s.receipts.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if tok := fmt.Sprintf(fine, i); !s.enabled(tok) {
			t.Errorf("%s was disabled while Expo refused most devices' sender", tok)
		}
	}
	if got := s.counter("spoolcast_push_refusals_held_total", "provider", push.ProviderExpo); got != 5 {
		t.Errorf("refusals held (expo) = %v, want 5", got)
	}
}
