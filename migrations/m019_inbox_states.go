package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
)

// Migration 19 keeps a notification's inbox states (seen, read, archived) by
// the feed's rules: per notification, and as watermarks that cost one row
// whatever the feed holds (docs/design.md, "Inbox states"):
//
//   - notifications.archived_at, and the position in the stream (the
//     transaction and sequence of the state change) of each row's last
//     read/unread and archive/unarchive: a change by item and a watermark are
//     ordered by their positions, the order in which the stream sends them.
//   - archive_marks: archive-all, a watermark like read-all's read_marks,
//     which gain their own position and a hint of how far back the items
//     marked against them lie, so that counts and pages read no older
//     partition than they must.
//   - state_events: every change of state, in commit-safe order beside the
//     notifications (ids from notification_ids, so that positions never tie),
//     for the live stream and its resume, and for the webhooks
//     notification.read and notification.archived (a trigger in the
//     change's transaction). read_events is no longer written by this
//     version; it stays for the version before, during a rolling deploy.
//   - stream_seen: the seen watermark keeps its cursor's time (partition
//     bounds for the unseen count) and the newest notification it covers.
//   - partial indexes on notifications for the tabs: rows not archived by
//     item (the "all" tab), archived by item, unread and not archived (the
//     "unread" tab, in place of notifications_unread), and the few rows
//     marked unread or unarchived against a watermark. Each is built
//     partition by partition with CREATE INDEX CONCURRENTLY, as migration 7
//     builds its index, then attached to its parent's.
//
// Every lock waits at most lockTimeout; run again after a lock timeout, it
// picks up where it stopped.
var m019 = goose.NewGoMigration(19, &goose.GoFunc{RunDB: m019Up}, &goose.GoFunc{RunDB: m019Down})

// m019Indexes are the partial indexes of migration 19: name, and what
// follows "ON <table>" in each partition's definition.
var m019Indexes = []struct{ name, definition string }{
	{"notifications_inbox", `(user_id, created_at DESC, id DESC) WHERE archived_at IS NULL`},
	{"notifications_archived", `(user_id, created_at DESC, id DESC) WHERE archived_at IS NOT NULL`},
	{"notifications_inbox_unread", `(user_id, created_at DESC, id DESC) WHERE read_at IS NULL AND archived_at IS NULL`},
	{"notifications_marked_unread", `(user_id, created_at DESC, id DESC) WHERE read_at IS NULL AND read_tx IS NOT NULL`},
	{"notifications_unarchived", `(user_id, created_at DESC, id DESC) WHERE archived_at IS NULL AND archive_tx IS NOT NULL`},
}

// m019Unread is the index of unread rows that notifications_inbox_unread
// replaces.
const m019Unread = "notifications_unread"

