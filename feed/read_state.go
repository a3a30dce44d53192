package feed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MarkRead marks one of the user's notifications read. Marking it again, or
// one already under the read-all watermark, is not an error and changes
// nothing; another user's notification is ErrNotFound. The id names the
// row's partition, so only that partition is read.
func (s *Store) MarkRead(ctx context.Context, userID string, id ID) error {
	var found bool
	err := s.db.QueryRow(ctx, `WITH target AS (
			SELECT n.id, n.created_at FROM notifications n
			WHERE n.user_id = $1 AND n.created_at = $2 AND n.id = $3
		), marked AS (
			UPDATE notifications n SET read_at = now()
			FROM target t, `+ReadMark+` w
			WHERE n.created_at = t.created_at AND n.id = t.id AND n.read_at IS NULL
			  AND NOT `+ReadAllCovers+`
			RETURNING n.id
		), told AS (
			-- The user's other devices hear of it on the live stream.
			INSERT INTO read_events (user_id, read_id) SELECT $1, $4 FROM marked
		)
		SELECT EXISTS (SELECT 1 FROM target)`, userID, id.CreatedAt, id.Seq, id.String()).Scan(&found)
	if err != nil {
		return fmt.Errorf("mark read: %w", err)
	}
	if !found {
		return ErrNotFound
	}
	return nil
}

// MarkAllRead marks read every notification of the user that has committed
// when it is asked, and returns the newest of them in feed order; ok is false
// when they have none. One statement reads the newest row and records it with
// the statement's snapshot, so what it covers is exactly what a feed read at
// that moment showed; a notification whose transaction commits later stays
// unread. It costs the same for 10 and 10 M unread rows: one row of
// read_marks.
func (s *Store) MarkAllRead(ctx context.Context, userID string) (through ID, ok bool, err error) {
	var at time.Time
	var seq int64
	err = s.db.QueryRow(ctx, `WITH newest AS (
			SELECT n.created_at, n.id FROM notifications n
			WHERE n.user_id = $1 AND n.created_at < now() + $2::interval
			ORDER BY n.created_at DESC, n.id DESC LIMIT 1
		), marked AS (
			INSERT INTO read_marks (user_id, through_at, through_id, marked_at, snapshot)
			SELECT $1, created_at, id, now(), pg_current_snapshot() FROM newest
			ON CONFLICT (user_id) DO UPDATE SET through_at = EXCLUDED.through_at, through_id = EXCLUDED.through_id,
				marked_at = EXCLUDED.marked_at, snapshot = EXCLUDED.snapshot
			-- Never backwards: a read-all that covers less than the one
			-- recorded (it raced a newer one) changes nothing.
			WHERE (read_marks.through_at, read_marks.through_id) < (EXCLUDED.through_at, EXCLUDED.through_id)
			   OR (read_marks.through_at, read_marks.through_id) = (EXCLUDED.through_at, EXCLUDED.through_id)
			      AND (read_marks.snapshot IS NULL OR pg_snapshot_xmax(read_marks.snapshot) < pg_snapshot_xmax(EXCLUDED.snapshot))
			RETURNING through_at, through_id, snapshot
		), told AS (
			-- The user's other devices hear of it on the live stream, with
			-- what it left unread.
			INSERT INTO read_events (user_id, through_at, through_seq, snapshot)
			SELECT $1, through_at, through_id, snapshot FROM marked
		)
		SELECT created_at, id FROM newest`, userID, FutureSlack).Scan(&at, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return ID{}, false, nil
	}
	if err != nil {
		return ID{}, false, fmt.Errorf("mark all read: %w", err)
	}
	return ID{CreatedAt: at, Seq: seq}, true, nil
}
