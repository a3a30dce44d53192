package live

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/gobwas/ws"
	"github.com/jackc/pgx/v5"

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
// notification when none is new. Its ranges on tx are two-sided for the
// same reason as the reader's (readNotifications): a generic plan reads the
// user's rows in (tx, id) order, not all of them since the cursor's time.
const readSince = `WITH s AS MATERIALIZED (
		SELECT s.*, EXISTS (SELECT 1 FROM notifications h WHERE h.user_id = $1 AND h.tx >= s.hz AND h.tx < s.xmax AND (h.tx, h.id) > ($3::xid8, $4::bigint)
			AND h.created_at >= $2 AND h.created_at < s.at + $6::interval) AS held
		FROM (` + readState + `) s(hz, xmax, at, sys, tl, wal, sync))
	SELECT s.hz, s.xmax, s.at, s.sys, s.tl, s.wal, s.sync, s.held, n.*
	FROM s LEFT JOIN LATERAL (
		SELECT n.tx, ` + feed.NotificationFields + `, ` + feed.StateColumns + `
		FROM notifications n, ` + feed.Marks + ` m
		WHERE n.user_id = $1 AND (n.tx, n.id) > ($3::xid8, $4::bigint) AND n.tx >= $3::xid8 AND n.tx < s.hz
		  AND n.created_at >= $2 AND n.created_at < s.at + $6::interval
		ORDER BY n.tx, n.id
		LIMIT $5) n ON true
	ORDER BY n.tx, n.id`

// readResume is a user's stream after a position ($3, $4), as readSince
// reads their notifications, merged with the changes of their states in
// one commit-safe order (feed.States): at most $5 rows, with each
// notification's states as they are now.
var readResume = `WITH m AS MATERIALIZED ` + feed.Marks + `, s AS MATERIALIZED (
		SELECT s.*, EXISTS (SELECT 1 FROM notifications h WHERE h.user_id = $1 AND h.tx >= s.hz AND h.tx < s.xmax AND (h.tx, h.id) > ($3::xid8, $4::bigint)
				AND h.created_at >= $2 AND h.created_at < s.at + $6::interval)
			OR EXISTS (SELECT 1 FROM state_events h WHERE h.user_id = $1 AND h.tx >= s.hz AND h.tx < s.xmax AND (h.tx, h.id) > ($3::xid8, $4::bigint)) AS held
		FROM (` + readState + `) s(hz, xmax, at, sys, tl, wal, sync))
	SELECT s.hz, s.xmax, s.at, s.sys, s.tl, s.wal, s.sync, s.held, r.*
	FROM s CROSS JOIN m LEFT JOIN LATERAL (
		SELECT * FROM ((
			SELECT ` + streamNotificationColumns(feed.StateColumns) + ` FROM notifications n
			WHERE n.user_id = $1 AND (n.tx, n.id) > ($3::xid8, $4::bigint) AND n.tx >= $3::xid8 AND n.tx < s.hz
			  AND n.created_at >= $2 AND n.created_at < s.at + $6::interval
			ORDER BY n.tx, n.id
			LIMIT $5
		) UNION ALL (
			SELECT ` + streamStateColumns + ` FROM state_events e
			WHERE e.user_id = $1 AND (e.tx, e.id) > ($3::xid8, $4::bigint) AND e.tx >= $3::xid8 AND e.tx < s.hz
			ORDER BY e.tx, e.id
			LIMIT $5
		)) r
		ORDER BY r.tx, r.id
		LIMIT $5) r ON true
	ORDER BY r.tx, r.id`

