// Package sseclient is a small client of the live stream's event stream
// form (GET /v1/stream with Accept: text/event-stream) for tests: it sends
// the request by hand over one connection, as an EventSource does, and reads
// events as the live stream's messages, as wsclient does for the WebSocket.
package sseclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gobwas/ws"

	"github.com/spoolcast/spoolcast/internal/wsclient"
)

// Conn is one event stream.
type Conn struct {
	conn net.Conn
	br   *bufio.Reader
	// Response is the server's answer, its body unread (Next reads it).
	Response *http.Response
	// LastEventID is the id of the last event that had one: what an
	// EventSource would send back as Last-Event-ID.
	LastEventID string
	// Pings counts the comment lines (heartbeats) read so far.
	Pings int
	// The event being read, kept across a timeout: a line cut short, the
	// event's id and data lines so far.
	line   []byte
	id     *string
	data   [][]byte
	inPing bool
}

// Options are what a request carries beyond Accept.
type Options struct {
	// Token is sent as Authorization: Bearer when set.
	Token string
	// Query is the URL's query (after, ticket).
	Query url.Values
	// Header holds more header fields (Last-Event-ID, Origin).
	Header http.Header
}

// Dial opens the event stream at base (http://host:port). Any answer other
// than 200 is returned with the connection closed: its Response holds the
// status, the header and the body, read whole.
func Dial(ctx context.Context, base string, o Options) (*Conn, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	u.Path = "/v1/stream"
	u.RawQuery = o.Query.Encode()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	for k, vs := range o.Header {
		req.Header[k] = vs
	}
	req.Header.Set("Accept", "text/event-stream")
	if o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+o.Token)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	c := &Conn{conn: conn, br: br, Response: resp}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		conn.Close()
		return c, &StatusError{Status: resp.StatusCode, Body: body}
	}
	c.br = bufio.NewReader(resp.Body)
	return c, nil
}

// StatusError is an answer other than 200.
type StatusError struct {
	Status int
	Body   []byte
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

// Next reads the next event, counting pings meanwhile, waiting at most d.
// A close event is a *wsclient.CloseError, as a WebSocket's close frame is.
// An event cut by the wait's end is kept: the next call goes on reading it.
func (c *Conn) Next(d time.Duration) (wsclient.Message, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	for {
		chunk, err := c.br.ReadSlice('\n')
		c.line = append(c.line, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return wsclient.Message{}, err
		}
		line := strings.TrimSuffix(string(c.line), "\n")
		c.line = c.line[:0]
		if line != "" {
			c.field(line)
			continue
		}
		if c.inPing && c.data == nil {
			c.Pings++
		}
		id, data := c.id, c.data
		c.id, c.data, c.inPing = nil, nil, false
		if id != nil {
			c.LastEventID = *id
		}
		if data == nil {
			continue
		}
		raw := bytes.Join(data, []byte("\n"))
		var m wsclient.Message
		if err := json.Unmarshal(raw, &m); err != nil {
			return wsclient.Message{}, fmt.Errorf("event %q: %w", raw, err)
		}
		m.Raw = raw
		if m.Type == "close" {
			var cm struct {
				Code   ws.StatusCode `json:"code"`
				Reason string        `json:"reason"`
			}
			_ = json.Unmarshal(raw, &cm)
			return m, &wsclient.CloseError{Code: cm.Code, Reason: cm.Reason}
		}
		return m, nil
	}
}

// field takes one line of an event.
func (c *Conn) field(line string) {
	if strings.HasPrefix(line, ":") {
		c.inPing = c.inPing || strings.TrimSpace(line[1:]) == "ping"
		return
	}
	name, value, _ := strings.Cut(line, ":")
	value = strings.TrimPrefix(value, " ")
	switch name {
	case "id":
		c.id = &value
	case "data":
		c.data = append(c.data, []byte(value))
	}
}

// Close closes the connection, as a dropped network or a closed tab does.
func (c *Conn) Close() error { return c.conn.Close() }

// NetConn is the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.conn }
