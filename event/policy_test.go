package event_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
)

func TestDeliveryPolicyFieldsAreCanonical(t *testing.T) {
	t.Parallel()
	a, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"],
		"send_at":"2026-12-24T19:00:00+01:00","priority":"normal","digest":{"window":"300s","key":"chat:room42"}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"],
		"send_at":"2026-12-24T18:00:00Z","digest":{"key":"chat:room42","window":"5m"}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Canonical(), b.Canonical()) {
		t.Fatalf("canonical forms differ:\n%s\n%s", a.Canonical(), b.Canonical())
	}
	want := `{"idempotency_key":"k","type":"t","category":"general","recipients":["u1"],"send_at":"2026-12-24T18:00:00Z","digest":{"key":"chat:room42","window":"5m0s"}}`
	if string(a.Canonical()) != want {
		t.Errorf("canonical = %s, want %s", a.Canonical(), want)
	}
	if got := a.SendTime(); !got.Equal(time.Date(2026, 12, 24, 18, 0, 0, 0, time.UTC)) {
		t.Errorf("SendTime = %v", got)
	}
	if a.DigestWindow() != 5*time.Minute || a.Critical() {
		t.Errorf("window %v, critical %v", a.DigestWindow(), a.Critical())
	}
	back, err := event.Parse(a.Canonical())
	if err != nil || !bytes.Equal(back.Canonical(), a.Canonical()) {
		t.Errorf("Parse(canonical) = %s, %v", back.Canonical(), err)
	}
	c, _ := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"],"priority":"critical"}`), "")
	if !c.Critical() || bytes.Equal(c.Hash(), a.Hash()) {
		t.Errorf("critical = %v, hash equal to another request's", c.Critical())
	}
}

func TestBadDeliveryPolicyFieldsNameTheField(t *testing.T) {
	t.Parallel()
	for body, field := range map[string]string{
		`"send_at":"tomorrow"`:                            "send_at",
		`"send_at":"2026-12-24 18:00"`:                    "send_at",
		`"priority":"urgent"`:                             "priority",
		`"digest":{"key":"","window":"5m"}`:               "digest.key",
		`"digest":{"key":"k","window":"5s"}`:              "digest.window",
		`"digest":{"key":"k","window":"25h"}`:             "digest.window",
		`"digest":{"key":"k","window":"soon"}`:            "digest.window",
		`"digest":{"key":"k","window":"5m","extra":true}`: "extra",
		`"send_at":12`:                                    "send_at",
	} {
		_, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"],`+body+`}`), "")
		var e *event.Error
		if !errors.As(err, &e) || e.Field != field {
			t.Errorf("%s: err = %v, want one about %s", body, err, field)
		}
	}
}

func TestSendAtIsAtMostThirtyDaysAhead(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ev, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"],"send_at":"2026-12-31T12:00:00Z"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.CheckSchedule(now); err != nil {
		t.Errorf("30 days ahead: %v", err)
	}
	if err := ev.CheckSchedule(now.Add(-time.Second)); !errors.Is(err, event.ErrInvalid) {
		t.Errorf("30 days and a second ahead: %v, want ErrInvalid", err)
	}
}

// An event that would push an empty banner (no title, no body) is refused at
// the ingress, naming title; a body alone is pushed as it is. Decode and
// Parse take it still: an event spooled before, by an older relay, is
// forwarded, not refused later.
func TestAnEventThatWouldShowNothingIsRefusedAtTheIngressOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, fields string
		refused      bool
	}{
		{"neither title nor body", ``, true},
		{"an empty title and body", `,"title":"","body":""`, true},
		{"a title and body of spaces", `,"title":"  ","body":"\t"`, true},
		{"data alone", `,"data":{"meeting_id":"m_456"}`, true},
		{"a title", `,"title":"You were added to Weekly sync"`, false},
		{"a body alone", `,"body":"Starts Monday 10:00"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"]`+tc.fields+`}`), "")
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if _, err := event.Parse(ev.Canonical()); err != nil {
				t.Errorf("Parse of the spooled event: %v", err)
			}
			err = ev.CheckShown()
			var evErr *event.Error
			switch {
			case tc.refused && (!errors.As(err, &evErr) || evErr.Field != "title" || !errors.Is(err, event.ErrInvalid)):
				t.Errorf("CheckShown = %v; want an invalid title", err)
			case !tc.refused && err != nil:
				t.Errorf("CheckShown = %v; want it taken", err)
			}
		})
	}
}
