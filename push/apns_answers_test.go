package push_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/devices"
)

// disabledReason is token's disabled_reason, "" while it is enabled.
func (s *channelStack) disabledReason(token string) string {
	s.t.Helper()
	var reason *string
	if err := s.pool.QueryRow(context.Background(), `SELECT disabled_reason FROM devices WHERE token = $1`, token).Scan(&reason); err != nil {
		s.t.Fatal(err)
	}
	if reason == nil {
		return ""
	}
	return *reason
}

// dispatchError is the error recorded on token's one dispatch.
func (s *channelStack) dispatchError(token string) (state, why string) {
	s.t.Helper()
	if err := s.pool.QueryRow(context.Background(), `SELECT state, coalesce(error, '') FROM push_dispatches WHERE token = $1`, token).Scan(&state, &why); err != nil {
		s.t.Fatal(err)
	}
	return state, why
}

// Apple: the 410's timestamp is "the last time at which APNs confirmed that
// the device token was no longer valid … Stop pushing notifications until
// the device registers a token with a later timestamp".
func TestAnAPNs410DisablesOnlyADeviceRegisteredBeforeItsTimestamp(t *testing.T) {
	t.Parallel()
	s := newChannelStack(t)
	ctx := context.Background()
	// Both answer 410, invalid since an hour ago. The first phone last
	// registered two hours ago; the second registered again since (the app
	// reinstalled, its token the same), and is a newer token than the answer.
	before, after := strings.Repeat("1a", 32), strings.Repeat("1b", 32)
	hourAgo := time.Now().Add(-time.Hour)
	for user, tok := range map[string]string{"u-before": before, "u-after": after} {
		s.apns.Answer(tok, apnstest.Reply{Status: 410, Reason: "Unregistered", Timestamp: hourAgo})
		if _, err := s.devices.RegisterWith(ctx, user, "apns", tok, devices.IOS); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(ctx, `UPDATE devices SET last_seen_at = now() - interval '2 hours' WHERE token = $1`, before); err != nil {
		t.Fatal(err)
	}
	s.ingest("k1", "news", "u-before", "u-after")
	s.drain()

	if got := s.disabledReason(before); got != devices.DisabledUnreachable {
		t.Errorf("the phone registered before the 410's timestamp: disabled_reason %q, want %q", got, devices.DisabledUnreachable)
	}
	if got := s.disabledReason(after); got != "" {
		t.Errorf("the phone registered again after the 410's timestamp was disabled (%q); want it left on", got)
	}
	for _, tok := range []string{before, after} {
		if state, why := s.dispatchError(tok); state != "failed" || !strings.Contains(why, "APNs 410 Unregistered") {
			t.Errorf("%.8s…'s dispatch: %s %q, want failed with APNs' answer", tok, state, why)
		}
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", devices.DisabledUnreachable); got != 1 {
		t.Errorf("tokens disabled as unreachable = %v, want 1", got)
	}
}

// Apple: "Don't retry notification responses with the error code …
// Forbidden". Only an expired provider token is signed again and retried.
func TestAnAPNs403IsSentOnceAndCountedForTheAlert(t *testing.T) {
	t.Parallel()
	s := newChannelStack(t)
	ctx := context.Background()
	forbidden := strings.Repeat("2a", 32)
	s.apns.Answer(forbidden, apnstest.Reply{Status: 403, Reason: "Forbidden"})
	if _, err := s.devices.RegisterWith(ctx, "u1", "apns", forbidden, devices.IOS); err != nil {
		t.Fatal(err)
	}
	s.ingest("k1", "news", "u1")
	s.drain()

	sent := 0
	for _, r := range s.apns.Requests() {
		if r.Token == forbidden {
			sent++
		}
	}
	if sent != 1 {
		t.Errorf("APNs got the push %d times, want once: a 403 is not retried", sent)
	}
	if state, why := s.dispatchError(forbidden); state != "failed" || !strings.Contains(why, "APNs 403 Forbidden") {
		t.Errorf("the dispatch: %s %q, want failed with APNs' answer", state, why)
	}
	if got := s.disabledReason(forbidden); got != "" {
		t.Errorf("the device was disabled (%q) for the deployment's refusal", got)
	}
	if got := s.counter("spoolcast_push_credentials_refused_total", "provider", "apns"); got != 1 {
		t.Errorf("credentials refused = %v, want 1", got)
	}
}
