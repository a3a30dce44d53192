package channel_test

import (
	"testing"

	"github.com/spoolcast/spoolcast/channel"
)

func TestShortenCutsAtARuneBoundary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"héllo", 5, "h…"}, // "hé…" would be 6 bytes
		{"hé llo", 6, "hé…"},
		{"a b c", 4, "a…"}, // the space before the cut goes
		{"abcdef", 3, ""},
	} {
		if got := channel.Shorten(tc.s, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("Shorten(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestALongIDIsItsHashTheSameEachTime(t *testing.T) {
	long := string(make([]byte, 65))
	if got := channel.ShortID("n1", 64); got != "n1" {
		t.Errorf("ShortID(n1) = %q", got)
	}
	if a, b := channel.ShortID(long, 64), channel.ShortID(long, 64); len(a) != 64 || a != b {
		t.Errorf("ShortID of 65 bytes = %q, %q; want the same 64 hex characters", a, b)
	}
}
