package live

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"

	"github.com/spoolcast/spoolcast/internal/pghistory"
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

// History names the Postgres history a position belongs to (see
// pghistory): a transaction id from another history says nothing about this
// one (after a failover that lost the tail, the same ids name other
// transactions).
type History = pghistory.History

// Cursor is where a client resumes the stream: a position, the creation
// time of the row there (or the time the cursor was made), which keeps the
// resume read to the partitions that can hold rows after it, the history the
// position belongs to, and the WAL position of that history below which lies
// everything the read that made it could see, and whether that read ran on
// a primary that replicated its commits synchronously. After a promotion
// that kept what the read saw, the cursor resumes on the new timeline
// (follows); otherwise it is from another history.
type Cursor struct {
	Position
	At          time.Time
	History     History
	WAL         uint64
	Synchronous bool
}

// ErrBadCursor: the cursor is not one this server issued.
var ErrBadCursor = errors.New("not a stream cursor this server issued")

// ErrOtherHistory: the cursor is from another history of the database (a
// restore, a new cluster, a failover that may have lost the tail) or lies
// beyond what this one has seen: nothing it says can be trusted here, and the
// client starts over from the top of the feed.
var ErrOtherHistory = errors.New("the cursor is from another history of the database (a restore or a failover); start over without it")

// The times a cursor may carry: Postgres refuses far-off timestamps, and a
// cursor this server issued is never outside these.
var (
	oldestCursor = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	newestCursor = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// The cursor's forms: version 1 (before histories) holds a position and a
// time; version 2 adds the history, version 3 the WAL position and whether
// the read was replicated synchronously (flag 1).
const (
	cursorV1, cursorV1Bytes = 1, 1 + 8 + 8 + 8
	cursorV2, cursorV2Bytes = 2, cursorV1Bytes + 8 + 4
	cursorV3, cursorV3Bytes = 3, cursorV2Bytes + 8 + 1
	cursorSynchronous       = 1
)

// String returns the cursor's API form: 62 base64url characters (50, the
// version 2 form, for a cursor without a WAL position; 34, the version 1
// form, for one without a history).
func (c Cursor) String() string {
	var b [cursorV3Bytes]byte
	if c.History == (History{}) {
		b[0] = cursorV1
		binary.BigEndian.PutUint64(b[1:], c.Tx)
		binary.BigEndian.PutUint64(b[9:], uint64(c.ID))
		binary.BigEndian.PutUint64(b[17:], uint64(c.At.UnixMicro()))
		return base64.RawURLEncoding.EncodeToString(b[:cursorV1Bytes])
	}
	b[0] = cursorV2
	binary.BigEndian.PutUint64(b[1:], c.Tx)
	binary.BigEndian.PutUint64(b[9:], uint64(c.ID))
	binary.BigEndian.PutUint64(b[17:], uint64(c.At.UnixMicro()))
	binary.BigEndian.PutUint64(b[25:], c.History.System)
	binary.BigEndian.PutUint32(b[33:], c.History.Timeline)
	if c.WAL == 0 { // a version 2 cursor, read again as it came
		return base64.RawURLEncoding.EncodeToString(b[:cursorV2Bytes])
	}
	b[0] = cursorV3
	binary.BigEndian.PutUint64(b[37:], c.WAL)
	if c.Synchronous {
		b[45] = cursorSynchronous
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ParseCursor reads a cursor's API form. A version 1 cursor has no history
// (zero): only the position's own bounds can be checked.
func ParseCursor(s string) (Cursor, error) {
	// The decoder skips \r and \n: an input longer than its bytes' encoding
	// is not one this server wrote.
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) < 1 || len(s) != base64.RawURLEncoding.EncodedLen(len(b)) || !(b[0] == cursorV1 && len(b) == cursorV1Bytes || b[0] == cursorV2 && len(b) == cursorV2Bytes || b[0] == cursorV3 && len(b) == cursorV3Bytes) {
		return Cursor{}, ErrBadCursor
	}
	c := Cursor{
		Position: Position{Tx: binary.BigEndian.Uint64(b[1:]), ID: int64(binary.BigEndian.Uint64(b[9:]))},
		At:       time.UnixMicro(int64(binary.BigEndian.Uint64(b[17:]))).UTC(),
	}
	if b[0] >= cursorV2 {
		c.History = History{System: binary.BigEndian.Uint64(b[25:]), Timeline: binary.BigEndian.Uint32(b[33:])}
		if c.History == (History{}) {
			return Cursor{}, ErrBadCursor
		}
	}
	if b[0] == cursorV3 {
		if c.WAL = binary.BigEndian.Uint64(b[37:]); c.WAL == 0 || b[45] > cursorSynchronous {
			return Cursor{}, ErrBadCursor
		}
		c.Synchronous = b[45] == cursorSynchronous
	}
	if c.ID < 0 || c.Tx > 1<<63-1 || c.WAL > 1<<63-1 || c.At.Before(oldestCursor) || c.At.After(newestCursor) {
		return Cursor{}, ErrBadCursor
	}
	return c, nil
}
