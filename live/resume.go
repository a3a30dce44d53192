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

// readSince is a user's feed read in commit-safe order from a position,
// with the horizon and Postgres's time of the read.
const readSince = `SELECT n.tx, ` + feed.NotificationColumns + `, ` + horizon + `, now()
	FROM notifications n, ` + feed.ReadMark + ` w
	WHERE n.user_id = $1 AND n.created_at >= $2 AND n.created_at < $6 AND (n.tx, n.id) > ($3::xid8, $4::bigint)
	ORDER BY n.tx, n.id
	LIMIT $5`

// Changes is a user's notifications committed after a cursor, in commit
// order: a resume page, or a pull-to-refresh answer.
type Changes struct {
	Items []feed.Notification
	// Cursors are the items' stream cursors.
	Cursors []Cursor
	// End is where the reader stands after these items: pass it back to
	// read what commits next. It is past every item, and at the horizon of
	// the read when every row below it was read.
	End Cursor
	// More is true when a full page came back: read again at once.
	More bool
}

// Since reads up to limit notifications of user committed after the cursor,
// oldest first in commit order. Only rows below the read's horizon are
// returned: a row whose transaction was still running, or began before one
// still running, comes in a later read, never skipped. newest bounds the
// created_at of new rows (now, plus a margin for clock skew).
func Since(ctx context.Context, db DB, user string, after Cursor, limit int, newest time.Time) (Changes, error) {
	rows, err := db.Query(ctx, readSince, user, after.At.Add(-txSlack), after.Tx, after.ID, limit+1, newest)
	if err != nil {
		return Changes{}, err
	}
	defer rows.Close()
	out := Changes{End: after}
	var hz uint64
	var now time.Time
	n := 0
	for rows.Next() {
		n++
		var tx uint64
		var note feed.Notification
		dest := append([]any{&tx}, note.ScanTargets()...)
		if err := rows.Scan(append(dest, &hz, &now)...); err != nil {
			return Changes{}, err
		}
		p := Position{Tx: tx, ID: note.ID}
		if p.Tx >= hz {
			break // committed, but behind a transaction still running: a later read returns it
		}
		if len(out.Items) == limit {
			out.More = true
			break
		}
		out.Items = append(out.Items, note)
		out.Cursors = append(out.Cursors, Cursor{Position: p, At: note.CreatedAt})
		out.End = out.Cursors[len(out.Cursors)-1]
	}
	if err := rows.Err(); err != nil {
		return Changes{}, err
	}
	if n > 0 && !out.More {
		// Every row after the cursor and below this read's horizon was
		// read: the reader may stand at the horizon. (Not after an empty
		// read: a horizon read by another statement could pass a row that
		// committed since.)
		out.End = cursorAt(out.End.Position, hz, now)
		if out.End.At.Before(after.At) {
			out.End.At = after.At
		}
	}
	return out, nil
}

// Now is where a reader without a cursor starts: at the horizon. What
// committed below it is visible to any read that starts after this one;
// every row above it is returned by Since from this cursor.
func Now(ctx context.Context, db DB) (Cursor, error) {
	var hz uint64
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT `+horizon+`, now()`, pgx.QueryExecModeCacheDescribe).Scan(&hz, &now); err != nil {
		return Cursor{}, err
	}
	return cursorAt(Position{}, hz, now), nil
}

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
// stream stands. A fresh socket starts at the horizon, read after the socket
// was registered: what committed below it is in the feed the app loads after
// ready.
func (h *Hub) resumeRows(ctx context.Context, s *socket, after *Cursor) (Cursor, error) {
	if after == nil {
		return Now(ctx, h.cfg.DB)
	}
	end := *after
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		page, err := Since(rctx, h.cfg.DB, s.user, end, resumePage, h.reader.newest())
		cancel()
		if err != nil {
			return Cursor{}, err
		}
		for i, note := range page.Items {
			f, err := notificationFrame(note, page.Cursors[i], false)
			if err != nil {
				return Cursor{}, err
			}
			if !s.resumed(ctx, f) {
				if ctx.Err() != nil {
					return Cursor{}, ctx.Err() // the hub is shutting down
				}
				return Cursor{}, errSocketClosed
			}
		}
		end = page.End
		if !page.More {
			return end, nil
		}
	}
}

// cursorAt is the later of pos and the horizon hz, at time now.
func cursorAt(pos Position, hz uint64, now time.Time) Cursor {
	c := Cursor{Position: pos, At: now}
	if h := (Position{Tx: hz}); pos.Less(h) {
		c.Position = h
	}
	return c
}
