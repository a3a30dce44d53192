package live_test

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/live"
)

// FuzzParseCursor checks that every input either parses to a cursor that
// encodes back to exactly the input, or fails with ErrBadCursor.
func FuzzParseCursor(f *testing.F) {
	at := time.Date(2026, 11, 30, 9, 0, 0, 123456000, time.UTC)
	f.Add(live.Cursor{Position: live.Position{Tx: 742, ID: 1}, At: at}.String())
	f.Add(live.Cursor{Position: live.Position{Tx: 1 << 40}, At: at}.String())
	f.Add(live.Cursor{Position: live.Position{Tx: 742, ID: 1}, At: at, History: live.History{System: 7714262984282894364, Timeline: 2}}.String())
	f.Add(live.Cursor{Position: live.Position{Tx: 742, ID: 1}, At: at, History: live.History{System: 7714262984282894364, Timeline: 2}, WAL: 51075264}.String())
	f.Add(base64.RawURLEncoding.EncodeToString(make([]byte, 25)))
	f.Add(base64.RawURLEncoding.EncodeToString([]byte{2, 0, 0, 0, 0, 0, 0, 2, 230, 0, 0, 0, 0, 0, 0, 0, 1, 0, 6, 97, 126, 79, 224, 50, 33}))
	f.Add("")
	f.Add("AQAAAAAAAALmAAAAAAAAAAAABmF-T-AyIQ==")
	f.Add("MjAyNi0xMS0zMFQwOTowMDowMFp8MQ")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := live.ParseCursor(s)
		if err != nil {
			if !errors.Is(err, live.ErrBadCursor) {
				t.Fatalf("ParseCursor(%q) error %v is not ErrBadCursor", s, err)
			}
			return
		}
		if c.ID < 0 || c.At.Year() < 2000 || c.At.Year() >= 3000 {
			t.Fatalf("ParseCursor(%q) = %+v", s, c)
		}
		if c.String() != s {
			t.Fatalf("ParseCursor(%q) re-encodes as %q", s, c.String())
		}
	})
}