// ResumeStatements are the statements every resume runs on DB (as do Since
// and Now), for its connections to prepare (pgpool.Config.Prepare): a wave of
// resumes (a replica's sockets moving at once) costs Postgres mostly their
// planning, 1.0 ms of CPU a resume unnamed against 0.12 ms prepared in the
// live benchmark's wave, where Postgres settles on a generic plan by itself
// after five runs on each connection.
func ResumeStatements() []string {
	return []string{readResume, readNow, readSince, readLeft}
}

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
		out.Cursors[i] = st.cursor(out.Cursors[i].Position, out.Cursors[i].At)
	}
	if len(out.Cursors) > 0 {
		out.End = out.Cursors[len(out.Cursors)-1]
	}
	out.End = st.cursor(out.End.Position, out.End.At)
	// When every row after the cursor and below this read's horizon was
	// read, the end stays at the last of them (no row of the user lies
	// between it and the horizon, nor can one commit there): a committed
	// row, which a failover that kept it keeps below every new transaction
	// (see follows). Its time moves to now only when no row of the user
	// waits above the horizon; otherwise it keeps the time that bounds them.
	if !out.More && !held && out.End.At.Before(st.at) {
		out.End.At = st.at
	}
	return out, nil
}

// readNow is where a user's stream stands now: the statement's state, and
// the position of the user's last row (a notification or a change of
// state) below its horizon among those a read from a cursor at now would
// consider (created within the slack $2 before now), or none.
var readNow = `WITH s AS MATERIALIZED (` + readState + `)
	SELECT s.*, coalesce(n.tx, '0'::xid8), coalesce(n.id, 0)
	FROM s LEFT JOIN LATERAL (
		SELECT * FROM ((
			SELECT n.tx, n.id FROM notifications n
			WHERE n.user_id = $1 AND n.tx < s.hz AND n.created_at >= s.at - $2::interval AND n.created_at < s.at + $3::interval
			ORDER BY n.tx DESC, n.id DESC
			LIMIT 1
		) UNION ALL (` + strings.ReplaceAll(feed.LastStateEvent, "SLACK", "$2") + `)) n
		ORDER BY n.tx DESC, n.id DESC
		LIMIT 1) n ON true`

// Now is where a reader of user's notifications without a cursor starts:
// what committed before this statement is visible to any read that starts
// after it, and every row after it is returned by Since from this cursor.
// Its position is the user's last row below the horizon, or zero when none
// is recent: one that a failover that kept it keeps below every new
// transaction, where the horizon itself could be passed by reused ids
// (see follows).
func Now(ctx context.Context, db DB, user string) (Cursor, error) {
	return now(ctx, db, user, txSlack)
}

func now(ctx context.Context, db DB, user string, slack time.Duration) (Cursor, error) {
	var st dbState
	var pos Position
	dest, scanned := st.scanTargets()
	err := db.QueryRow(ctx, readNow, pgx.QueryExecModeCacheDescribe, user, slack, feed.FutureSlack).Scan(append(dest, &pos.Tx, &pos.ID)...)
	if err != nil {
		return Cursor{}, err
	}
	scanned()
	return st.cursor(pos, st.at), nil
}

