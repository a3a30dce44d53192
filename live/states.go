package live

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
)

// Changes of state (read, unread, archived, unarchived, read-all,
// archive-all, seen; feed.States) are rows of state_events, whose ids come
// from the notifications' sequence: each has a position (tx, id) in the
// same commit-safe order as the notifications', never equal to one of
// theirs. The reader and the resume read both tables in one ordered merge,
// so every frame, a notification's or a change's, comes once, in that
// order, and its cursor resumes after it.

// stateRow is a change of state as the stream's reads return it.
type stateRow struct {
	kind string
	user string
	// note is the notification it names: the one changed, or the newest a
	// watermark covers; nil for a seen move recorded without one.
	note     *feed.ID
	snapshot *string // read-all, archive-all: the snapshot it was asked in
	at       time.Time
}

// stateKinds maps state_events' kinds to their frames' kinds.
var stateKinds = map[string]frameKind{
	"read": kindRead, "read_all": kindRead, "unread": kindUnread, "archived": kindArchived,
	"archive_all": kindArchived, "unarchived": kindUnarchived, "seen": kindSeen,
}

// readLeft lists what a watermark (read-all, archive-all: snapshot $2,
// covering through ($3, $4) in feed order, asked at $5) left out: the
// user's notifications that committed after it was asked though older in
// feed order. Their transactions were running then or took their ids
// later: at or above the snapshot's xmin (not below its xmax, which is one
// past the newest transaction completed), started at most the slack ($6)
// before.
const readLeft = `SELECT n.created_at, n.id FROM notifications n
	WHERE n.user_id = $1 AND n.tx >= pg_snapshot_xmin($2::pg_snapshot)
	  AND (n.created_at, n.id) <= ($3, $4) AND NOT pg_visible_in_snapshot(n.tx, $2::pg_snapshot)
	  AND n.created_at >= $5::timestamptz - $6::interval
	ORDER BY n.tx, n.id LIMIT 100`

// stateFrameOf builds the frame of a change at c, reading with db what a
// watermark left out once every transaction it could not see has ended
// (the change is below the horizon, and its transaction took its id after
// its snapshot). ok is false for a change without a frame: a seen move
// recorded before migration 19, which names no notification.
func stateFrameOf(ctx context.Context, db DB, r stateRow, c Cursor, slack time.Duration) (f frame, ok bool, err error) {
	kind := stateKinds[r.kind]
	if kind == 0 || r.note == nil {
		return frame{}, false, nil
	}
	var m stateMessage
	switch r.kind {
	case "read_all", "archive_all", "seen":
		m.Through = r.note.String()
	default:
		m.ID = r.note.String()
	}
	if r.snapshot != nil {
		rows, err := db.Query(ctx, readLeft, r.user, *r.snapshot, r.note.CreatedAt, r.note.Seq, r.at, slack)
		if err != nil {
			return frame{}, false, err
		}
		left, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
			var id feed.ID
			err := row.Scan(&id.CreatedAt, &id.Seq)
			return id.String(), err
		})
		if err != nil {
			return frame{}, false, err
		}
		if r.kind == "read_all" {
			m.Unread = left
		} else {
			m.Unarchived = left
		}
	}
	f, err = stateFrame(kind, m, c)
	return f, err == nil, err
}

// streamRow is one row of a merged read: a notification, or a change of
// state (state.kind set), at its position.
type streamRow struct {
	pos   Position
	user  string
	note  feed.Notification
	state *stateRow
}

// The columns of a merged read's rows, after the statement's state: the
// position, the user, the change's kind (NULL for a notification), the
// notification's fields and states (a change's id and created_at in its
// id and created_at, the rest NULL), and a change's notification and
// snapshot.
const streamStateColumns = `e.tx, e.user_id, e.kind, e.id, NULL, NULL, NULL, NULL, NULL::jsonb, NULL, e.created_at, NULL, NULL, NULL, NULL,
	e.note_at, e.note_seq, e.snapshot::text`

// streamNotificationColumns are a notification's columns in a merged read,
// its states read by states (three columns).
func streamNotificationColumns(states string) string {
	return `n.tx, n.user_id, NULL::text AS kind, ` + feed.NotificationFields + `, ` + states + `,
		NULL::timestamptz AS note_at, NULL::bigint AS note_seq, NULL::text AS snapshot`
}

// scanStreamRow scans a merged read's row after dest (the statement's own
// columns); ok is false for the statement's state alone (no row).
func scanStreamRow(rows pgx.Rows, dest []any) (r streamRow, ok bool, err error) {
	var tx *uint64
	var user, kind, snapshot *string
	var noteAt *time.Time
	var noteSeq *int64
	var fields orNull
	dest = append(dest, &tx, &user, &kind)
	dest = append(dest, fields.wrap(r.note.ScanTargets())...)
	if err := rows.Scan(append(dest, &noteAt, &noteSeq, &snapshot)...); err != nil {
		return streamRow{}, false, err
	}
	if tx == nil {
		return streamRow{}, false, nil
	}
	fields.fill()
	r.pos, r.user = Position{Tx: *tx, ID: r.note.ID}, *user
	if kind != nil {
		r.state = &stateRow{kind: *kind, user: *user, snapshot: snapshot, at: r.note.CreatedAt}
		if noteAt != nil && noteSeq != nil {
			r.state.note = &feed.ID{CreatedAt: *noteAt, Seq: *noteSeq}
		}
	}
	return r, true, nil
}
