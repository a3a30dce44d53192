package push_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/push"
)

// scriptedChannel answers each token's messages with its script, one
// outcome per try (the last repeated); Delivered with an id otherwise.
type scriptedChannel struct {
	mu     sync.Mutex
	script map[string][]channel.Outcome
	sent   []channel.Message
}

func (c *scriptedChannel) Provider() string          { return "apns" }
func (c *scriptedChannel) MaxBatch() int             { return 2 }
func (c *scriptedChannel) Platforms() []string       { return []string{devices.IOS} }
func (c *scriptedChannel) ValidToken(string) bool    { return true }
func (c *scriptedChannel) Canonical(t string) string { return t }

func (c *scriptedChannel) Send(_ context.Context, msgs []channel.Message) []channel.Outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]channel.Outcome, len(msgs))
	for i, m := range msgs {
		c.sent = append(c.sent, m)
		out[i] = channel.Outcome{Kind: channel.Delivered, ID: "apns-" + m.Token}
		if s := c.script[m.Token]; len(s) > 0 {
			out[i] = s[0]
			if len(s) > 1 {
				c.script[m.Token] = s[1:]
			}
		}
	}
	return out
}

func (c *scriptedChannel) sends(token string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.sent {
		if m.Token == token {
			n++
		}
	}
	return n
}

func TestEachChannelOutcomeEndsInTheDeliveryLogAndTheDevices(t *testing.T) {
	s := newStack(t)
	ch := &scriptedChannel{script: map[string][]channel.Outcome{
		"gone":        {{Kind: channel.TokenGone, Status: 410, Code: "Unregistered", Reason: "APNs 410 Unregistered"}},
		"invalid":     {{Kind: channel.TokenInvalid, Status: 400, Code: "BadDeviceToken", Reason: "APNs 400 BadDeviceToken"}},
		"unknown":     {{Kind: channel.Unknown, Reason: "connection lost after the request was written"}},
		"refused":     {{Kind: channel.Failed, Status: 400, Code: "BadExpirationDate", Reason: "APNs 400 BadExpirationDate"}},
		"busy":        {{Kind: channel.RetryAfter, Status: 503, Wait: 10 * time.Millisecond}, {Kind: channel.Delivered, ID: "second-try"}},
		"credentials": {{Kind: channel.RetryAfter, Status: 403, Code: "InvalidProviderToken", Credentials: true}},
	}}
	s.devices.Channels = []channel.Channel{ch}
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		Channels: []channel.Channel{ch}, Interval: 20 * time.Millisecond, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.dispatcher = d
	ctx := context.Background()
	tokens := []string{"ok", "gone", "invalid", "unknown", "refused", "busy", "credentials"}
	for _, tok := range tokens {
		if _, err := s.devices.RegisterWith(ctx, "u-"+tok, "apns", tok, devices.IOS); err != nil {
			t.Fatal(err)
		}
		s.ingest("k-"+tok, "news", "u-"+tok)
	}
	s.drain()

	type row struct{ state, ticket, err string }
	got := map[string]row{}
	rows, err := s.pool.Query(ctx, `SELECT token, state, coalesce(ticket_id, ''), coalesce(error, '') FROM push_dispatches`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tok string
		var r row
		if err := rows.Scan(&tok, &r.state, &r.ticket, &r.err); err != nil {
			t.Fatal(err)
		}
		got[tok] = r
	}
	want := map[string]string{"ok": push.StateDelivered, "gone": push.StateFailed, "invalid": push.StateFailed,
		"unknown": push.StateFailed, "refused": push.StateFailed, "busy": push.StateDelivered, "credentials": push.StateDeferred}
	for tok, state := range want {
		if got[tok].state != state {
			t.Errorf("%s: dispatch %+v, want state %s", tok, got[tok], state)
		}
	}
	if got["ok"].ticket != "apns-ok" || got["busy"].ticket != "second-try" {
		t.Errorf("provider ids: ok %q, busy %q", got["ok"].ticket, got["busy"].ticket)
	}
	if got["refused"].err != "APNs 400 BadExpirationDate" || !strings.Contains(got["unknown"].err, "outcome unknown") {
		t.Errorf("reasons: refused %q, unknown %q", got["refused"].err, got["unknown"].err)
	}
	// Sent once each, but for the 503 (taken the second time) and
	// refused credentials (deferred once, not retried in the pass).
	for _, tok := range tokens {
		if n, want := ch.sends(tok), map[string]int{"busy": 2}[tok]; n != max(want, 1) {
			t.Errorf("%s: sent %d times, want %d", tok, n, max(want, 1))
		}
	}
	for tok, on := range map[string]bool{"ok": true, "gone": false, "invalid": false, "unknown": true, "refused": true, "busy": true, "credentials": true} {
		if s.enabled(tok) != on {
			t.Errorf("%s: enabled %v, want %v", tok, !on, on)
		}
	}
	var reasons []string
	if err := s.pool.QueryRow(ctx, `SELECT array_agg(disabled_reason ORDER BY token) FROM devices WHERE NOT enabled`).Scan(&reasons); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reasons, []string{devices.DisabledUnreachable, devices.DisabledInvalid}) {
		t.Errorf("disabled reasons (gone, invalid) = %v", reasons)
	}
	if n := s.counter("spoolcast_push_credentials_refused_total", "provider", "apns"); n != 1 {
		t.Errorf("credentials refused = %v, want 1", n)
	}
	if n := s.counter("spoolcast_push_channel_sent_total", "provider", "apns", "outcome", "delivered"); n != 2 {
		t.Errorf("delivered = %v, want 2", n)
	}
}

