package fcm_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

// payload is FCM's count of a message's size: its notification's and
// data's keys and values.
func payload(m fcmtest.Message) int {
	n := 0
	if m.Notification != nil {
		n += len(m.Notification.Title) + len(m.Notification.Body)
	}
	for k, v := range m.Data {
		n += len(k) + len(v)
	}
	return n
}

func TestTextOverFCMsPayloadIsShortenedAtARuneWithAnEllipsis(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	longBody := strings.Repeat("héllo wörld 🙂 ", 500)
	longTitle := strings.Repeat("Ünïcödé títle ", 400)
	bigData := map[string]any{"digest": strings.Repeat("x", 3000)}
	for _, tc := range []struct {
		name       string
		m          channel.Message
		wantTitle  string // "" : shortened
		wantBodyOK func(string) bool
	}{
		{"a long body is cut, the title kept", channel.Message{Title: "Weekly digest", Body: longBody}, "Weekly digest", nil},
		{"a long title with no body is cut", channel.Message{Title: longTitle}, "", func(b string) bool { return b == "" }},
		{"a body beside large data is cut to what is left", channel.Message{Title: "Digest", Body: longBody, Data: bigData}, "Digest", nil},
	} {
		m := tc.m
		m.Token, m.ID = token(1), "n1"
		if out := ch.Send(context.Background(), []channel.Message{m}); out[0].Kind != channel.Delivered {
			t.Fatalf("%s: outcome %+v", tc.name, out[0])
		}
		all := fake.Messages()
		got := all[len(all)-1]
		n := got.Notification
		if size := payload(got); size > fcmtest.MaxPayload {
			t.Errorf("%s: payload %d bytes, over %d", tc.name, size, fcmtest.MaxPayload)
		}
		check := func(what, sent, original string) {
			cut, ok := strings.CutSuffix(sent, "…")
			if !ok || !utf8.ValidString(sent) || !strings.HasPrefix(original, cut) || len(sent) < 100 {
				t.Errorf("%s: %s %q…, want a valid UTF-8 start of the original ending in …", tc.name, what, sent[:min(len(sent), 40)])
			}
		}
		if tc.wantTitle != "" {
			if n.Title != tc.wantTitle {
				t.Errorf("%s: title %q, want %q", tc.name, n.Title, tc.wantTitle)
			}
		} else {
			check("title", n.Title, m.Title)
		}
		if tc.wantBodyOK != nil {
			if !tc.wantBodyOK(n.Body) {
				t.Errorf("%s: body %q", tc.name, n.Body)
			}
		} else {
			check("body", n.Body, m.Body)
		}
		if d, ok := m.Data["digest"].(string); ok && got.Data["digest"] != d {
			t.Errorf("%s: data was changed", tc.name)
		}
	}
}

func TestASilentMessageIsDataOnlyAndWakesAnIPhoneInTheBackground(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	m := channel.Message{Token: "silent-1", Silent: true, Urgent: true, CollapseKey: "digest:x",
		Data: map[string]any{"type": "clear", "ids": []string{"n1", "n2"}}}
	if o := ch.Send(context.Background(), []channel.Message{m})[0]; o.Kind != channel.Delivered {
		t.Fatalf("%+v", o)
	}
	got := fake.Messages()[0]
	if got.Notification != nil || got.Android.Notification != nil || got.Android.CollapseKey != "" || got.Android.Priority != "NORMAL" {
		t.Errorf("android %+v, notification %+v: want data only, normal priority, no collapse key", got.Android, got.Notification)
	}
	if got.Data["type"] != "clear" || got.Data["ids"] != `["n1","n2"]` || got.Data["id"] != "" {
		t.Errorf("data %v", got.Data)
	}
	aps, _ := got.APNs.Payload["aps"].(map[string]any)
	if got.APNs.Headers["apns-push-type"] != "background" || got.APNs.Headers["apns-priority"] != "5" || aps["content-available"] != float64(1) {
		t.Errorf("apns %+v, want a background push at priority 5 with content-available", got.APNs)
	}
}
