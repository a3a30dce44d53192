package live

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Presence and seen positions, for suppress-if-seen (push waits for a user
// with an open stream to see the notification). A replica records in
// Postgres which users hold a socket on it (stream_presence) and how far
// each user's app said it has seen the stream (stream_seen); the push
// dispatchers of every replica read both.

// Presence timings: changes are written within presenceWrite; every row is
// refreshed each presenceRefresh and lives presenceTTL, so the rows of a
// replica killed expire on their own.
const (
	presenceWrite   = time.Second
	presenceRefresh = 20 * time.Second
	presenceTTL     = 60 * time.Second
	// presenceChunk bounds the users one statement writes.
	presenceChunk = 5000
)

// presence is the state of the presence and seen writer.
type presence struct {
	mu       sync.Mutex
	appeared map[string]bool     // users whose first socket opened since the last write
	left     map[string]bool     // users whose last socket closed since the last write
	seen     map[string]Position // the furthest position each user saw since the last write
	replica  string
}

func newPresence(replica string) *presence {
	if replica == "" {
		host, _ := os.Hostname()
		replica = fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	}
	return &presence{appeared: map[string]bool{}, left: map[string]bool{}, seen: map[string]Position{}, replica: replica}
}

func (p *presence) opened(user string) {
	p.mu.Lock()
	p.appeared[user] = true
	delete(p.left, user)
	p.mu.Unlock()
}

func (p *presence) closed(user string) {
	p.mu.Lock()
	p.left[user] = true
	delete(p.appeared, user)
	p.mu.Unlock()
}

func (p *presence) saw(user string, pos Position) {
	p.mu.Lock()
	if old, ok := p.seen[user]; !ok || old.Less(pos) {
		p.seen[user] = pos
	}
	p.mu.Unlock()
}

// take returns and clears what changed since the last write.
func (p *presence) take() (appeared, left []string, seen map[string]Position) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for u := range p.appeared {
		appeared = append(appeared, u)
	}
	for u := range p.left {
		left = append(left, u)
	}
	seen = p.seen
	p.appeared, p.left, p.seen = map[string]bool{}, map[string]bool{}, map[string]Position{}
	return appeared, left, seen
}

// seenMessage is what an app sends on the stream once it has shown frames:
// {"type":"seen","cursor":"<the last frame's cursor>"}.
type seenMessage struct {
	Type   string `json:"type"`
	Cursor string `json:"cursor"`
}

// clientMessage handles a text frame from the client: a seen message moves
// the user's seen position, if the hub records presence; anything else is
// ignored, as before.
func (h *Hub) clientMessage(user string, payload []byte) {
	if h.presence == nil {
		return
	}
	var m seenMessage
	if json.Unmarshal(payload, &m) != nil || m.Type != "seen" {
		return
	}
	if c, err := ParseCursor(m.Cursor); err == nil {
		h.saw(user, c)
	}
}

// Seen moves user's seen position to cursor, as a seen message on a
// WebSocket does, for an app on an event stream, which cannot send on it
// (POST /v1/stream/seen). ErrBadCursor for a cursor this server did not
// issue; like the message, a cursor of another history changes nothing, nor
// does any cursor while the hub records no presence.
func (h *Hub) Seen(user, cursor string) error {
	c, err := ParseCursor(cursor)
	if err != nil {
		return err
	}
	h.saw(user, c)
	return nil
}

// saw records c as seen by user. Only a cursor of the reader's history and
// below what it has seen counts: a cursor from before a failover says
// nothing here.
func (h *Hub) saw(user string, c Cursor) {
	if h.presence == nil {
		return
	}
	if st := h.state.Load(); st == nil || c.History != st.history || c.Tx > st.xmax {
		return
	}
	h.presence.saw(user, c.Position)
}

// presenceLoop writes presence and seen positions each presenceWrite, and
// refreshes every present user each presenceRefresh. On stop it deletes the
// replica's rows: its sockets are closing.
func (h *Hub) presenceLoop(ctx context.Context) {
	lastRefresh := time.Time{}
	startstop.Every(ctx, startstop.Schedule{Interval: presenceWrite, Clock: h.cfg.Clock}, func(ctx context.Context) bool {
		all := h.cfg.Clock.Now().Sub(lastRefresh) >= presenceRefresh
		if err := h.writePresence(ctx, all); err != nil {
			if ctx.Err() == nil {
				h.log.Warn("record stream presence; pushes are not held for seen meanwhile", "err", err)
			}
			return false
		}
		if all {
			lastRefresh = h.cfg.Clock.Now()
			if err := h.expirePresence(ctx); err != nil && ctx.Err() == nil {
				h.log.Warn("delete expired stream presence", "err", err)
			}
		}
		return false
	})
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var n int
	_ = h.cfg.DB.QueryRow(bg, `WITH d AS (DELETE FROM stream_presence WHERE replica = $1 RETURNING 1) SELECT count(*) FROM d`, h.presence.replica).Scan(&n)
}

