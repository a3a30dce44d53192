// Package wsclient is a small client of the live stream for tests, the load
// generator and the dev tour: it dials /v1/stream with a token, answers
// pings, and reads frames as messages.
package wsclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/gobwas/ws"
)

// Protocol is the subprotocol that carries the token.
const Protocol = "spoolcast.bearer.v1"

// Message is one frame of the stream.
type Message struct {
	Type    string          `json:"type"`
	Data    json.RawMessage `json:"data,omitempty"`
	Cursor  string          `json:"cursor,omitempty"`
	ID      string          `json:"id,omitempty"`
	Through string          `json:"through,omitempty"`
	Unread  []string        `json:"unread,omitempty"`
	// Raw is the frame's payload as sent.
	Raw []byte `json:"-"`
}

// Item is the notification a notification frame carries.
type Item struct {
	ID     string     `json:"id"`
	Type   string     `json:"type"`
	Title  string     `json:"title"`
	Body   string     `json:"body"`
	ReadAt *time.Time `json:"read_at"`
}

// Item decodes a notification frame's data.
func (m Message) Item() (Item, error) {
	var it Item
	err := json.Unmarshal(m.Data, &it)
	return it, err
}

// Conn is one stream connection.
type Conn struct {
	conn net.Conn
	r    io.Reader
	// The frame being read, kept across a timeout: its header bytes so
	// far and their number in all, its payload and how much of it came,
	// and the payloads of a fragmented message before its last frame.
	header    []byte
	headerLen int
	frame     ws.Header
	payload   []byte
	got       int
	data      []byte
	// Protocol is the subprotocol the server chose.
	Protocol string
}

// Dial opens the stream at base (http://host:port) for token, after the
// cursor when it is set.
func Dial(ctx context.Context, base, token, after string) (*Conn, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path = "/v1/stream"
	if after != "" {
		u.RawQuery = url.Values{"after": {after}}.Encode()
	}
	var status int
	d := ws.Dialer{
		Protocols: []string{Protocol, token},
		Timeout:   10 * time.Second,
		OnStatusError: func(code int, _ []byte, _ io.Reader) {
			status = code
		},
	}
	conn, br, hs, err := d.Dial(ctx, u.String())
	if err != nil {
		if status != 0 {
			return nil, fmt.Errorf("stream handshake: HTTP %d: %w", status, err)
		}
		return nil, fmt.Errorf("stream handshake: %w", err)
	}
	var r io.Reader = conn
	if br != nil {
		// Frames the server sent right after the handshake.
		early, _ := br.Peek(br.Buffered())
		r = io.MultiReader(bytes.NewReader(bytes.Clone(early)), conn)
		ws.PutReader(br)
	}
	return &Conn{conn: conn, r: r, Protocol: hs.Protocol}, nil
}

// CloseError is the server's close frame.
type CloseError struct {
	Code   ws.StatusCode
	Reason string
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("closed by the server: %d %s", e.Code, e.Reason)
}

// Next reads the next data frame, answering pings meanwhile, waiting at most
// d. The server's close frame is a *CloseError, answered before it returns.
// A frame cut by the wait's end is kept: the next call goes on reading it,
// so that a timeout never loses or garbles a frame.
func (c *Conn) Next(d time.Duration) (Message, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	for {
		h, payload, err := c.readFrame()
		if err != nil {
			return Message{}, err
		}
		switch h.OpCode {
		case ws.OpPing:
			// A pong that cannot be sent is no answer yet: the server may
			// have closed after a close frame that is already buffered,
			// and reading on finds it (or the connection's end).
			_ = c.write(ws.OpPong, payload)
			continue
		case ws.OpPong:
			continue
		case ws.OpClose:
			ce := &CloseError{Code: ws.StatusNoStatusRcvd}
			if len(payload) >= 2 {
				ce.Code = ws.StatusCode(binary.BigEndian.Uint16(payload))
				ce.Reason = string(payload[2:])
			}
			_ = c.write(ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
			return Message{}, ce
		}
		c.data = append(c.data, payload...)
		if !h.Fin {
			continue
		}
		data := c.data
		c.data = nil
		var m Message
		if err := json.Unmarshal(data, &m); err != nil {
			return Message{}, fmt.Errorf("frame %q: %w", data, err)
		}
		m.Raw = data
		return m, nil
	}
}

// readFrame reads one frame, going on with the one a timeout cut short.
func (c *Conn) readFrame() (ws.Header, []byte, error) {
	for c.headerLen == 0 || len(c.header) < c.headerLen {
		if c.headerLen == 0 {
			c.headerLen = 2
		}
		var b [14]byte
		n, err := c.r.Read(b[:c.headerLen-len(c.header)])
		c.header = append(c.header, b[:n]...)
		if len(c.header) == 2 && c.headerLen == 2 {
			switch c.header[1] & 0x7f {
			case 126:
				c.headerLen += 2
			case 127:
				c.headerLen += 8
			}
			if c.header[1]&0x80 != 0 {
				c.headerLen += 4
			}
		}
		if err != nil && len(c.header) < c.headerLen {
			return ws.Header{}, nil, err
		}
	}
	if c.payload == nil {
		h, err := ws.ReadHeader(bytes.NewReader(c.header))
		if err != nil {
			return ws.Header{}, nil, err
		}
		c.frame, c.payload = h, make([]byte, h.Length)
	}
	for c.got < len(c.payload) {
		n, err := c.r.Read(c.payload[c.got:])
		c.got += n
		if err != nil && c.got < len(c.payload) {
			return ws.Header{}, nil, err
		}
	}
	h, payload := c.frame, c.payload
	c.header, c.headerLen, c.payload, c.got = c.header[:0], 0, nil, 0
	if h.Masked {
		ws.Cipher(payload, h.Mask, 0)
	}
	return h, payload, nil
}

// SendText sends one text frame, such as a seen message.
func (c *Conn) SendText(payload []byte) error { return c.write(ws.OpText, payload) }

// write sends one masked frame, as a client must.
func (c *Conn) write(op ws.OpCode, payload []byte) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return ws.WriteFrame(c.conn, ws.MaskFrameInPlace(ws.NewFrame(op, true, payload)))
}

// Closed reports the close code of err from Next, if it is a close frame.
func Closed(err error) (ws.StatusCode, bool) {
	var ce *CloseError
	if errors.As(err, &ce) {
		return ce.Code, true
	}
	return 0, false
}

// Close closes the connection without a close frame, as a dropped network does.
func (c *Conn) Close() error { return c.conn.Close() }

// CloseNormally sends a close frame and closes.
func (c *Conn) CloseNormally() error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_ = c.write(ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
	return c.conn.Close()
}

// NetConn is the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.conn }
