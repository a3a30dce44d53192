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

// Serve upgrades r to the live stream of user, whom the caller has
// authenticated, and returns: the socket is served in the background until
// it closes or the hub shuts down. Before the upgrade, a request that is not
// a WebSocket handshake, or carries a cursor this server did not issue, is
// answered with a problem; so is one that comes while the hub is not ready.
func (h *Hub) Serve(w http.ResponseWriter, r *http.Request, user string) {
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
	if !h.Ready() {
		w.Header().Set("Retry-After", "1")
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "this replica is not serving the stream right now; reconnect"))
		return
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
			fmt.Sprintf("this user already has %d sockets open on this replica; close one (or reuse one per app) and retry", h.cfg.MaxSocketsPerUser)))
		return
	case err != nil:
		w.Header().Set("Retry-After", "1")
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "this replica serves as many sockets as it may; reconnect (another replica answers)"))
		return
	}
	defer release()
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
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor,
				"after is from another history of the database (it was restored or failed over): connect without it and load the feed").On("after"))
			return
		case err != nil:
			w.Header().Set("Retry-After", "1")
			problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.StreamUnavailable, "the stream cannot check the cursor now; reconnect"))
			return
		}
	}
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
	s := newSocket(h, conn, user)
	if !h.add(s) {
		_ = conn.SetWriteDeadline(h.deadline(h.cfg.WriteTimeout))
		_, _ = conn.Write(closeFrame(ws.StatusGoingAway, "server shutting down; reconnect").bytes)
		_ = conn.Close()
		return
	}
	go s.read(early)
	// Ready returned true: the reader has set serving. The resume runs
	// under the hub's loops, so Shutdown cancels it and waits for it; once
	// Shutdown has begun it has closed the socket, and no resume starts.
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
		return bad(http.StatusUpgradeRequired, "GET /v1/stream is a WebSocket: send Upgrade: websocket and Connection: Upgrade")
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
	st, err := readStateOf(ctx, h.cfg.DB)
	if err != nil {
		return err
	}
	return follows(ctx, h.cfg.DB, c, st)
}