// pgtestCount runs a count query on the stack's pool.
func pgtestCount(t *testing.T, s *stack, query string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestADeviceOfAProviderNotSetUpIsRefusedAtRegistrationAndItsPushesGivenBack(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	if _, err := s.devices.RegisterWith(ctx, "u1", "fcm", "token-of-fcm", devices.Android); err == nil {
		t.Fatal("registered a device of a provider not set up")
	}
	// Set up on another replica: this one gives its pushes back to the
	// queue for the others, and never sends them to Expo.
	s.devices.Channels = []channel.Channel{&scriptedChannel{}}
	if _, err := s.devices.RegisterWith(ctx, "u1", "apns", "abc", devices.IOS); err != nil {
		t.Fatal(err)
	}
	if _, err := s.devices.RegisterWith(ctx, "u1", "apns", "abc", devices.Android); err == nil {
		t.Error("an APNs device registered as android")
	}
	s.ingest("k1", "news", "u1")
	s.drain()
	// Given back for the replicas that have it, never failed for good.
	if n := pgtestCount(t, s, `SELECT count(*) FROM push_dispatches WHERE token = 'abc'`); n != 0 {
		t.Errorf("%d dispatches to the APNs device on a replica without APNs; want none, the push given back", n)
	}
	if n := pgtestCount(t, s, `SELECT count(*) FROM push_queue`); n != 1 {
		t.Errorf("push queue = %d rows, want the notification back in it", n)
	}
	if len(s.fake.Messages()) != 0 {
		t.Errorf("Expo got %d messages", len(s.fake.Messages()))
	}
}

// A replica of the version before migration 23 registers a browser
// without naming a provider: it is still Web Push's.
func TestABrowserRegisteredByThePreviousVersionIsWebPushs(t *testing.T) {
	s := newStack(t)
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO devices (token, user_id, platform, endpoint, p256dh, auth)
		VALUES ('WebPush[old-version]', 'u1', 'web', 'https://push.example.com/x', 'k', 'a')`); err != nil {
		t.Fatal(err)
	}
	if n := pgtestCount(t, s, `SELECT count(*) FROM devices WHERE provider = 'webpush'`); n != 1 {
		t.Errorf("browsers of provider webpush = %d, want 1", n)
	}
}
