package live

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gobwas/ws"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/problem"
)

// cursorCheckTimeout bounds the check of a resuming socket's cursor.
const cursorCheckTimeout = 5 * time.Second

// Serve serves r the live stream of user, whom the caller has authenticated,
// and returns: the stream is served in the background until it closes or the
// hub shuts down. A WebSocket handshake is upgraded; a request that accepts
// text/event-stream (WantsEventStream) is answered with an event stream of
// the same frames (sse.go). Before either, a request that is neither, or
// carries a cursor this server did not issue, is answered with a problem; so
// is one that comes while the hub is not ready or past its caps.
func (h *Hub) Serve(w http.ResponseWriter, r *http.Request, user string) {
	h.ServeTicket(w, r, user, nil)
}

// ServeTicket is Serve for an event stream opened with a ticket: redeem
// uses the ticket up once the handshake passed every other check (the
// caps, readiness, the cursor), just before the stream begins; ErrTicket
// from it (the ticket was used meanwhile) refuses the stream 401. nil:
// nothing to redeem.
func (h *Hub) ServeTicket(w http.ResponseWriter, r *http.Request, user string, redeem func(context.Context) error) {
	if WantsEventStream(r) {
		h.serveSSE(w, r, user, redeem)
		return
	}
	var after *Cursor
	if v, ok := r.URL.Query()["after"]; ok {
		c, err := ParseCursor(v[0])
		if err != nil {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor, "after is not a stream cursor this server issued; connect without it and load the feed").On("after"))
			return
		}
		after = &c
	}
	if p := handshakeProblem(r); p != nil {
		if p.Status == http.StatusUpgradeRequired {
			w.Header().Set("Upgrade", "websocket")
			w.Header().Set("Sec-WebSocket-Version", "13")
		}
		problem.Write(w, r, *p)
		return
	}
	release, ok := h.admitStream(w, r, user, after, "after", redeem)
	if !ok {
		return
	}
	defer release()
	upgrader := ws.HTTPUpgrader{
		Timeout:  h.cfg.WriteTimeout,
		Protocol: func(p string) bool { return p == auth.WebSocketProtocol }, // never the token
	}
	conn, rw, _, err := upgrader.Upgrade(r, w)
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		h.log.Debug("upgrade failed", "err", err)
		return
	}
	// The handshake's buffers are not kept: an idle socket holds only its
	// connection and one goroutine. Bytes the client sent early are.
	var early []byte
	if n := rw.Reader.Buffered(); n > 0 {
		early, _ = rw.Reader.Peek(n)
		early = append([]byte(nil), early...)
	}
	s := newSocket(h, conn, user, transportWebSocket)
	h.start(s, after, func() { s.read(early) })
}