func m019Up(ctx context.Context, db *sql.DB) error {
	if err := inLockedTx(ctx, db,
		// Nullable columns without a default: a change of the catalog alone.
		`ALTER TABLE notifications ADD COLUMN IF NOT EXISTS archived_at timestamptz,
			ADD COLUMN IF NOT EXISTS read_tx xid8, ADD COLUMN IF NOT EXISTS read_seq bigint,
			ADD COLUMN IF NOT EXISTS archive_tx xid8, ADD COLUMN IF NOT EXISTS archive_seq bigint`,
		`ALTER TABLE read_marks ADD COLUMN IF NOT EXISTS tx xid8, ADD COLUMN IF NOT EXISTS seq bigint,
			ADD COLUMN IF NOT EXISTS overrides_from timestamptz, ADD COLUMN IF NOT EXISTS overrides_tx xid8, ADD COLUMN IF NOT EXISTS overrides_seq bigint`,
		// Archive-all: the newest notification it covered in feed order, the
		// snapshot it was asked in and its position in the stream (NULL
		// until the user's first); how far back the items unarchived
		// against it since lie; and how far back the items archived one by
		// one lie.
		`CREATE TABLE IF NOT EXISTS archive_marks (
			user_id        text        PRIMARY KEY,
			through_at     timestamptz,
			through_id     bigint,
			marked_at      timestamptz,
			snapshot       pg_snapshot,
			tx             xid8,
			seq            bigint,
			overrides_from timestamptz,
			overrides_tx   xid8,
			overrides_seq  bigint,
			archived_from  timestamptz
		)`,
		`ALTER TABLE stream_seen ADD COLUMN IF NOT EXISTS through_at timestamptz,
			ADD COLUMN IF NOT EXISTS note_at timestamptz, ADD COLUMN IF NOT EXISTS note_seq bigint`,
		`CREATE TABLE IF NOT EXISTS state_events (
			id         bigint      PRIMARY KEY DEFAULT nextval('notification_ids'),
			tx         xid8        NOT NULL DEFAULT pg_current_xact_id(),
			user_id    text        NOT NULL,
			kind       text        NOT NULL CHECK (kind IN ('read', 'unread', 'archived', 'unarchived', 'read_all', 'archive_all', 'seen')),
			note_at    timestamptz,
			note_seq   bigint,
			snapshot   pg_snapshot,
			seen_tx    xid8,
			seen_id    bigint,
			created_at timestamptz NOT NULL DEFAULT now()
		)`,
		`CREATE INDEX IF NOT EXISTS state_events_commit_order ON state_events (tx, id)`,
		`CREATE INDEX IF NOT EXISTS state_events_user_commit_order ON state_events (user_id, tx, id)`,
		`CREATE INDEX IF NOT EXISTS state_events_seen ON state_events (user_id, seen_tx, seen_id) WHERE kind = 'seen'`,
		`CREATE INDEX IF NOT EXISTS state_events_created ON state_events (created_at)`,
		// The seen watermarks of before: one move each, at their last time.
		`INSERT INTO state_events (user_id, kind, seen_tx, seen_id, created_at)
			SELECT s.user_id, 'seen', s.through_tx, s.through_id, s.seen_at FROM stream_seen s
			WHERE NOT EXISTS (SELECT 1 FROM state_events e WHERE e.user_id = s.user_id AND e.kind = 'seen')`,
		m019WebhookFunction,
		`DROP TRIGGER IF EXISTS webhook_states ON state_events`,
		`CREATE TRIGGER webhook_states AFTER INSERT ON state_events
			REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION spoolcast_webhook_states()`,
	); err != nil {
		return err
	}
	for _, ix := range m019Indexes {
		if err := buildPartitionedIndex(ctx, db, "notifications", ix.name, ix.definition); err != nil {
			return err
		}
	}
	// What replaced it is whole: the old unread index goes. An index of a
	// partitioned table cannot be dropped concurrently; the drop is brief,
	// and waits at most lockTimeout.
	return inLockedTx(ctx, db, `DROP INDEX IF EXISTS `+m019Unread)
}

func m019Down(ctx context.Context, db *sql.DB) error {
	if err := buildPartitionedIndex(ctx, db, "notifications", m019Unread, `(user_id, created_at DESC, id DESC) WHERE read_at IS NULL`); err != nil {
		return err
	}
	statements := []string{}
	for _, ix := range m019Indexes {
		statements = append(statements, `DROP INDEX IF EXISTS `+ix.name)
	}
	statements = append(statements,
		`DROP TABLE IF EXISTS state_events`,
		`DROP FUNCTION IF EXISTS spoolcast_webhook_states()`,
		`ALTER TABLE stream_seen DROP COLUMN IF EXISTS through_at, DROP COLUMN IF EXISTS note_at, DROP COLUMN IF EXISTS note_seq`,
		`DROP TABLE IF EXISTS archive_marks`,
		`ALTER TABLE read_marks DROP COLUMN IF EXISTS tx, DROP COLUMN IF EXISTS seq, DROP COLUMN IF EXISTS overrides_from,
			DROP COLUMN IF EXISTS overrides_tx, DROP COLUMN IF EXISTS overrides_seq`,
		`ALTER TABLE notifications DROP COLUMN IF EXISTS archived_at, DROP COLUMN IF EXISTS read_tx, DROP COLUMN IF EXISTS read_seq,
			DROP COLUMN IF EXISTS archive_tx, DROP COLUMN IF EXISTS archive_seq`,
	)
	return inLockedTx(ctx, db, statements...)
}

