package live

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"
)

// Position is a row's place in commit-safe order: the id of the transaction
// that wrote it, then its id.
type Position struct {
	Tx uint64
	ID int64
}

// Less reports whether p comes before q.
func (p Position) Less(q Position) bool {
	return p.Tx < q.Tx || p.Tx == q.Tx && p.ID < q.ID
}

// Cursor is where a client resumes the stream: a position, and the creation
// time of the row there (or the time the cursor was made), which keeps the
// resume read to the partitions that can hold rows after it.
type Cursor struct {
	Position
	At time.Time
}

// ErrBadCursor: the cursor is not one this server issued.
var ErrBadCursor = errors.New("not a stream cursor this server issued")

// The times a cursor may carry: Postgres refuses far-off timestamps, and a
// cursor this server issued is never outside these.
var (
	oldestCursor = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	newestCursor = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
)

const (
	cursorVersion = 1
	cursorBytes   = 1 + 8 + 8 + 8
)

// String returns the cursor's API form: 34 base64url characters.
func (c Cursor) String() string {
	var b [cursorBytes]byte
	b[0] = cursorVersion
	binary.BigEndian.PutUint64(b[1:], c.Tx)
	binary.BigEndian.PutUint64(b[9:], uint64(c.ID))
	binary.BigEndian.PutUint64(b[17:], uint64(c.At.UnixMicro()))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ParseCursor reads a cursor's API form.
func ParseCursor(s string) (Cursor, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != cursorBytes || b[0] != cursorVersion {
		return Cursor{}, ErrBadCursor
	}
	c := Cursor{
		Position: Position{Tx: binary.BigEndian.Uint64(b[1:]), ID: int64(binary.BigEndian.Uint64(b[9:]))},
		At:       time.UnixMicro(int64(binary.BigEndian.Uint64(b[17:]))).UTC(),
	}
	if c.ID < 0 || c.Tx > 1<<63-1 || c.At.Before(oldestCursor) || c.At.After(newestCursor) {
		return Cursor{}, ErrBadCursor
	}
	return c, nil
}
