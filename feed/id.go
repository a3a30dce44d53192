package feed

import (
	"encoding/base64"
	"encoding/binary"
	"time"
)

// ID names one notification: its created_at and its sequence number, the key
// of its row in the table partitioned by created_at. The API shows it as an
// opaque 22-character base64url string; the time in it routes a read or a
// mark-read to the one partition that holds the row.
type ID struct {
	CreatedAt time.Time
	Seq       int64
}

// String returns the API form of the id.
func (id ID) String() string { return string(id.append(nil)) }

// append appends the API form of the id to dst.
func (id ID) append(dst []byte) []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(id.CreatedAt.UnixMicro()))
	binary.BigEndian.PutUint64(b[8:], uint64(id.Seq))
	return base64.RawURLEncoding.AppendEncode(dst, b[:])
}

// ParseID reads an API id; anything this server did not make is ErrNotFound.
func ParseID(s string) (ID, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != 16 {
		return ID{}, ErrNotFound
	}
	seq := int64(binary.BigEndian.Uint64(b[8:]))
	if seq <= 0 {
		return ID{}, ErrNotFound
	}
	id := ID{CreatedAt: time.UnixMicro(int64(binary.BigEndian.Uint64(b[:8]))).UTC(), Seq: seq}
	if id.String() != s {
		return ID{}, ErrNotFound
	}
	return id, nil
}

// PublicID is the notification's API id.
func (n Notification) PublicID() ID { return ID{CreatedAt: n.CreatedAt, Seq: n.ID} }