// m019WebhookFunction writes notification.read (a read, a read-all) and
// notification.archived (an archive, an archive-all) in the transaction of
// the change, as migration 12's triggers write the others: one insert per
// statement, and one look at webhook_endpoints when none takes them.
const m019WebhookFunction = `CREATE OR REPLACE FUNCTION spoolcast_webhook_states() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled AND events && ARRAY['notification.read', 'notification.archived']) THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (endpoint_id, type, payload)
    SELECT e.id, t.type, spoolcast_webhook_body(t.type, s.created_at, jsonb_build_object('user_id', s.user_id,
            CASE WHEN s.kind IN ('read', 'archived') THEN 'notification_id' ELSE 'all_through_id' END, spoolcast_public_id(s.note_at, s.note_seq),
            t.at_field, spoolcast_rfc3339(s.created_at)))
    FROM new_rows s
    CROSS JOIN LATERAL (SELECT CASE WHEN s.kind IN ('read', 'read_all') THEN 'notification.read' ELSE 'notification.archived' END AS type,
                               CASE WHEN s.kind IN ('read', 'read_all') THEN 'read_at' ELSE 'archived_at' END AS at_field) t
    JOIN webhook_endpoints e ON e.enabled AND t.type = ANY (e.events)
    WHERE s.kind IN ('read', 'read_all', 'archived', 'archive_all') AND s.note_at IS NOT NULL
    ORDER BY s.id;
    RETURN NULL;
END $$`

// buildPartitionedIndex makes index name on the partitioned table, with
// definition (its columns and WHERE), without blocking writes: an index on
// the parent alone (ON ONLY, invalid until every partition has its own),
// then each partition's built concurrently and attached, as migration 7
// does. Partitions attached later get theirs from the parent. Run again
// after a failure, it builds what is missing.
func buildPartitionedIndex(ctx context.Context, db *sql.DB, table, name, definition string) error {
	if err := inLockedTx(ctx, db, `CREATE INDEX IF NOT EXISTS `+quote(name)+` ON ONLY `+quote(table)+` `+definition); err != nil {
		return err
	}
	parts, err := partitionsOf(ctx, db, table)
	if err != nil {
		return err
	}
	for _, part := range parts {
		// Attached already (a partition made after the parent's index, or
		// a run before this one): nothing to build.
		var attached bool
		if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid
				WHERE i.inhparent = $1::regclass AND x.indrelid = $2::regclass)`, quote(name), quote(part)).Scan(&attached); err != nil {
			return err
		}
		if attached {
			continue
		}
		idx := indexName(part, name, table)
		if err := withLockTimeout(ctx, db, func(conn *sql.Conn) error {
			return buildIndexConcurrently(ctx, conn, idx, `ON `+quote(part)+` `+definition)
		}); err != nil {
			return err
		}
		if err := inLockedTx(ctx, db, `ALTER INDEX `+quote(name)+` ATTACH PARTITION `+quote(idx)); err != nil {
			return err
		}
	}
	return nil
}

// indexName is the name of a partition's index of the parent's index name:
// the partition's name and what the parent's adds to its table's
// (notifications_20261130 and notifications_inbox: notifications_20261130_inbox).
func indexName(part, name, table string) string {
	suffix := name
	if len(name) > len(table) && name[:len(table)] == table {
		suffix = name[len(table)+1:]
	}
	out := part + "_" + suffix
	if len(out) > 63 {
		out = out[:63]
	}
	return out
}

// partitionsOf lists the partitions of a partitioned table.
func partitionsOf(ctx context.Context, db *sql.DB, table string) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = $1::regclass ORDER BY c.relname`, quote(table))
	if err != nil {
		return nil, fmt.Errorf("list the partitions of %s: %w", table, err)
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		parts = append(parts, name)
	}
	return parts, rows.Err()
}
