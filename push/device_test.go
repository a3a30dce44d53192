package push_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", push.DisabledUnreachable); got != 1 {
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
		if _, err := s.devices.Register(context.Background(), "u1", again, push.IOS); err != nil {
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

// seenAgo moves token's last_seen_at back by ago, as if the app had last
// registered it then.
func (s *stack) seenAgo(token string, ago time.Duration) {
	s.t.Helper()
	if _, err := s.pool.Exec(context.Background(), `UPDATE devices SET last_seen_at = now() - $2::interval WHERE token = $1`, token, ago); err != nil {
		s.t.Fatal(err)
	}
}

// deviceStates is every device of user: its token's reason when disabled,
// "" when enabled.
func (s *stack) deviceStates(user string) map[string]string {
	s.t.Helper()
	devs, err := s.devices.List(context.Background(), user)
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range devs {
		switch {
		case d.Enabled && d.DisabledReason == nil && d.DisabledAt == nil:
			out[d.Token] = ""
		case !d.Enabled && d.DisabledReason != nil && d.DisabledAt != nil:
			out[d.Token] = *d.DisabledReason
		default:
			s.t.Fatalf("device %+v: enabled and disabled_reason/disabled_at disagree", d)
		}
	}
	return out
}

// enabledCount is how many of user's devices are enabled.
func enabledCount(states map[string]string) int {
	n := 0
	for _, reason := range states {
		if reason == "" {
			n++
		}
	}
	return n
}

func TestARegistrationPastTheCapReplacesTheLeastRecentlySeenDevice(t *testing.T) {
	t.Parallel()
	s := newStack(t) // the default cap
	const n = push.DefaultMaxEnabledPerUser
	tok := func(i int) string { return fmt.Sprintf("ExponentPushToken[t%02d]", i) }
	for i := range n {
		s.register("u1", tok(i))
	}
	// Seen most recently in the order they were registered, but for t07 and
	// t13: the least recently seen are not the first created.
	for i := range n {
		s.seenAgo(tok(i), time.Duration(n-i)*time.Minute)
	}
	s.seenAgo(tok(7), 10*time.Hour)
	s.seenAgo(tok(13), 9*time.Hour)
	s.register("u2", "ExponentPushToken[other]") // another user's cap is apart

	dev, err := s.devices.Register(context.Background(), "u1", tok(n), push.Android)
	if err != nil {
		t.Fatal(err)
	}
	if !dev.Enabled || dev.Token != tok(n) {
		t.Errorf("the new device = %+v; want it enabled", dev)
	}
	states := s.deviceStates("u1")
	if len(states) != n+1 || enabledCount(states) != n || states[tok(7)] != push.DisabledReplaced {
		t.Fatalf("after the %dth registration: %v; want %d enabled and the least recently seen, t07, %s", n+1, states, n, push.DisabledReplaced)
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", push.DisabledReplaced); got != 1 {
		t.Errorf("tokens disabled as replaced = %v, want 1", got)
	}

	// The replaced phone comes back: it is on again, and the next least
	// recently seen makes room.
	s.register("u1", tok(7))
	states = s.deviceStates("u1")
	if len(states) != n+1 || enabledCount(states) != n || states[tok(7)] != "" || states[tok(13)] != push.DisabledReplaced {
		t.Fatalf("after t07 registered again: %v; want %d enabled, t07 among them, and t13 %s", states, n, push.DisabledReplaced)
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", push.DisabledReplaced); got != 2 {
		t.Errorf("tokens disabled as replaced = %v, want 2", got)
	}
	if states := s.deviceStates("u2"); len(states) != 1 || states["ExponentPushToken[other]"] != "" {
		t.Errorf("u2's devices = %v; want its one device untouched by u1's cap", states)
	}
}

func TestAtTheCapAStillHereReplacesNothingAndATakeoverReplacesOne(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.devices.MaxEnabledPerUser = 2
	a, b, c := "ExponentPushToken[a]", "ExponentPushToken[b]", "ExponentPushToken[c]"
	s.register("u1", a, b)
	s.seenAgo(a, time.Hour)
	s.register("u2", c)

	s.register("u1", b) // "still here" from a device already on
	if states := s.deviceStates("u1"); len(states) != 2 || enabledCount(states) != 2 {
		t.Fatalf("after an enabled device registered again: %v; want both still enabled", states)
	}
	s.register("u1", c) // u2's phone changed hands
	if states := s.deviceStates("u1"); len(states) != 3 || enabledCount(states) != 2 || states[a] != push.DisabledReplaced {
		t.Fatalf("after taking over u2's token: %v; want b and c enabled, a %s", states, push.DisabledReplaced)
	}
	if states := s.deviceStates("u2"); len(states) != 0 {
		t.Errorf("u2 still lists the phone now u1's: %v", states)
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", push.DisabledReplaced); got != 1 {
		t.Errorf("tokens disabled as replaced = %v, want 1", got)
	}
}

func TestConcurrentRegistrationsFromTwoReplicasNeverPassTheCap(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	const limit, registrations = 3, 50
	// Two replicas: two stores, each over its own pool.
	replicas := []*push.Devices{push.NewDevices(s.pool, s.metrics), push.NewDevices(s.connect(), s.metrics)}
	for _, d := range replicas {
		d.MaxEnabledPerUser = limit
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range registrations {
		wg.Go(func() {
			<-start
			tok := fmt.Sprintf("ExponentPushToken[c%02d]", i)
			if _, err := replicas[i%2].Register(context.Background(), "u1", tok, push.IOS); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	states := s.deviceStates("u1")
	replaced := 0
	for _, reason := range states {
		if reason == push.DisabledReplaced {
			replaced++
		}
	}
	// The user's list keeps the enabled ones and as many disabled, the
	// latest: made-up tokens grow no table.
	if len(states) != 2*limit || enabledCount(states) != limit || replaced != limit {
		t.Fatalf("after %d concurrent registrations: %d devices, %d enabled, %d replaced kept; want %d, %d, %d",
			registrations, len(states), enabledCount(states), replaced, 2*limit, limit, limit)
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", push.DisabledReplaced); got != registrations-limit {
		t.Errorf("tokens disabled as replaced = %v, want %d", got, registrations-limit)
	}
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
	if got := s.deviceStates("u1"); got["not-a-push-token"] != push.DisabledInvalid || got["ExponentPushToken[phone]"] != "" {
		t.Errorf("devices %v; want the malformed token disabled (%s), the phone enabled", got, push.DisabledInvalid)
	}
	for _, m := range s.fake.Messages() {
		if m.To != "ExponentPushToken[phone]" {
			t.Errorf("Expo got a push to %q", m.To)
		}
	}
}
