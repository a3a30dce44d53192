package retryafter_test

import (
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/retryafter"
)

func TestParseReadsSecondsAndDatesAndRefusesTheRest(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"120", 2 * time.Minute, true},
		{" 5 ", 5 * time.Second, true},
		{"0", 0, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"99999999999", retryafter.Max, true},
		{"Fri, 04 Dec 2026 12:01:30 GMT", 90 * time.Second, true},
		{"Fri, 04 Dec 2026 11:59:00 GMT", 0, true},
		{"Sat, 04 Dec 2027 12:00:00 GMT", retryafter.Max, true},
	} {
		got, ok := retryafter.Parse(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Parse(%q) = %s, %v; want %s, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "1", "120", "Fri, 04 Dec 2026 12:01:30 GMT", "-3", "x"} {
		f.Add(s)
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := retryafter.Parse(v, now)
		if d < 0 || d > retryafter.Max || (!ok && d != 0) {
			t.Fatalf("Parse(%q) = %s, %v", v, d, ok)
		}
	})
}
