package feed_test

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/feed"
)

// FuzzDecodeCursor checks that every input either decodes to a cursor that
// encodes back to exactly the input, or fails with ErrBadCursor.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(feed.Cursor{CreatedAt: time.Date(2026, 11, 30, 9, 0, 0, 123456000, time.UTC), ID: 42}.Encode())
	f.Add(feed.Cursor{CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ID: 1}.Encode())
	for _, raw := range []string{"2026-11-30T09:00:00Z|0", "2026-11-30T09:00:00Z|-1", "2026-11-30T09:00:00Z|007", "2026-11-30T09:00:00Z", "|1", "2026-11-30 09:00:00|1", "2026-11-30T09:00:00+01:00|5", "a|b|1"} {
		f.Add(base64.RawURLEncoding.EncodeToString([]byte(raw)))
	}
	f.Add("")
	f.Add("!!!")
	f.Add("MjAyNi0xMS0zMFQwOTowMDowMFp8MQ==")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := feed.DecodeCursor(s)
		if err != nil {
			if !errors.Is(err, feed.ErrBadCursor) {
				t.Fatalf("DecodeCursor(%q) error %v is not ErrBadCursor", s, err)
			}
			return
		}
		if c.ID <= 0 {
			t.Fatalf("DecodeCursor(%q) id %d", s, c.ID)
		}
		if c.Encode() != s {
			t.Fatalf("DecodeCursor(%q) re-encodes as %q", s, c.Encode())
		}
	})
}

func TestMalformedCursorsAreRefused(t *testing.T) {
	t.Parallel()
	good := feed.Cursor{CreatedAt: time.Date(2026, 11, 30, 9, 0, 0, 5000, time.UTC), ID: 7}.Encode()
	if c, err := feed.DecodeCursor(good); err != nil || c.ID != 7 || c.CreatedAt.Nanosecond() != 5000 {
		t.Fatalf("DecodeCursor(good) = %+v, %v", c, err)
	}
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for name, s := range map[string]string{
		"empty":              "",
		"not base64url":      "@@@",
		"padded":             base64.URLEncoding.EncodeToString([]byte("2026-11-30T09:00:00Z|1")),
		"no separator":       enc("2026-11-30T09:00:00Z"),
		"no time":            enc("|1"),
		"not RFC 3339":       enc("2026-11-30 09:00:00|1"),
		"zero id":            enc("2026-11-30T09:00:00Z|0"),
		"negative id":        enc("2026-11-30T09:00:00Z|-3"),
		"leading zero id":    enc("2026-11-30T09:00:00Z|01"),
		"plus-signed id":     enc("2026-11-30T09:00:00Z|+1"),
		"id over int64":      enc("2026-11-30T09:00:00Z|9223372036854775808"),
		"a second separator": enc("2026-11-30T09:00:00Z|1|2"),
		"a local offset":     enc("2026-11-30T10:00:00+01:00|1"),
		"trailing junk":      good + "A",
	} {
		if _, err := feed.DecodeCursor(s); !errors.Is(err, feed.ErrBadCursor) {
			t.Errorf("%s: DecodeCursor(%q) = %v; want ErrBadCursor", name, s, err)
		}
	}
}
