package feed

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// ErrBadCursor: a cursor that this server did not make. It is answered 400,
// never guessed at.
var ErrBadCursor = errors.New("malformed cursor")

// Cursor is a position in a feed: the created_at and id of the last row of a
// page. The next page holds the rows strictly after it in feed order
// (created_at DESC, id DESC).
type Cursor struct {
	CreatedAt time.Time
	ID        int64
}

const cursorSep = "|"

// Encode returns the cursor as opaque base64url text.
func (c Cursor) Encode() string {
	raw := c.CreatedAt.UTC().Format(time.RFC3339Nano) + cursorSep + strconv.FormatInt(c.ID, 10)
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// DecodeCursor parses a cursor made by Encode. It is strict: unpadded base64url,
// an RFC 3339 time with optional fraction, the last "|" as separator, a positive
// decimal id without sign or leading zeros; anything else is ErrBadCursor.
func DecodeCursor(s string) (Cursor, error) {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(raw) == 0 {
		return Cursor{}, ErrBadCursor
	}
	text := string(raw)
	i := strings.LastIndex(text, cursorSep)
	if i < 0 {
		return Cursor{}, ErrBadCursor
	}
	ts, idText := text[:i], text[i+1:]
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return Cursor{}, ErrBadCursor
	}
	if idText == "" || idText[0] < '1' || idText[0] > '9' {
		return Cursor{}, ErrBadCursor
	}
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil || id <= 0 {
		return Cursor{}, ErrBadCursor
	}
	c := Cursor{CreatedAt: at, ID: id}
	// Only the exact form Encode makes is accepted: one cursor, one spelling.
	if c.Encode() != s {
		return Cursor{}, ErrBadCursor
	}
	return c, nil
}