// admitStream makes the checks every stream handshake shares, after its
// transport's own: the hub is ready, the caps (which count the handshake
// from here on), and the resume's cursor (field names where it came from).
// It answers a refusal itself (false); otherwise the caller calls release
// once the socket is registered, or not.
func (h *Hub) admitStream(w http.ResponseWriter, r *http.Request, user string, after *Cursor, field string, redeem func(context.Context) error) (release func(), ok bool) {
	if !h.Ready() {
		w.Header().Set("Retry-After", "1")
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "this replica is not serving the stream right now; reconnect"))
		return nil, false
	}
	release, err := h.admit(user)
	switch {
	case errors.Is(err, errUserSockets):
		// Retry-After alone: the request-rate fields another layer set
		// (--rate-limit-user) do not describe this refusal, and their t
		// would tell the app to retry sooner.
		w.Header().Del("RateLimit")
		w.Header().Del("RateLimit-Policy")
		w.Header().Set("Retry-After", "10")
		problem.Write(w, r, problem.New(http.StatusTooManyRequests, problem.TooManySockets,
			fmt.Sprintf("this user already has %d streams open on this replica (WebSockets and event streams together); close one (or reuse one per app) and retry", h.cfg.MaxSocketsPerUser)))
		return nil, false
	case err != nil:
		w.Header().Set("Retry-After", "1")
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "this replica serves as many streams as it may; reconnect (another replica answers)"))
		return nil, false
	}
	if after != nil {
		// After the caps, which count this handshake from here on, and
		// bounded: after a failover every app checks its cursor at once,
		// and neither a full replica nor a stalled Postgres may pile up
		// checks.
		cctx, cancel := context.WithTimeout(r.Context(), cursorCheckTimeout)
		err := h.checkCursor(cctx, *after)
		cancel()
		switch {
		case errors.Is(err, ErrOtherHistory):
			release()
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor,
				field+" is from another history of the database (it was restored or failed over): connect without it and load the feed").On(field))
			return nil, false
		case err != nil:
			release()
			w.Header().Set("Retry-After", "1")
			problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "the stream cannot check the cursor now; reconnect"))
			return nil, false
		}
	}
	if redeem != nil {
		// Last: a handshake refused above keeps its ticket.
		rctx, cancel := context.WithTimeout(r.Context(), cursorCheckTimeout)
		err := redeem(rctx)
		cancel()
		switch {
		case errors.Is(err, ErrTicket):
			release()
			h.metrics.AuthFailed()
			w.Header().Set("WWW-Authenticate", auth.Challenge(auth.ErrBadToken))
			problem.Write(w, r, problem.New(http.StatusUnauthorized, problem.Unauthorized, TicketRefused))
			return nil, false
		case err != nil:
			release()
			w.Header().Set("Retry-After", "1")
			problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "the stream cannot check the ticket now; reconnect with a new one"))
			return nil, false
		}
	}
	return release, true
}

// start registers s and serves it: read runs its read loop, and the resume
// after the cursor runs under the hub's loops, so that Shutdown cancels it
// and waits for it. Once Shutdown has begun no socket registers: s is told
// to go away and closed.
func (h *Hub) start(s *socket, after *Cursor, read func()) {
	if !h.add(s) {
		s.writeNow(closeFrame(ws.StatusGoingAway, "server shutting down; reconnect"))
		_ = s.conn.Close()
		return
	}
	go read()
	// Ready returned true: the reader has set serving.
	h.svc.Go(h.serving, func(ctx context.Context) { h.resume(ctx, s, after) })
}

// handshakeProblem checks what the upgrade would refuse, so that a refusal
// is a problem document like every other error of the API.
func handshakeProblem(r *http.Request) *problem.Problem {
	bad := func(status int, detail string) *problem.Problem {
		p := problem.New(status, problem.NotAWebSocket, detail)
		return &p
	}
	switch {
	case !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || !headerHasToken(r.Header.Values("Connection"), "upgrade"):
		return bad(http.StatusUpgradeRequired, "GET /v1/stream is a WebSocket: send Upgrade: websocket and Connection: Upgrade; or, for an event stream, Accept: text/event-stream")
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return bad(http.StatusUpgradeRequired, "Sec-WebSocket-Version must be 13")
	case len(r.Header.Get("Sec-WebSocket-Key")) != 24:
		return bad(http.StatusBadRequest, "Sec-WebSocket-Key must be 16 bytes in base64")
	}
	return nil
}

func headerHasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// checkCursor refuses a cursor from another history of the database, or
// beyond what it has seen (ErrOtherHistory). The reader's last look answers
// for a cursor of its history and below its next transaction id; any other
// (a version 1 cursor without a history, a newer id) is checked against
// Postgres.
func (h *Hub) checkCursor(ctx context.Context, c Cursor) error {
	if st := h.state.Load(); st != nil && c.History == st.history && c.Tx <= st.xmax {
		return nil
	}
	done, err := h.resumeTurn(ctx, nil)
	if err != nil {
		return err
	}
	defer done()
	st, err := readStateOf(ctx, h.cfg.DB)
	if err != nil {
		return err
	}
	return follows(ctx, h.cfg.DB, c, st)
}
