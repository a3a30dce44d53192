package live

import (
	"encoding/json"
	"time"

	"github.com/gobwas/ws"

	"github.com/spoolcast/spoolcast/feed"
)

// frameKind names what a queued frame is, for the metrics and for the resume.
type frameKind uint8

const (
	kindNotification frameKind = iota + 1
	kindRead
	kindReady
	kindPing
	kindPong
	kindClose
)

func (k frameKind) label() string {
	switch k {
	case kindNotification:
		return "notification"
	case kindRead:
		return "read"
	case kindReady:
		return "ready"
	}
	return "control"
}

// frame is one whole WebSocket frame, ready to write. Its bytes may be shared
// by every socket of a user and are never changed.
type frame struct {
	kind frameKind
	pos  Position  // a notification's position
	at   time.Time // a live notification's created_at, for the lag metric
	// createdAt is a notification's created_at.
	createdAt time.Time
	bytes     []byte
}

// The frames' JSON.
type (
	notificationMessage struct {
		Type   string    `json:"type"` // "notification"
		Data   feed.Item `json:"data"`
		Cursor string    `json:"cursor"`
	}
	readMessage struct {
		Type    string `json:"type"` // "read"
		ID      string `json:"id,omitempty"`
		Through string `json:"through,omitempty"`
		// Unread names, for a read-all, the notifications through Through
		// in feed order that it did not mark read: they committed after
		// read-all was asked.
		Unread []string `json:"unread,omitempty"`
	}
	readyMessage struct {
		Type   string `json:"type"` // "ready"
		Cursor string `json:"cursor"`
	}
)

// textFrame encodes v as a text frame.
func textFrame(v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return wsFrame(ws.OpText, payload), nil
}

// wsFrame is a whole unmasked frame (server to client) of one fragment.
func wsFrame(op ws.OpCode, payload []byte) []byte {
	h := ws.Header{Fin: true, OpCode: op, Length: int64(len(payload))}
	out := make([]byte, 0, ws.HeaderSize(h)+len(payload))
	out = appendHeader(out, h)
	return append(out, payload...)
}

// appendHeader appends h as ws.WriteHeader writes it, without an io.Writer.
func appendHeader(b []byte, h ws.Header) []byte {
	b0 := byte(h.OpCode)
	if h.Fin {
		b0 |= 0x80
	}
	switch n := h.Length; {
	case n < 126:
		return append(b, b0, byte(n))
	case n <= 0xffff:
		return append(b, b0, 126, byte(n>>8), byte(n))
	default:
		return append(b, b0, 127, byte(n>>56), byte(n>>48), byte(n>>40), byte(n>>32), byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
}

func notificationFrame(n feed.Notification, c Cursor, live bool) (frame, error) {
	b, err := textFrame(notificationMessage{Type: "notification", Data: n.Item(), Cursor: c.String()})
	f := frame{kind: kindNotification, pos: c.Position, createdAt: n.CreatedAt, bytes: b}
	if live {
		f.at = n.CreatedAt
	}
	return f, err
}

// StatusTryAgainLater (1013, registered with IANA) closes a socket that
// could not keep up: the app reconnects with its last cursor and misses nothing.
const StatusTryAgainLater ws.StatusCode = 1013

func closeFrame(code ws.StatusCode, reason string) frame {
	return frame{kind: kindClose, bytes: wsFrame(ws.OpClose, ws.NewCloseFrameBody(code, reason))}
}
