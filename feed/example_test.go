package feed_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/spoolcast/spoolcast/feed"
)

// A cursor is the last row's position, opaque to clients; anything the server
// did not make is refused.
func ExampleDecodeCursor() {
	c := feed.Cursor{CreatedAt: time.Date(2026, 11, 30, 9, 0, 0, 123456000, time.UTC), ID: 1042}
	s := c.Encode()
	back, _ := feed.DecodeCursor(s)
	fmt.Println(s)
	fmt.Println(back.ID, back.CreatedAt.Format(time.RFC3339Nano))
	_, err := feed.DecodeCursor("not-a-cursor")
	fmt.Println(errors.Is(err, feed.ErrBadCursor))
	// Output:
	// MjAyNi0xMS0zMFQwOTowMDowMC4xMjM0NTZafDEwNDI
	// 1042 2026-11-30T09:00:00.123456Z
	// true
}
