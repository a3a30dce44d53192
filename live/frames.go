package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"time"

	"github.com/gobwas/ws"

	"github.com/spoolcast/spoolcast/feed"
)

// frameKind names what a queued frame is, for the metrics and for the resume.
type frameKind uint8

const (
	kindNotification frameKind = iota + 1
	// The changes of state, each at its place in the stream.
	kindRead
	kindUnread
	kindArchived
	kindUnarchived
	kindSeen
	kindReady
	kindPing
	kindPong
	kindClose
)

// streamKinds are the kinds of frame a position in the stream carries.
var streamKinds = []frameKind{kindNotification, kindRead, kindUnread, kindArchived, kindUnarchived, kindSeen}

func (k frameKind) label() string {
	switch k {
	case kindNotification:
		return "notification"
	case kindRead:
		return "read"
	case kindUnread:
		return "unread"
	case kindArchived:
		return "archived"
	case kindUnarchived:
		return "unarchived"
	case kindSeen:
		return "seen"
	case kindReady:
		return "ready"
	}
	return "control"
}

// positioned reports whether a frame of kind k is a place in the stream
// (a notification or a change of state): sent once, in commit-safe order,
// resumed after its cursor, caught up from Postgres after a burst.
func (k frameKind) positioned() bool { return k >= kindNotification && k <= kindSeen }

// frame is one message of the stream, built once and written by each socket
// in its own transport's framing: bytes is the whole WebSocket frame, json
// its payload (the tail of bytes, shared, not copied), id the event stream's
// "id: <cursor>\n" line of a frame that carries a cursor. All may be shared
// by every socket of a user and are never changed.
type frame struct {
	kind frameKind
	pos  Position  // its place in the stream, when positioned
	at   time.Time // a live notification's created_at, for the lag metric
	// createdAt is a notification's created_at, or when a change of state
	// was made: its cursor's time.
	createdAt time.Time
	bytes     []byte
	json      []byte
	id        []byte
}

// The frames' JSON.
type (
	notificationMessage struct {
		Type   string    `json:"type"` // "notification"
		Data   feed.Item `json:"data"`
		Cursor string    `json:"cursor"`
	}
	// stateMessage is a change of state: of one notification (ID), or a
	// watermark (Through: read-all, archive-all, the seen position).
	stateMessage struct {
		Type    string `json:"type"` // "read", "unread", "archived", "unarchived", "seen"
		ID      string `json:"id,omitempty"`
		Through string `json:"through,omitempty"`
		// Unread names, for a read-all, the notifications through Through
		// in feed order that it did not mark read: they committed after
		// read-all was asked. Unarchived names them for an archive-all.
		Unread     []string `json:"unread,omitempty"`
		Unarchived []string `json:"unarchived,omitempty"`
		Cursor     string   `json:"cursor"`
	}
	readyMessage struct {
		Type   string `json:"type"` // "ready"
		Cursor string `json:"cursor"`
	}
)

// errLineBreak: a frame's JSON holds a line break, which an event stream's
// data line cannot carry. encoding/json never writes one (it escapes them in
// strings and compacts raw values), so this is a bug.
var errLineBreak = errors.New("live: a frame's JSON holds a line break")

// textFrame encodes v as a frame of kind, a text frame on a WebSocket;
// cursor, when set, is its event id on an event stream.
func textFrame(kind frameKind, v any, cursor string) (frame, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return frame{}, err
	}
	if bytes.ContainsAny(payload, "\r\n") {
		return frame{}, errLineBreak
	}
	b := wsFrame(ws.OpText, payload)
	f := frame{kind: kind, bytes: b, json: b[len(b)-len(payload):]}
	if cursor != "" {
		f.id = []byte("id: " + cursor + "\n")
	}
	return f, nil
}

// appPong answers an app's {"type":"ping"}: browsers and React Native hide
// the WebSocket's own pings from the app, so an app that wants to know its
// socket still reaches the server asks with a text frame and times the
// answer (a half-open connection otherwise looks open for many minutes).
var appPong = frame{kind: kindPong, bytes: wsFrame(ws.OpText, []byte(`{"type":"pong"}`))}

// isAppPing reports whether an app's text frame is {"type":"ping"}.
func isAppPing(msg []byte) bool {
	var m struct {
		Type string `json:"type"`
	}
	return len(msg) < 64 && json.Unmarshal(msg, &m) == nil && m.Type == "ping"
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

// stateFrame is the frame of a change of state at c, of kind k.
func stateFrame(k frameKind, m stateMessage, c Cursor) (frame, error) {
	m.Type, m.Cursor = k.label(), c.String()
	f, err := textFrame(k, m, m.Cursor)
	f.pos, f.createdAt = c.Position, c.At
	return f, err
}

func notificationFrame(n feed.Notification, c Cursor, live bool) (frame, error) {
	cursor := c.String()
	f, err := textFrame(kindNotification, notificationMessage{Type: "notification", Data: n.Item(), Cursor: cursor}, cursor)
	f.pos, f.createdAt = c.Position, n.CreatedAt
	if live {
		f.at = n.CreatedAt
	}
	return f, err
}

// StatusTryAgainLater (1013, registered with IANA) closes a socket that
// could not keep up: the app reconnects with its last cursor and misses nothing.
const StatusTryAgainLater ws.StatusCode = 1013

// closeMessage is how an event stream ends where a WebSocket sends a close
// frame: the same code and reason, as the last data line.
type closeMessage struct {
	Type   string        `json:"type"` // "close"
	Code   ws.StatusCode `json:"code"`
	Reason string        `json:"reason"`
}

func closeFrame(code ws.StatusCode, reason string) frame {
	// The reason is the server's own text: it marshals, and holds no line break.
	payload, _ := json.Marshal(closeMessage{Type: "close", Code: code, Reason: reason})
	return frame{kind: kindClose, bytes: wsFrame(ws.OpClose, ws.NewCloseFrameBody(code, reason)), json: payload}
}

// The event stream's framing (text/event-stream): each frame is its id line
// when it has one, then one data line, then a blank line; a ping is a
// comment line, which an EventSource ignores and a proxy sees as traffic.
var (
	sseData  = []byte("data: ")
	sseEnd   = []byte("\n\n")
	ssePing  = []byte(": ping\n\n")
	sseStart = []byte("HTTP/1.1 200 OK\r\n" +
		"Content-Type: text/event-stream; charset=utf-8\r\n" +
		"Cache-Control: no-store\r\n" +
		"X-Accel-Buffering: no\r\n" +
		"Connection: close\r\n\r\n")
)

// appendSSE appends f as an event stream writes it, without copying its
// JSON. A pong has no form there (an event stream's client sends nothing).
func appendSSE(bufs net.Buffers, f frame) net.Buffers {
	switch {
	case f.kind == kindPing:
		return append(bufs, ssePing)
	case f.json == nil:
		return bufs
	case f.id != nil:
		return append(bufs, f.id, sseData, f.json, sseEnd)
	}
	return append(bufs, sseData, f.json, sseEnd)
}

// sseSize is the length of f on an event stream.
func sseSize(f frame) int {
	switch {
	case f.kind == kindPing:
		return len(ssePing)
	case f.json == nil:
		return 0
	}
	return len(f.id) + len(sseData) + len(f.json) + len(sseEnd)
}
