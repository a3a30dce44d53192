package push_test

import (
	"context"
	"testing"
)

// Without a ttl Expo keeps a message 0 s on iOS and four weeks on Android:
// a push is kept the day APNs and FCM direct keep it, a clear an hour.
func TestExpoIsToldHowLongToKeepEachPushAndClear(t *testing.T) {
	t.Parallel()
	s := newClearStack(t, true)
	read := s.pushed("k", 1)[0]
	if err := s.store.MarkRead(context.Background(), "u1", read); err != nil {
		t.Fatal(err)
	}
	racePasses(t, 3, s.dispatcher)
	pushes, clears := 0, 0
	for _, m := range s.fake.Messages() {
		if m.To != phone {
			continue
		}
		switch {
		case m.TTL == nil:
			t.Errorf("a message to Expo without a ttl: %+v", m)
		case m.ContentAvailable && m.Title == "":
			clears++
			if *m.TTL != 3600 {
				t.Errorf("a clear's ttl = %d s, want 3600", *m.TTL)
			}
		default:
			pushes++
			if *m.TTL != 24*3600 {
				t.Errorf("a push's ttl = %d s, want 86400", *m.TTL)
			}
		}
	}
	if pushes != 1 || clears != 1 {
		t.Errorf("Expo got %d pushes and %d clears for the phone, want one of each", pushes, clears)
	}
}
