package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
)

// Migration 7 makes read-all a point in commit order and gives the live
// resume an index, without stopping ingest on a large deployment:
//
//   - read_marks.snapshot: the snapshot read-all was taken in. A notification
//     counts as read by read-all only when its transaction had committed in
//     that snapshot, so one that commits later arrives unread everywhere.
//     read_events carries the same snapshot and the newest notification
//     covered, so the live stream can tell other devices what stayed unread.
//   - notifications (user_id, tx, id): the resume and pull-to-refresh read one
//     user's rows in commit order; without it each read sorts the user's rows.
//     It is built partition by partition with CREATE INDEX CONCURRENTLY, which
//     never blocks writes, then attached to an index on the parent. A Go
//     migration, since CONCURRENTLY cannot run in a transaction.
//
// Every lock it takes waits at most lockTimeout: behind a long transaction
// it fails with a clear error instead of queueing ingest behind it, and
// `spoolcast migrate up` run again picks up where it stopped.
var m007 = goose.NewGoMigration(7, &goose.GoFunc{RunDB: m007Up}, &goose.GoFunc{RunDB: m007Down})

// lockTimeout bounds every lock wait of a migration's DDL.
const lockTimeout = "5s"

const m007Index = "notifications_user_commit_order"

func m007Up(ctx context.Context, db *sql.DB) error {
	if err := inLockedTx(ctx, db,
		`ALTER TABLE read_marks ADD COLUMN IF NOT EXISTS snapshot pg_snapshot`,
		`ALTER TABLE read_events ADD COLUMN IF NOT EXISTS through_at timestamptz, ADD COLUMN IF NOT EXISTS through_seq bigint,
			ADD COLUMN IF NOT EXISTS snapshot pg_snapshot`,
		`CREATE INDEX IF NOT EXISTS `+m007Index+` ON ONLY notifications (user_id, tx, id)`,
	); err != nil {
		return err
	}
	rows, err := db.QueryContext(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'notifications'::regclass ORDER BY c.relname`)
	if err != nil {
		return fmt.Errorf("list the partitions of notifications: %w", err)
	}
	var parts []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		parts = append(parts, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, part := range parts {
		idx := part + "_user_commit_order"
		if err := withLockTimeout(ctx, db, func(conn *sql.Conn) error {
			return buildIndexConcurrently(ctx, conn, idx, `ON `+quote(part)+` (user_id, tx, id)`)
		}); err != nil {
			return err
		}
		var attached bool
		if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = $1::regclass AND inhparent = $2::regclass)`, idx, m007Index).Scan(&attached); err != nil {
			return err
		}
		if !attached {
			if err := inLockedTx(ctx, db, `ALTER INDEX `+m007Index+` ATTACH PARTITION `+quote(idx)); err != nil {
				return err
			}
		}
	}
	return nil
}

func m007Down(ctx context.Context, db *sql.DB) error {
	return inLockedTx(ctx, db,
		`DROP INDEX IF EXISTS `+m007Index,
		`ALTER TABLE read_marks DROP COLUMN IF EXISTS snapshot`,
		`ALTER TABLE read_events DROP COLUMN IF EXISTS through_at, DROP COLUMN IF EXISTS through_seq, DROP COLUMN IF EXISTS snapshot`,
	)
}

// inLockedTx runs statements in one transaction whose lock waits end after
// lockTimeout.
func inLockedTx(ctx context.Context, db *sql.DB, statements ...string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '`+lockTimeout+`'`); err != nil {
		return err
	}
	for _, q := range statements {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w (a lock_timeout means another transaction holds the table: run migrate up again once it ends)", q, err)
		}
	}
	return tx.Commit()
}

func quote(name string) string { return `"` + name + `"` }
