package live

import (
	"context"
	"errors"
	"time"

	"github.com/gobwas/ws"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pghistory"
)

// errSocketClosed ends a resume whose socket closed.
var errSocketClosed = errors.New("socket closed")

// resumePage is the most rows one resume read takes.
const resumePage = 500

// readSince is a user's feed read in commit-safe order after a position
// ($3, $4), at most $5 rows below the statement's horizon, with the
// statement's state (readState) and whether rows of the user wait above the
// horizon (held). It always answers one row at least: the state, with no
// notification when none is new.
const readSince = `WITH s AS MATERIALIZED (
		SELECT s.*, EXISTS (SELECT 1 FROM notifications h WHERE h.user_id = $1 AND h.tx >= s.hz AND (h.tx, h.id) > ($3::xid8, $4::bigint)
			AND h.created_at >= $2 AND h.created_at < s.at + $6::interval) AS held
		FROM (` + readState + `) s(hz, xmax, at, sys, tl, wal))
	SELECT s.hz, s.xmax, s.at, s.sys, s.tl, s.wal, s.held, n.*
	FROM s LEFT JOIN LATERAL (
		SELECT n.tx, ` + feed.NotificationFields + `, ` + feed.ReadState + ` AS read_state
		FROM notifications n, ` + feed.ReadMark + ` w
		WHERE n.user_id = $1 AND (n.tx, n.id) > ($3::xid8, $4::bigint) AND n.tx < s.hz
		  AND n.created_at >= $2 AND n.created_at < s.at + $6::interval
		ORDER BY n.tx, n.id
		LIMIT $5) n ON true
	ORDER BY n.tx, n.id`

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
// still running, comes in a later read, never skipped. A cursor from another
// history of the database, or beyond what it has seen, is ErrOtherHistory.
func Since(ctx context.Context, db DB, user string, after Cursor, limit int) (Changes, error) {
	return since(ctx, db, user, after, limit, txSlack)
}

// since is Since looking slack before the cursor's time.
func since(ctx context.Context, db DB, user string, after Cursor, limit int, slack time.Duration) (Changes, error) {
	rows, err := db.Query(ctx, readSince, user, after.At.Add(-slack), after.Tx, after.ID, limit+1, feed.FutureSlack)
	if err != nil {
		return Changes{}, err
	}
	defer rows.Close()
	out := Changes{End: after}
	var st dbState
	var held bool
	for rows.Next() {
		var tx *uint64
		var note feed.Notification
		var fields orNull
		dest, scanned := st.scanTargets()
		dest = append(dest, &held, &tx)
		if err := rows.Scan(append(dest, fields.wrap(note.ScanTargets())...)...); err != nil {
			return Changes{}, err
		}
		scanned()
		if tx == nil {
			break
		}
		if len(out.Items) == limit {
			out.More = true
			break
		}
		fields.fill()
		out.Items = append(out.Items, note)
		out.Cursors = append(out.Cursors, Cursor{Position: Position{Tx: *tx, ID: note.ID}, At: note.CreatedAt})
	}
	if err := rows.Err(); err != nil {
		return Changes{}, err
	}
	if err := follows(ctx, db, after, st); err != nil {
		return Changes{}, err
	}
	for i := range out.Cursors {
		out.Cursors[i].History, out.Cursors[i].WAL = st.history, st.wal
	}
	if len(out.Cursors) > 0 {
		out.End = out.Cursors[len(out.Cursors)-1]
	}
	out.End.History, out.End.WAL = st.history, st.wal
	if !out.More {
		// Every row after the cursor and below this read's horizon was read
		// (the horizon is this statement's): the reader may stand at the
		// horizon. Its time moves to now only when no row of the user waits
		// above it; otherwise it keeps the time that bounds those rows.
		if h := (Position{Tx: st.horizon}); out.End.Position.Less(h) {
			out.End.Position = h
		}
		if !held && out.End.At.Before(st.at) {
			out.End.At = st.at
		}
	}
	return out, nil
}

// Now is where a reader without a cursor starts: at the horizon. What
// committed below it is visible to any read that starts after this one;
// every row above it is returned by Since from this cursor.
func Now(ctx context.Context, db DB) (Cursor, error) {
	st, err := readStateOf(ctx, db)
	if err != nil {
		return Cursor{}, err
	}
	return Cursor{Position: Position{Tx: st.horizon}, At: st.at, History: st.history, WAL: st.wal}, nil
}

// follows tells whether a cursor can be followed in the history a statement
// saw (st): its own, or an earlier timeline that the new one continues
// through everything the cursor's read saw (pghistory.Continues), and at or
// below the next transaction id. Otherwise it is ErrOtherHistory.
func follows(ctx context.Context, db DB, c Cursor, st dbState) error {
	if c.History != (History{}) && c.History != st.history {
		ok, err := pghistory.Continues(ctx, db, c.History, c.WAL, st.history)
		if err != nil {
			return err
		}
		if !ok {
			return ErrOtherHistory
		}
	}
	if c.Tx > st.xmax {
		return ErrOtherHistory
	}
	return nil
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
	if errors.Is(err, ErrOtherHistory) {
		// Checked before the upgrade too; here when the history changed
		// since. The app's next handshake is refused with invalid-cursor.
		s.close(ws.StatusPolicyViolation, "the cursor is from another history of the database; reconnect without it")
		return
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

// catchUp sends s, from Postgres, the notifications after from that a burst
// made it drop, at the pace it reads, then the live frames held meanwhile:
// a resume without a ready frame. It runs under the hub's loops.
func (h *Hub) catchUp(s *socket, from Cursor) {
	if st := h.state.Load(); st != nil {
		from.History = st.history
	}
	if !h.svc.Go(h.serving, func(ctx context.Context) { h.resume(ctx, s, &from) }) {
		s.close(ws.StatusGoingAway, "server shutting down; reconnect")
	}
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
		page, err := since(rctx, h.cfg.DB, s.user, end, resumePage, h.cfg.txSlack)
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
