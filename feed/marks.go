package feed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// itemChange is a change of one notification's state (see States): what it
// records, what it sets on the row, and when the row has the state already.
type itemChange struct {
	kind string // the state event's kind
	// done holds for a row n (under the watermarks m) already in the state
	// the change makes: then it changes and records nothing.
	done string
	// set is the row's state column (read_at, archived_at) and the
	// position columns of its last change by item.
	column, tx, seq string
	// value is what set writes into column: now() or NULL.
	value string
	// marks is the watermark table a change back against it is hinted on
	// (overrides_from): read_marks for unread, archive_marks for unarchive.
	marks string
	// items hints, in archive_marks, how far back the notifications
	// archived one by one lie (archived_from): the archived tab and count
	// read no older week than that.
	items bool
}

var (
	markRead   = itemChange{kind: "read", done: isRead, column: "read_at", tx: "read_tx", seq: "read_seq", value: "now()"}
	markUnread = itemChange{kind: "unread", done: "NOT " + isRead, column: "read_at", tx: "read_tx", seq: "read_seq", value: "NULL", marks: "read_marks"}
	archive    = itemChange{kind: "archived", done: isArchived, column: "archived_at", tx: "archive_tx", seq: "archive_seq", value: "now()", items: true}
	unarchive  = itemChange{kind: "unarchived", done: "NOT " + isArchived, column: "archived_at", tx: "archive_tx", seq: "archive_seq", value: "NULL", marks: "archive_marks"}
)

// MarkRead marks one of the user's notifications read. Marking it again, or
// one read already (by read-all), is not an error and changes nothing;
// another user's notification is ErrNotFound. The id names the row's
// partition, so only that partition is read.
func (s *Store) MarkRead(ctx context.Context, userID string, id ID) error {
	return s.change(ctx, userID, id, markRead)
}

// MarkUnread marks one of the user's notifications unread, read-all's
// included: it stays unread until it is marked read or a later read-all
// covers it. One unread already changes nothing.
func (s *Store) MarkUnread(ctx context.Context, userID string, id ID) error {
	return s.change(ctx, userID, id, markUnread)
}

// Archive archives one of the user's notifications: it leaves the "all"
// and "unread" tabs for "archived". One archived already changes nothing.
func (s *Store) Archive(ctx context.Context, userID string, id ID) error {
	return s.change(ctx, userID, id, archive)
}

// Unarchive brings one of the user's archived notifications back, archive-
// all's included. One not archived changes nothing.
func (s *Store) Unarchive(ctx context.Context, userID string, id ID) error {
	return s.change(ctx, userID, id, unarchive)
}

// change makes c on one notification in one statement: its state now (under
// the user's watermarks), and, unless it has the state already, the row's
// new state with the change's position, the state event the stream and the
// webhooks read, and, for a change back against a watermark that covers
// the row, the watermark's hint of how far back such rows lie.
//
// The row is written only when the change's position is after the one it
// holds: two changes of one row racing are applied in the order the stream
// sends them, whichever took the row's lock first.
func (s *Store) change(ctx context.Context, userID string, id ID, c itemChange) error {
	hint := ``
	if c.marks != "" {
		// Hinted whether or not a watermark covers the row: a watermark
		// asked before this change in the stream may record itself after
		// this statement (it took its position, then waited for the
		// watermark's row), and the tabs find a row changed back against
		// it in an older week only by the hint. A hint that covers
		// nothing costs a read of the weeks from it, and none when it is
		// newer than the watermark. The upsert waits for such a watermark
		// and applies after it; the latest hinted change's position is
		// kept, so that a watermark that comes before it in the stream
		// keeps the hint (MarkAllRead). Without a watermark yet, the row
		// holds the hint alone: it covers nothing (-infinity).
		hint = `, hinted AS (
			INSERT INTO ` + c.marks + ` AS w (user_id, through_at, through_id, overrides_from, overrides_tx, overrides_seq)
			SELECT $1, '-infinity', 0, x.created_at, op.tx, op.seq FROM changed x, op
			ON CONFLICT (user_id) DO UPDATE SET overrides_from = least(w.overrides_from, EXCLUDED.overrides_from),
				overrides_tx = CASE WHEN (w.overrides_tx, w.overrides_seq) > (EXCLUDED.overrides_tx, EXCLUDED.overrides_seq) THEN w.overrides_tx ELSE EXCLUDED.overrides_tx END,
				overrides_seq = CASE WHEN (w.overrides_tx, w.overrides_seq) > (EXCLUDED.overrides_tx, EXCLUDED.overrides_seq) THEN w.overrides_seq ELSE EXCLUDED.overrides_seq END)`
	}
	if c.items {
		hint += `, hinted AS (
			INSERT INTO archive_marks AS w (user_id, archived_from) SELECT $1, x.created_at FROM changed x
			ON CONFLICT (user_id) DO UPDATE SET archived_from = least(w.archived_from, EXCLUDED.archived_from)
			WHERE w.archived_from IS NULL OR w.archived_from > EXCLUDED.archived_from)`
	}
	var found bool
	err := s.db.QueryRow(ctx, `WITH m AS MATERIALIZED `+Marks+`,
		target AS MATERIALIZED (
			SELECT n.created_at, n.id, `+c.done+` AS done FROM notifications n, m
			WHERE n.user_id = $1 AND n.created_at = $2 AND n.id = $3
		), op AS MATERIALIZED (
			-- The change's position in the stream, taken only when it changes something.
			SELECT pg_current_xact_id() AS tx, nextval('notification_ids') AS seq FROM target WHERE NOT done
		), changed AS (
			UPDATE notifications n SET `+c.column+` = `+c.value+`, `+c.tx+` = op.tx, `+c.seq+` = op.seq
			FROM target t, op
			WHERE n.created_at = t.created_at AND n.id = t.id
			  AND (n.`+c.tx+` IS NULL OR (n.`+c.tx+`, n.`+c.seq+`) < (op.tx, op.seq))
			RETURNING n.created_at, n.id
		), told AS (
			INSERT INTO state_events (id, tx, user_id, kind, note_at, note_seq)
			SELECT op.seq, op.tx, $1, '`+c.kind+`', x.created_at, x.id FROM changed x, op
		)`+hint+`
		SELECT EXISTS (SELECT 1 FROM target)`, userID, id.CreatedAt, id.Seq).Scan(&found)
	if err != nil {
		return fmt.Errorf("mark %s: %w", c.kind, err)
	}
	if !found {
		return ErrNotFound
	}
	return nil
}

