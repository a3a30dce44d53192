package push_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/channel/channeltest"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/push"
)

// channelStack is a stack whose dispatcher also sends to a fake APNs and
// a fake FCM, through the real channels.
type channelStack struct {
	*stack
	apns *apnstest.Server
	fcm  *fcmtest.Server
}

func newChannelStack(t *testing.T, edits ...func(*push.DispatcherConfig)) *channelStack {
	t.Helper()
	s := newStack(t)
	rig := channeltest.Start(t)
	chs := rig.Channels
	s.devices.Channels = chs
	cfg := push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		Channels: chs, Interval: 20 * time.Millisecond, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)}
	for _, edit := range edits {
		edit(&cfg)
	}
	var err error
	if s.dispatcher, err = push.NewDispatcher(cfg); err != nil {
		t.Fatal(err)
	}
	return &channelStack{stack: s, apns: rig.APNs, fcm: rig.FCM}
}

// registerDirect registers user's iPhone with APNs and Android phone with FCM.
func (s *channelStack) registerDirect(user, apnsToken, fcmToken string) {
	s.t.Helper()
	ctx := context.Background()
	if _, err := s.devices.RegisterWith(ctx, user, "apns", apnsToken, devices.IOS); err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.devices.RegisterWith(ctx, user, "fcm", fcmToken, devices.Android); err != nil {
		s.t.Fatal(err)
	}
}