// follows tells whether a cursor can be followed in the history a statement
// saw (st): its own, or an earlier timeline that the new one continues (see
// continues); and it must be at or below the next transaction id.
// Otherwise it is ErrOtherHistory.
func follows(ctx context.Context, db DB, c Cursor, st dbState) error {
	if c.History != (History{}) && c.History != st.history {
		ok, err := continues(ctx, db, c, st.history)
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

// continues tells whether a cursor of an earlier timeline resumes in history
// to with nothing skipped and nothing repeated: to must hold every commit
// the cursor's read saw, and give every transaction it began a larger id
// than the cursor's position. Both hold when the new timeline left the old
// one at or past the cursor's WAL position (pghistory.Descends): every
// commit and every end of a transaction below the read's horizon is below
// it. A read on a primary that replicated synchronously saw only commits the
// standby had too, though the WAL position may lie past where it stopped (a
// wake-up's commit, which does not wait; another application's): then the
// cursor's own row, kept on the new timeline, is below every transaction it
// began; a cursor at no row has nothing to skip.
func continues(ctx context.Context, db DB, c Cursor, to History) (bool, error) {
	if c.WAL == 0 {
		return false, nil
	}
	left, ok, err := pghistory.Descends(ctx, db, c.History, to)
	switch {
	case err != nil || !ok:
		return false, err
	case c.WAL <= left:
		return true, nil
	case !c.Synchronous:
		return false, nil
	case c.Position == Position{}:
		return true, nil
	}
	var kept bool
	err = db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM notifications WHERE id = $1 AND tx = $2::xid8)
		OR EXISTS (SELECT 1 FROM state_events WHERE id = $1 AND tx = $2::xid8)`, c.ID, c.Tx).Scan(&kept)
	return kept, err
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

// resumeRows sends the rows after the cursor (notifications and changes
// of state, in their one order) and returns where the socket's stream
// stands. A fresh socket starts at the horizon, read after the socket was
// registered: what committed below it is in the feed the app loads after
// ready.
func (h *Hub) resumeRows(ctx context.Context, s *socket, after *Cursor) (Cursor, error) {
	if after == nil {
		done, err := h.resumeTurn(ctx, s)
		if err != nil {
			return Cursor{}, err
		}
		defer done()
		return now(ctx, h.cfg.DB, s.user, h.cfg.txSlack)
	}
	end := *after
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		page, err := h.resumePage(rctx, s, end, resumePage)
		cancel()
		if err != nil {
			return Cursor{}, err
		}
		for _, f := range page.frames {
			if !s.resumed(ctx, f) {
				if ctx.Err() != nil {
					return Cursor{}, ctx.Err() // the hub is shutting down
				}
				return Cursor{}, errSocketClosed
			}
		}
		end = page.end
		if !page.more {
			return end, nil
		}
	}
}

// resumed is one page of a resume: its frames, where it ends (as Since's
// End), and whether a full page came back.
type resumed struct {
	frames []frame
	end    Cursor
	more   bool
}

// resumePage reads up to limit rows of user's stream after the cursor,
// merged in commit order, below the read's horizon, and builds their
// frames (a watermark's reads what it left out).
func (h *Hub) resumePage(ctx context.Context, s *socket, after Cursor, limit int) (resumed, error) {
	done, err := h.resumeTurn(ctx, s)
	if err != nil {
		return resumed{}, err
	}
	defer done()
	user := s.user
	db := h.cfg.DB
	rows, err := db.Query(ctx, readResume, user, after.At.Add(-h.cfg.txSlack), after.Tx, after.ID, limit+1, feed.FutureSlack)
	if err != nil {
		return resumed{}, err
	}
	defer rows.Close()
	out := resumed{end: after}
	var st dbState
	var held bool
	var read []streamRow
	for rows.Next() {
		dest, scanned := st.scanTargets()
		row, ok, err := scanStreamRow(rows, append(dest, &held))
		if err != nil {
			return resumed{}, err
		}
		scanned()
		if !ok {
			break
		}
		if len(read) == limit {
			out.more = true
			break
		}
		read = append(read, row)
	}
	if err := rows.Err(); err != nil {
		return resumed{}, err
	}
	rows.Close()
	if err := follows(ctx, db, after, st); err != nil {
		return resumed{}, err
	}
	for _, row := range read {
		c := st.cursor(row.pos, row.note.CreatedAt)
		var f frame
		ok := true
		if row.state == nil {
			f, err = notificationFrame(row.note, c, false)
		} else {
			f, ok, err = stateFrameOf(ctx, db, *row.state, c, h.cfg.txSlack)
		}
		if err != nil {
			return resumed{}, err
		}
		if ok {
			out.frames = append(out.frames, f)
		}
		out.end = c
	}
	out.end = st.cursor(out.end.Position, out.end.At)
	// As in since: at the horizon's time once every row below it was read
	// and none of the user's waits above it.
	if !out.more && !held && out.end.At.Before(st.at) {
		out.end.At = st.at
	}
	return out, nil
}

// resumeTurn waits for one of the connections the handshakes and resumes
// may hold (Config.ResumeConns) and returns its release. For a socket (s
// not nil) that closed meanwhile, an app that gave up and reconnected, it
// takes none: errSocketClosed.
func (h *Hub) resumeTurn(ctx context.Context, s *socket) (release func(), err error) {
	if h.resumeTurns != nil {
		select {
		case h.resumeTurns <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	release = func() {
		if h.resumeTurns != nil {
			<-h.resumeTurns
		}
	}
	if s != nil && s.isClosing() {
		release()
		return nil, errSocketClosed
	}
	return release, nil
}
