package push_test

import (
	"context"
	"testing"

	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/devices/devicestest"
	"github.com/spoolcast/spoolcast/push"
)

func TestAStaleReceiptSparesATokenRegisteredAgainSinceTheSend(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	again, moved, gone := "ExponentPushToken[again]", "ExponentPushToken[moved]", "ExponentPushToken[gone]"
	s.register("u1", again, moved, gone)
	for _, tok := range []string{again, moved, gone} {
		s.fake.UnregisterAtReceipt(tok)
	}
	s.ingest("e1", "general", "u1")
	s.drain()
	// After the send and before its receipt is read: the app registers one
	// token again, and another phone changes hands.
	s.register("u1", again)
	s.register("u2", moved)
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !s.enabled(again) {
		t.Error("a token registered again after the send was disabled by the send's stale receipt")
	}
	if !s.enabled(moved) {
		t.Error("a token registered by another user after the send was disabled by the send's stale receipt")
	}
	if s.enabled(gone) {
		t.Error("a token not seen since the send is still enabled after its receipt said DeviceNotRegistered")
	}
	if got := s.states(); got[push.StateReceiptError] != 3 {
		t.Errorf("states = %v; want the three receipts recorded as receipt_error all the same", got)
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", devices.DisabledUnreachable); got != 1 {
		t.Errorf("tokens disabled as unreachable = %v, want 1", got)
	}
}

func TestATicketErrorSparesATokenRegisteredAgainWhileTheSendWasInFlight(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	again, gone := "ExponentPushToken[again]", "ExponentPushToken[gone]"
	s.register("u1", again, gone)
	s.fake.Unregister(again)
	s.fake.Unregister(gone)
	// While Expo's tickets are on their way, the app registers one token again.
	s.fake.SetOnAnswer(func(endpoint string) {
		if endpoint != "send" {
			return
		}
		if _, err := s.devices.Register(context.Background(), "u1", again, devices.IOS); err != nil {
			t.Error(err)
		}
	})
	s.ingest("e1", "general", "u1")
	s.drain()
	if !s.enabled(again) {
		t.Error("a token registered again during the send was disabled by the send's ticket")
	}
	if s.enabled(gone) {
		t.Error("a token whose ticket said DeviceNotRegistered is still enabled")
	}
	if got := s.states(); got[push.StateFailed] != 2 {
		t.Errorf("states = %v; want both tickets' errors recorded", got)
	}
}

// deviceStates is every device of user: its token's reason when disabled,
// "" when enabled.
func (s *stack) deviceStates(user string) map[string]string {
	s.t.Helper()
	return devicestest.States(s.t, s.devices, user)
}

// A token stored without Register's check (a restore, a hand-written row)
// that is no Expo token is disabled before any send, and never reaches Expo.
func TestAMalformedExpoTokenInTheDevicesIsDisabledBeforeAnySend(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.register("u1", "ExponentPushToken[phone]")
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO devices (token, user_id, platform, provider) VALUES ('not-a-push-token', 'u1', 'ios', 'expo')`); err != nil {
		t.Fatal(err)
	}
	s.ingest("k1", "c", "u1")
	s.drain()
	if got := s.deviceStates("u1"); got["not-a-push-token"] != devices.DisabledInvalid || got["ExponentPushToken[phone]"] != "" {
		t.Errorf("devices %v; want the malformed token disabled (%s), the phone enabled", got, devices.DisabledInvalid)
	}
	for _, m := range s.fake.Messages() {
		if m.To != "ExponentPushToken[phone]" {
			t.Errorf("Expo got a push to %q", m.To)
		}
	}
}
