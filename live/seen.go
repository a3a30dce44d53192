package live

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Seen positions. An app says how far it has shown the stream: a seen
// message on its WebSocket ({"type":"seen","cursor":…}), or POST
// /v1/stream/seen. The user's seen position (stream_seen) is the furthest
// cursor any of their apps sent; it never moves back. It is the user's seen
// state (feed.States): a notification at or before it in the stream is
// seen. Each move that covers a notification it did not before is a change
// of state (state_events, kind seen) naming the newest notification it
// covers in feed order, which the stream sends every socket of the user
// and by which seen_at is told. Suppress-if-seen reads the position too.
//
// The WebSocket's messages, which an app may send at every frame it
// shows, are gathered per user and written each seenWrite, in one
// statement for every user; a request is written at once.

// seenWrite is how often the gathered seen messages are written.
const seenWrite = time.Second

// seenChunk bounds the users one statement writes.
const seenChunk = 5000

// seenMessage is what an app sends on the stream once it has shown frames:
// {"type":"seen","cursor":"<the last frame's cursor>"}.
type seenMessage struct {
	Type   string `json:"type"`
	Cursor string `json:"cursor"`
}

// seenBatch gathers the furthest position each user said they saw since
// the last write.
type seenBatch struct {
	mu   sync.Mutex
	seen map[string]Cursor
}

func (b *seenBatch) add(user string, c Cursor) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen == nil {
		b.seen = map[string]Cursor{}
	}
	if old, ok := b.seen[user]; !ok || old.Less(c.Position) {
		b.seen[user] = c
	}
}

func (b *seenBatch) take() map[string]Cursor {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.seen
	b.seen = nil
	return out
}

// clientMessage handles a text frame from the client: a seen message moves
// the user's seen position; anything else is ignored, as before.
func (h *Hub) clientMessage(user string, payload []byte) {
	var m seenMessage
	if json.Unmarshal(payload, &m) != nil || m.Type != "seen" {
		return
	}
	if c, err := ParseCursor(m.Cursor); err == nil && h.mayBeSeen(c) {
		h.seenBatch.add(user, c)
	}
}

// Seen moves user's seen position to cursor at once, as a seen message on
// a WebSocket does within a second, for an app on an event stream, which
// cannot send on it (POST /v1/stream/seen). ErrBadCursor for a cursor this
// server did not issue; like the message, a cursor of another history, or
// one behind the position, changes nothing.
func (h *Hub) Seen(ctx context.Context, user, cursor string) error {
	c, err := ParseCursor(cursor)
	if err != nil {
		return err
	}
	if !h.mayBeSeen(c) {
		return nil
	}
	return h.writeSeen(ctx, map[string]Cursor{user: c})
}

// mayBeSeen tells whether c may move a seen position: only a cursor of the
// reader's history and below what it has seen counts; a cursor from before
// a failover says nothing here.
func (h *Hub) mayBeSeen(c Cursor) bool {
	st := h.state.Load()
	return st != nil && c.History == st.history && c.Tx <= st.xmax
}

// seenLoop writes the gathered seen messages each seenWrite, and once more
// as the hub stops.
func (h *Hub) seenLoop(ctx context.Context) {
	write := func(ctx context.Context) {
		seen := h.seenBatch.take()
		if len(seen) == 0 {
			return
		}
		if err := h.writeSeen(ctx, seen); err != nil {
			if ctx.Err() == nil {
				h.log.Warn("record seen positions; they are tried again", "err", err)
			}
			for u, c := range seen {
				h.seenBatch.add(u, c)
			}
		}
	}
	startstop.Every(ctx, startstop.Schedule{Interval: seenWrite, Clock: h.cfg.Clock}, func(ctx context.Context) bool {
		write(ctx)
		return false
	})
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	write(bg)
}

// writeSeenSQL moves each user's seen position forward to its cursor
// ($1 users, $2 transaction ids, $3 ids, $4 the cursors' times; $5 the
// slack): for each move, the newest notification it covers in feed order
// (a row created more than the slack before the cursor's time is covered:
// it committed before the cursor's transaction began; one created up to
// the slack after may be), and whether it covers one it did not before
// (read between the two positions in commit order, within the times they
// bound). A move that does records a seen change of state.
const writeSeenSQL = `WITH input AS (
		SELECT t.u, t.tx::text::xid8 AS tx, t.id, t.at
		FROM unnest($1::text[], $2::int8[], $3::int8[], $4::timestamptz[]) AS t(u, tx, id, at)
	), forward AS (
		SELECT i.*, s.through_tx AS old_tx, s.through_id AS old_id, s.through_at AS old_at
		FROM input i LEFT JOIN stream_seen s ON s.user_id = i.u
		WHERE s.user_id IS NULL OR (i.tx, i.id) > (s.through_tx, s.through_id)
	), looked AS (
		SELECT f.*, t.created_at AS note_at, t.id AS note_seq,
			EXISTS (SELECT 1 FROM notifications n WHERE n.user_id = f.u
				AND (n.tx, n.id) > (coalesce(f.old_tx, '0'::xid8), coalesce(f.old_id, 0)) AND (n.tx, n.id) <= (f.tx, f.id)
				AND n.created_at >= coalesce(f.old_at, '-infinity') - $5::interval AND n.created_at < f.at + $5::interval) AS covers
		FROM forward f LEFT JOIN LATERAL (
			SELECT n.created_at, n.id FROM notifications n
			WHERE n.user_id = f.u AND n.created_at < f.at + $5::interval
			  AND (n.created_at < f.at - $5::interval OR (n.tx, n.id) <= (f.tx, f.id))
			ORDER BY n.created_at DESC, n.id DESC LIMIT 1) t ON true
	), moved AS (
		INSERT INTO stream_seen AS s (user_id, through_tx, through_id, through_at, note_at, note_seq)
		SELECT u, tx, id, at, note_at, note_seq FROM looked
		ON CONFLICT (user_id) DO UPDATE SET through_tx = EXCLUDED.through_tx, through_id = EXCLUDED.through_id,
			through_at = EXCLUDED.through_at, note_at = EXCLUDED.note_at, note_seq = EXCLUDED.note_seq, seen_at = now()
		WHERE (EXCLUDED.through_tx, EXCLUDED.through_id) > (s.through_tx, s.through_id)
		RETURNING s.user_id
	), told AS (
		INSERT INTO state_events (user_id, kind, note_at, note_seq, seen_tx, seen_id)
		SELECT l.u, 'seen', l.note_at, l.note_seq, l.tx, l.id FROM looked l JOIN moved m ON m.user_id = l.u
		WHERE l.covers AND l.note_at IS NOT NULL
		ORDER BY l.u
	)
	SELECT count(*) FROM moved`

// writeSeen moves the users' seen positions forward, seenChunk users a
// statement.
func (h *Hub) writeSeen(ctx context.Context, seen map[string]Cursor) error {
	users := make([]string, 0, min(len(seen), seenChunk))
	var txs, ids []int64
	var ats []time.Time
	flush := func() error {
		var n int
		err := h.cfg.DB.QueryRow(ctx, writeSeenSQL, users, txs, ids, ats, feed.IngestSlack).Scan(&n)
		users, txs, ids, ats = users[:0], txs[:0], ids[:0], ats[:0]
		return err
	}
	for u, c := range seen {
		users, txs, ids, ats = append(users, u), append(txs, int64(c.Tx)), append(ids, c.ID), append(ats, c.At)
		if len(users) == seenChunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if len(users) == 0 {
		return nil
	}
	return flush()
}
