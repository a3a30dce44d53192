package push

import (
	"fmt"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
)

func TestTheRefusalGuardHoldsOnlyWhenMostRecentDevicesAreRefused(t *testing.T) {
	now := time.Now()
	taken, refused := channel.Outcome{Kind: channel.Delivered}, channel.Outcome{Kind: channel.TokenInvalid}
	cases := []struct {
		name    string
		answers []channel.Outcome
		want    bool
	}{
		{"one device of one, refused: a small deployment's own refusal", []channel.Outcome{refused}, false},
		{"three refused in a row among many taken", append(repeat(taken, 13), repeat(refused, 3)...), false},
		{"one in sixteen refused", append(repeat(taken, 15), refused), false},
		{"a batch all refused", repeat(refused, 12), true},
		{"most of the last sixteen refused after a day of taken", append(repeat(taken, 100), repeat(refused, 9)...), true},
		{"half refused is not most", append(repeat(taken, 8), repeat(refused, 8)...), false},
		{"requests refused are not devices refused", append(repeat(channel.Outcome{Kind: channel.RetryAfter}, 20), repeat(refused, 3)...), false},
	}
	for _, c := range cases {
		g := newRefusalGuard()
		for i, o := range c.answers {
			g.observe("apns", fmt.Sprint("device-", i), o, now)
		}
		if held, r, n := g.holds("apns", now); held != c.want {
			t.Errorf("%s: held %v (%d of %d refused), want %v", c.name, held, r, n, c.want)
		}
	}

	// The same device answered again counts once, as its latest answer;
	// answers older than the window do not count.
	g := newRefusalGuard()
	for i := range 8 {
		g.observe("fcm", fmt.Sprint("device-", i), refused, now.Add(-2*refusalGuardWindow))
	}
	for range 8 {
		g.observe("fcm", "device-0", refused, now)
	}
	if held, r, n := g.holds("fcm", now); held || r != 1 || n != 1 {
		t.Errorf("held %v with %d of %d refused, want not held, 1 of 1", held, r, n)
	}
}

func repeat(o channel.Outcome, n int) []channel.Outcome {
	out := make([]channel.Outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}
