package push_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/push"
)

// A clear's answer is read as a push's: a token the provider refuses is
// disabled, and a refusal of the deployment's credentials is counted for
// the alert and waits a minute rather than being refused every 5 s.
func TestAClearsAnswerDisablesARefusedTokenAndCountsRefusedCredentials(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	delivered := channel.Outcome{Kind: channel.Delivered, ID: "push"}
	ch := &scriptedChannel{script: map[string][]channel.Outcome{
		"invalid":     {delivered, {Kind: channel.TokenInvalid, Status: 400, Code: "BadDeviceToken", Reason: "APNs 400 BadDeviceToken"}},
		"credentials": {delivered, {Kind: channel.RetryAfter, Status: 403, Code: "InvalidProviderToken", Reason: "APNs 403 InvalidProviderToken", Credentials: true}},
	}}
	s.devices.Channels = []channel.Channel{ch}
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		Channels: []channel.Channel{ch}, ClearOnRead: true, Interval: 20 * time.Millisecond, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.dispatcher = d
	ctx := context.Background()
	store := feed.NewStore(s.pool, nil)
	for _, tok := range []string{"ok", "invalid", "credentials"} {
		if _, err := s.devices.RegisterWith(ctx, "u-"+tok, "apns", tok, devices.IOS); err != nil {
			t.Fatal(err)
		}
		s.ingest("k-"+tok, "news", "u-"+tok)
	}
	s.drain()
	for _, tok := range []string{"ok", "invalid", "credentials"} {
		if _, _, err := store.MarkAllRead(ctx, "u-"+tok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.ClearPass(ctx); err != nil {
		t.Fatal(err)
	}
	type row struct {
		state string
		wait  float64
	}
	got := map[string]row{}
	rows, err := s.pool.Query(ctx, `SELECT token, state, extract(epoch FROM due_at - now()) FROM push_clears`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tok string
		var r row
		if err := rows.Scan(&tok, &r.state, &r.wait); err != nil {
			t.Fatal(err)
		}
		got[tok] = r
	}
	if got["ok"].state != "sent" || got["invalid"].state != "failed" || got["credentials"].state != "queued" || got["credentials"].wait < 50 {
		t.Errorf("clears %+v; want ok sent, invalid failed, credentials queued for about a minute", got)
	}
	for tok, on := range map[string]bool{"ok": true, "invalid": false, "credentials": true} {
		if s.enabled(tok) != on {
			t.Errorf("%s: enabled %v, want %v", tok, !on, on)
		}
	}
	if got := s.deviceStates("u-invalid"); got["invalid"] != devices.DisabledInvalid {
		t.Errorf("the refused token's state %v; want %s", got, devices.DisabledInvalid)
	}
	if n := s.counter("spoolcast_push_credentials_refused_total", "provider", "apns"); n != 1 {
		t.Errorf("credentials refused = %v, want 1 (the clear's)", n)
	}
}