// writePresence writes what changed: users that appeared (or, with all,
// every present user) get a fresh expiry, users that left are deleted, seen
// positions only move forward. What fails to be written is taken again at
// the next write.
func (h *Hub) writePresence(ctx context.Context, all bool) error {
	appeared, left, seen := h.presence.take()
	fail := func(err error) error {
		for _, u := range appeared {
			h.presence.opened(u)
		}
		for u, pos := range seen {
			h.presence.saw(u, pos)
		}
		return err
	}
	if all {
		h.mu.RLock()
		appeared = appeared[:0]
		for u := range h.users {
			appeared = append(appeared, u)
		}
		h.mu.RUnlock()
	}
	for lo := 0; lo < len(appeared); lo += presenceChunk {
		chunk := appeared[lo:min(lo+presenceChunk, len(appeared))]
		var n int
		if err := h.cfg.DB.QueryRow(ctx, `WITH u AS (
				INSERT INTO stream_presence (user_id, replica, expires_at)
				SELECT u, $2, now() + $3::interval FROM unnest($1::text[]) AS u
				ON CONFLICT (user_id, replica) DO UPDATE SET expires_at = EXCLUDED.expires_at
				RETURNING 1)
			SELECT count(*) FROM u`, chunk, h.presence.replica, presenceTTL).Scan(&n); err != nil {
			return fail(err)
		}
	}
	if len(left) > 0 {
		// A user who left but has a socket again (a reconnect) stays.
		h.mu.RLock()
		gone := left[:0]
		for _, u := range left {
			if len(h.users[u]) == 0 {
				gone = append(gone, u)
			}
		}
		h.mu.RUnlock()
		var n int
		if err := h.cfg.DB.QueryRow(ctx, `WITH d AS (
				DELETE FROM stream_presence WHERE replica = $2 AND user_id = ANY($1) RETURNING 1)
			SELECT count(*) FROM d`, gone, h.presence.replica).Scan(&n); err != nil {
			for _, u := range gone {
				h.presence.closed(u)
			}
			return fail(err)
		}
	}
	if len(seen) > 0 {
		users := make([]string, 0, len(seen))
		txs := make([]int64, 0, len(seen))
		ids := make([]int64, 0, len(seen))
		for u, pos := range seen {
			users, txs, ids = append(users, u), append(txs, int64(pos.Tx)), append(ids, pos.ID)
		}
		var n int
		if err := h.cfg.DB.QueryRow(ctx, `WITH s AS (
				INSERT INTO stream_seen (user_id, through_tx, through_id)
				SELECT u, tx::text::xid8, id FROM unnest($1::text[], $2::int8[], $3::int8[]) AS t(u, tx, id)
				ON CONFLICT (user_id) DO UPDATE SET through_tx = EXCLUDED.through_tx, through_id = EXCLUDED.through_id, seen_at = now()
				WHERE (EXCLUDED.through_tx, EXCLUDED.through_id) > (stream_seen.through_tx, stream_seen.through_id)
				RETURNING 1)
			SELECT count(*) FROM s`, users, txs, ids).Scan(&n); err != nil {
			return fail(err)
		}
	}
	return nil
}

// seenKept is how long a user's seen position is kept after it last moved:
// a push waits to be seen only while its user holds a stream open, so an
// app away this long has nothing to compare.
const seenKept = 7 * 24 * time.Hour

// expirePresence deletes the presence rows that expired (replicas killed,
// whose rows nobody refreshes) and seen positions older than seenKept.
func (h *Hub) expirePresence(ctx context.Context) error {
	var n int
	return h.cfg.DB.QueryRow(ctx, `WITH p AS (DELETE FROM stream_presence WHERE expires_at < now() RETURNING 1),
			s AS (DELETE FROM stream_seen WHERE seen_at < now() - $1::interval RETURNING 1)
		SELECT (SELECT count(*) FROM p) + (SELECT count(*) FROM s)`, seenKept).Scan(&n)
}
