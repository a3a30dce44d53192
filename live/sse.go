package live

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/spoolcast/spoolcast/internal/problem"
)

// The stream as an event stream (Server-Sent Events): the same frames, for
// clients that cannot open a WebSocket, or a browser's EventSource. Each
// frame that carries a cursor (notification, ready) is sent with the cursor
// as its event id, so an EventSource that reconnects sends it back as
// Last-Event-ID and resumes exactly where it stopped.
//
// It is served by the sockets' own machinery, over the HTTP/1.1 connection
// taken over from the server (as a WebSocket upgrade takes it): the status
// line and headers are written once, then frames without chunked encoding,
// the body ending when the connection closes. So an idle event stream costs
// what an idle WebSocket does: its connection, a small struct and one
// goroutine blocked reading, which notices the client closing.

// WantsEventStream reports whether r asks for the stream as an event stream:
// it is not a WebSocket handshake, and its Accept names text/event-stream
// (not only */*: a plain GET stays a refused WebSocket handshake).
func WantsEventStream(r *http.Request) bool {
	return !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && acceptsEventStream(r.Header.Values("Accept"))
}

// acceptsEventStream reports whether Accept header values name
// text/event-stream with a quality above zero.
func acceptsEventStream(values []string) bool {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			media, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(media), "text/event-stream") {
				continue
			}
			if quality(params) > 0 {
				return true
			}
		}
	}
	return false
}

// quality is the q parameter among a media range's parameters: 1 when
// absent or malformed (RFC 9110 gives no meaning to a malformed one; the
// range was named, so it is taken).
func quality(params string) float64 {
	for p := range strings.SplitSeq(params, ";") {
		k, v, _ := strings.Cut(p, "=")
		if !strings.EqualFold(strings.TrimSpace(k), "q") {
			continue
		}
		q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || q != q || q < 0 || q > 1 { // NaN, or out of range
			return 1
		}
		return q
	}
	return 1
}

// sseCursor is where an event stream resumes, and the field it came from:
// Last-Event-ID, which an EventSource sends when it reconnects to its
// original URL, wins over after, which that URL may hold from the first
// connection (the later position is the one the client last got).
func sseCursor(r *http.Request) (after *Cursor, field string, err error) {
	v := r.Header.Get("Last-Event-ID")
	field = "Last-Event-ID"
	if v == "" {
		q, ok := r.URL.Query()["after"]
		if !ok {
			return nil, "", nil
		}
		v, field = q[0], "after"
	}
	c, err := ParseCursor(v)
	if err != nil {
		return nil, field, err
	}
	return &c, field, nil
}

// serveSSE answers r with an event stream of user's frames.
func (h *Hub) serveSSE(w http.ResponseWriter, r *http.Request, user string, redeem func(context.Context) error) {
	after, field, err := sseCursor(r)
	if err != nil {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor,
			field+" is not a stream cursor this server issued; connect without it and load the feed").On(field))
		return
	}
	if r.ProtoMajor != 1 {
		// An HTTP/2 stream cannot be taken over; central speaks HTTP/1.1
		// behind its ingress, which may speak HTTP/2 to browsers.
		problem.Write(w, r, problem.New(http.StatusHTTPVersionNotSupported, problem.InvalidRequest,
			"the event stream is served over HTTP/1.1 (put central behind a proxy that speaks HTTP/1.1 to it), or open the stream as a WebSocket"))
		return
	}
	release, ok := h.admitStream(w, r, user, after, field, redeem)
	if !ok {
		return
	}
	defer release()
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		h.log.Error("the event stream cannot take over the connection", "err", err)
		problem.Write(w, r, problem.New(http.StatusInternalServerError, problem.InternalError, "the server cannot serve an event stream on this connection; open the stream as a WebSocket"))
		return
	}
	// The request's own bytes were read; any more the client sent counts
	// against what readSSE lets it send.
	buffered := rw.Reader.Buffered()
	_ = conn.SetWriteDeadline(h.deadline(h.cfg.WriteTimeout))
	if _, err := conn.Write(sseStart); err != nil {
		_ = conn.Close()
		return
	}
	s := newSocket(h, conn, user, transportSSE)
	h.start(s, after, func() { s.readSSE(buffered) })
}