// watermark is read-all or archive-all: its table and state event kind.
type watermark struct{ table, kind string }

var (
	readAll    = watermark{table: "read_marks", kind: "read_all"}
	archiveAll = watermark{table: "archive_marks", kind: "archive_all"}
)

// MarkAllRead marks read every notification of the user that has committed
// when it is asked, and returns the newest of them in feed order; ok is false
// when they have none. One statement reads the newest row and records it with
// the statement's snapshot, so what it covers is exactly what a feed read at
// that moment showed; a notification whose transaction commits later stays
// unread. It costs the same for 10 and 10 M unread rows: one row of
// read_marks. It comes after every change by item before it in the stream,
// so the notifications marked unread that it covers are read again.
func (s *Store) MarkAllRead(ctx context.Context, userID string) (through ID, ok bool, err error) {
	return s.markAll(ctx, userID, readAll)
}

// MarkAllArchived archives every notification of the user that has
// committed when it is asked, as MarkAllRead reads them: one row of
// archive_marks. Notifications unarchived before it are archived again; one
// that commits later is not archived.
func (s *Store) MarkAllArchived(ctx context.Context, userID string) (through ID, ok bool, err error) {
	return s.markAll(ctx, userID, archiveAll)
}

func (s *Store) markAll(ctx context.Context, userID string, w watermark) (through ID, ok bool, err error) {
	var at time.Time
	var seq int64
	err = s.db.QueryRow(ctx, `WITH newest AS (
			SELECT n.created_at, n.id FROM notifications n
			WHERE n.user_id = $1 AND n.created_at < now() + $2::interval
			ORDER BY n.created_at DESC, n.id DESC LIMIT 1
		), op AS MATERIALIZED (
			-- Its position in the stream: after every notification it
			-- covers (each visible in its snapshot, so below the
			-- snapshot's xmax, which this transaction's id is not).
			SELECT pg_current_xact_id() AS tx, nextval('notification_ids') AS seq FROM newest
		), marked AS (
			INSERT INTO `+w.table+` AS w (user_id, through_at, through_id, marked_at, snapshot, tx, seq)
			SELECT $1, newest.created_at, newest.id, now(), pg_current_snapshot(), op.tx, op.seq FROM newest, op
			ON CONFLICT (user_id) DO UPDATE SET through_at = EXCLUDED.through_at, through_id = EXCLUDED.through_id,
				marked_at = EXCLUDED.marked_at, snapshot = EXCLUDED.snapshot, tx = EXCLUDED.tx, seq = EXCLUDED.seq,
				-- The changes back by item before it are superseded: the
				-- hint goes, unless the latest of them comes after it in
				-- the stream (its transaction took its id first).
				overrides_from = CASE WHEN (w.overrides_tx, w.overrides_seq) > (EXCLUDED.tx, EXCLUDED.seq) THEN w.overrides_from END
			-- Never backwards: one that covers less than the one recorded
			-- (it raced a newer one) changes nothing.
			WHERE w.through_at IS NULL
			   OR (w.through_at, w.through_id) < (EXCLUDED.through_at, EXCLUDED.through_id)
			   OR (w.through_at, w.through_id) = (EXCLUDED.through_at, EXCLUDED.through_id)
			      AND (w.snapshot IS NULL OR pg_snapshot_xmax(w.snapshot) < pg_snapshot_xmax(EXCLUDED.snapshot))
			RETURNING through_at, through_id, snapshot, tx, seq
		), told AS (
			-- The user's other devices hear of it on the live stream, with
			-- what it left out.
			INSERT INTO state_events (id, tx, user_id, kind, note_at, note_seq, snapshot)
			SELECT seq, tx, $1, '`+w.kind+`', through_at, through_id, snapshot FROM marked
		)
		SELECT created_at, id FROM newest`, userID, FutureSlack).Scan(&at, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return ID{}, false, nil
	}
	if err != nil {
		return ID{}, false, fmt.Errorf("mark all %s: %w", w.kind, err)
	}
	return ID{CreatedAt: at, Seq: seq}, true, nil
}