func TestAReadTakesTheBannerDownOnTheUsersAPNsAndFCMDevicesWithABackgroundMessage(t *testing.T) {
	s := newChannelStack(t, func(c *push.DispatcherConfig) { c.ClearOnRead = true })
	ctx := context.Background()
	apnsToken, fcmToken := strings.Repeat("cd", 32), "fcm-token-"+strings.Repeat("z", 140)
	s.registerDirect("u1", apnsToken, fcmToken)
	s.ingest("k1", "news", "u1")
	s.drain()
	var id feed.ID
	if err := s.pool.QueryRow(ctx, `SELECT created_at, id FROM notifications WHERE user_id = 'u1'`).Scan(&id.CreatedAt, &id.Seq); err != nil {
		t.Fatal(err)
	}
	if err := feed.NewStore(s.pool, nil).MarkRead(ctx, "u1", id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.dispatcher.ClearPass(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := s.apns.Requests()
	if len(reqs) != 2 {
		t.Fatalf("APNs got %d requests, want the push and its clear", len(reqs))
	}
	var clear struct {
		APS  map[string]any `json:"aps"`
		Type string         `json:"type"`
		IDs  []string       `json:"ids"`
	}
	if err := json.Unmarshal(reqs[1].Payload, &clear); err != nil {
		t.Fatal(err)
	}
	if reqs[1].Header.Get("apns-push-type") != "background" || reqs[1].Status != 200 || clear.Type != "clear" ||
		strings.Join(clear.IDs, ",") != id.String() || clear.APS["alert"] != nil {
		t.Errorf("APNs clear %s %v (%d), want a background push naming %s", reqs[1].Payload, reqs[1].Header, reqs[1].Status, id)
	}
	msgs := s.fcm.Messages()
	if len(msgs) != 2 {
		t.Fatalf("FCM got %d messages, want the push and its clear", len(msgs))
	}
	if m := msgs[1]; m.Notification != nil || m.Data["type"] != "clear" || m.Data["ids"] != `["`+id.String()+`"]` {
		t.Errorf("FCM clear %+v, want data only naming %s", m, id)
	}
	if n := pgtest.Count(t, s.pool, `SELECT count(*) FROM push_clears WHERE state = 'sent'`); n != 2 {
		t.Errorf("%d clears sent, want 2", n)
	}
	if n := s.counter("spoolcast_push_clears_total", "provider", "fcm", "result", "sent"); n != 1 {
		t.Errorf("FCM clears sent = %v", n)
	}
}

func TestOneUserGetsEachPushOnEveryProviderOnce(t *testing.T) {
	s := newChannelStack(t)
	ctx := context.Background()
	apnsToken, fcmToken := strings.Repeat("ab", 32), "fcm-token-"+strings.Repeat("x", 140)
	s.register("u1", "ExponentPushToken[u1-phone]")
	s.registerDirect("u1", apnsToken, fcmToken)
	s.ingest("k1", "news", "u1")
	s.drain()

	reqs := s.apns.Requests()
	msgs := s.fcm.Messages()
	if len(reqs) != 1 || len(msgs) != 1 || len(s.fake.Messages()) != 1 {
		t.Fatalf("APNs got %d, FCM %d, Expo %d; want one push each", len(reqs), len(msgs), len(s.fake.Messages()))
	}
	nid := msgs[0].Data["id"]
	if reqs[0].Token != apnsToken || reqs[0].Header.Get("apns-collapse-id") != nid || nid == "" {
		t.Errorf("APNs request to %s with collapse id %q; want the notification id %q", reqs[0].Token, reqs[0].Header.Get("apns-collapse-id"), nid)
	}
	if msgs[0].Token != fcmToken || msgs[0].Android.CollapseKey != nid || msgs[0].Notification.Title != "Title k1" {
		t.Errorf("FCM message %+v", msgs[0])
	}
	rows, err := s.pool.Query(ctx, `SELECT token, state, coalesce(ticket_id, '') FROM push_dispatches ORDER BY token`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]string{}
	for rows.Next() {
		var tok, state, ticket string
		if err := rows.Scan(&tok, &state, &ticket); err != nil {
			t.Fatal(err)
		}
		got[tok] = [2]string{state, ticket}
	}
	if got[apnsToken] != [2]string{push.StateDelivered, reqs[0].APNsID} || got[fcmToken] != [2]string{push.StateDelivered, msgs[0].Name} {
		t.Errorf("dispatches %v; want APNs delivered with apns-id %s, FCM with %s", got, reqs[0].APNsID, msgs[0].Name)
	}
	if got["ExponentPushToken[u1-phone]"][0] != push.StateSent {
		t.Errorf("the Expo dispatch is %v; want sent, awaiting its receipt", got["ExponentPushToken[u1-phone]"])
	}
	if n := s.counter("spoolcast_push_channel_sent_total", "provider", "apns", "outcome", "delivered"); n != 1 {
		t.Errorf("APNs delivered = %v", n)
	}
}

func TestAGoneOrRefusedTokenIsDisabledOnlyByItsOwnProvidersAnswer(t *testing.T) {
	s := newChannelStack(t)
	ctx := context.Background()
	gone, bad, fine := strings.Repeat("0a", 32), strings.Repeat("0b", 32), "fcm-fine-"+strings.Repeat("y", 140)
	unregistered := "fcm-gone-" + strings.Repeat("z", 140)
	s.apns.Answer(gone, apnstest.Reply{Status: 410, Reason: "Unregistered"})
	s.apns.Answer(bad, apnstest.Reply{Status: 400, Reason: "BadDeviceToken"})
	s.fcm.FailToken(unregistered, fcmtest.Unregistered)
	for user, dev := range map[string][2]string{"u1": {"apns", gone}, "u2": {"apns", bad}, "u3": {"fcm", fine}, "u4": {"fcm", unregistered}} {
		platform := devices.IOS
		if dev[0] == "fcm" {
			platform = devices.Android
		}
		if _, err := s.devices.RegisterWith(ctx, user, dev[0], dev[1], platform); err != nil {
			t.Fatal(err)
		}
		s.ingest("k-"+user, "news", user)
	}
	s.drain()
	for tok, want := range map[string]string{gone: devices.DisabledUnreachable, bad: devices.DisabledInvalid, unregistered: devices.DisabledUnreachable, fine: ""} {
		var reason *string
		if err := s.pool.QueryRow(ctx, `SELECT disabled_reason FROM devices WHERE token = $1`, tok).Scan(&reason); err != nil {
			t.Fatal(err)
		}
		if (reason == nil) != (want == "") || (reason != nil && *reason != want) {
			t.Errorf("%.12s…: disabled_reason %v, want %q", tok, reason, want)
		}
	}
	var why string
	if err := s.pool.QueryRow(ctx, `SELECT error FROM push_dispatches WHERE token = $1`, gone).Scan(&why); err != nil || !strings.Contains(why, "APNs 410 Unregistered") {
		t.Errorf("the gone device's dispatch says %q (%v)", why, err)
	}
	// Registered again (the app reinstalled): pushed again.
	if _, err := s.devices.RegisterWith(ctx, "u1", "apns", gone, devices.IOS); err != nil {
		t.Fatal(err)
	}
	if !s.enabled(gone) {
		t.Error("registering the token again did not turn it back on")
	}
}
