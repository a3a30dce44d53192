package live

import (
	"context"
	"errors"
	"time"

	"github.com/gobwas/ws"
	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
)

// errSocketClosed ends a resume whose socket closed.
var errSocketClosed = errors.New("socket closed")

// resumePage is the most rows one resume read takes.
const resumePage = 500

const readResume = `SELECT n.tx, n.id, n.type, n.category, n.title, n.body, n.data, n.producer, n.created_at, n.received_at,
		coalesce(n.read_at, CASE WHEN (n.created_at, n.id) <= (w.at, w.id) THEN w.marked END),
		` + horizon + `, now()
	FROM notifications n, ` + feed.ReadMark + ` w
	WHERE n.user_id = $1 AND n.created_at >= $2 AND n.created_at < $6 AND (n.tx, n.id) > ($3::xid8, $4::bigint)
	ORDER BY n.tx, n.id
	LIMIT $5`

// resume sends s every notification of its user after the cursor, oldest
// first, then ready. The socket is registered before the first read, so a
// row the resume does not see (its transaction was at or above the horizon)
// reaches it as a live frame; live frames held meanwhile are sent after
// ready when they come after the resume's end.
func (h *Hub) resume(ctx context.Context, s *socket, after *Cursor) {
	end, err := h.resumeRows(ctx, s, after)
	if errors.Is(err, errSocketClosed) {
		return // the app left, or the socket was closed meanwhile
	}
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("resume failed; the app reconnects and tries again", "err", err)
		}
		s.close(ws.StatusInternalServerError, "try again")
		return
	}
	s.endResume(end)
}

// resumeRows sends the rows after the cursor and returns where the socket's
// stream stands: past every row sent, and at the horizon of the last read,
// since every row below it and after the cursor has been sent.
func (h *Hub) resumeRows(ctx context.Context, s *socket, after *Cursor) (Cursor, error) {
	if after == nil {
		return h.now(ctx)
	}
	pos, at := after.Position, after.At
	from := at.Add(-txSlack)
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rows, err := h.cfg.DB.Query(rctx, readResume, s.user, from, pos.Tx, pos.ID, resumePage, h.reader.newest())
		if err != nil {
			cancel()
			return Cursor{}, err
		}
		var frames []frame
		var hz uint64
		var now time.Time
		held := false
		n := 0
		for rows.Next() {
			n++
			var p Position
			var note feed.Notification
			if err := rows.Scan(&p.Tx, &p.ID, &note.Type, &note.Category, &note.Title, &note.Body, &note.Data, &note.Producer,
				&note.CreatedAt, &note.ReceivedAt, &note.ReadAt, &hz, &now); err != nil {
				rows.Close()
				cancel()
				return Cursor{}, err
			}
			if p.Tx >= hz {
				held = true // it reaches the socket as a live frame
				break
			}
			note.ID = p.ID
			f, err := notificationFrame(note, Cursor{Position: p, At: note.CreatedAt}, false)
			if err != nil {
				rows.Close()
				cancel()
				return Cursor{}, err
			}
			frames = append(frames, f)
		}
		rows.Close()
		cancel()
		if err := rows.Err(); err != nil {
			return Cursor{}, err
		}
		for _, f := range frames {
			if !s.resumed(f) {
				return Cursor{}, errSocketClosed
			}
			pos, at = f.pos, f.createdAt
		}
		switch {
		case n == 0:
			// Nothing after pos: the stream stands there. (A horizon read by
			// another statement could pass a row committed since, which the
			// socket would then drop.)
			return Cursor{Position: pos, At: at}, nil
		case held || n < resumePage:
			return cursorAt(pos, hz, now), nil
		}
	}
}

// now is where a stream without a cursor starts: at the horizon, read after
// the socket was registered. What committed below it is in the feed the app
// loads after ready; every row above it reaches the socket as a live frame.
func (h *Hub) now(ctx context.Context) (Cursor, error) {
	var hz uint64
	var now time.Time
	if err := h.cfg.DB.QueryRow(ctx, `SELECT `+horizon+`, now()`, pgx.QueryExecModeCacheDescribe).Scan(&hz, &now); err != nil {
		return Cursor{}, err
	}
	return cursorAt(Position{}, hz, now), nil
}

// cursorAt is the later of pos and the horizon hz.
func cursorAt(pos Position, hz uint64, now time.Time) Cursor {
	c := Cursor{Position: pos, At: now}
	if h := (Position{Tx: hz}); pos.Less(h) {
		c.Position = h
	}
	return c
}
