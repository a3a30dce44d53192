package webpush

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/clock"
)

func TestAMessageIsKeptNoLongerThanItsExpiry(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC))
	c, err := NewChannel(ChannelConfig{Sender: &Sender{}, TTL: 24 * time.Hour, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		expires time.Time
		want    string
	}{
		{time.Time{}, "86400"}, // none: the channel's TTL
		{fake.Now().Add(time.Hour + 500*time.Millisecond), "3600"}, // whole seconds, rounded down
		{fake.Now().Add(48 * time.Hour), "86400"},                  // never past the channel's TTL
		{fake.Now().Add(300 * time.Millisecond), "0"},              // under a second: now or never
		{fake.Now().Add(-time.Minute), "0"},                        // past: now or never
	} {
		for _, silent := range []bool{false, true} {
			m := c.message(channel.Message{ID: "n1", Title: "t", Expires: tc.expires, Silent: silent, Data: map[string]any{"type": "clear"}})
			if got := m.ttlHeader(); got != tc.want {
				t.Errorf("expires in %s (silent %v): TTL %s, want %s", tc.expires.Sub(fake.Now()), silent, got, tc.want)
			}
		}
	}
}

func TestASilentMessageCarriesItsDataAlone(t *testing.T) {
	c, err := NewChannel(ChannelConfig{Sender: &Sender{}})
	if err != nil {
		t.Fatal(err)
	}
	m := c.message(channel.Message{ID: "n1", Title: "hidden", Body: "hidden", Urgent: true, CollapseKey: "k", Silent: true,
		Data: map[string]any{"type": "clear", "ids": []string{"a", "b"}}})
	var got map[string]any
	if err := json.Unmarshal(m.Payload, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["type"] != "clear" || len(got["ids"].([]any)) != 2 || m.Urgency != UrgencyNormal || m.Topic != "" {
		t.Errorf("silent message %s, urgency %q, topic %q; want the data alone, normal urgency, no topic", m.Payload, m.Urgency, m.Topic)
	}
}
