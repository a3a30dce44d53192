package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
)

// Migration 24 gives a broadcast's pushes (written by a topic fan-out, up
// to tens of thousands a second) a lane of their own in the push queue, so
// that direct pushes never wait behind them: the dispatcher claims the due
// direct rows first, from their own partial index, then fills its batch
// with a broadcast's. A digest keeps its pushes' lane while it gathers
// them. The columns have a constant default (a change of the catalog
// alone); the index is built CONCURRENTLY, since ingest and every
// dispatcher write the queue, which holds a whole broadcast's pushes
// while they wait. Every lock waits at most lockTimeout; run again after a
// lock timeout, it picks up where it stopped.
var m024 = goose.NewGoMigration(24, &goose.GoFunc{RunDB: m024Up}, &goose.GoFunc{RunDB: m024Down})

const m024Direct = "push_queue_due_direct"

func m024Up(ctx context.Context, db *sql.DB) error {
	if err := inLockedTx(ctx, db,
		`ALTER TABLE push_queue ADD COLUMN IF NOT EXISTS broadcast boolean NOT NULL DEFAULT false`,
		`ALTER TABLE push_digests ADD COLUMN IF NOT EXISTS broadcast boolean NOT NULL DEFAULT false`,
	); err != nil {
		return err
	}
	return withLockTimeout(ctx, db, func(conn *sql.Conn) error {
		return buildIndexConcurrently(ctx, conn, m024Direct, `ON push_queue (due_at, notification_id) WHERE NOT broadcast`)
	})
}

func m024Down(ctx context.Context, db *sql.DB) error {
	if err := withLockTimeout(ctx, db, func(conn *sql.Conn) error {
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+quote(m024Direct)); err != nil {
			return fmt.Errorf("drop %s: %w", m024Direct, err)
		}
		return nil
	}); err != nil {
		return err
	}
	return inLockedTx(ctx, db,
		`ALTER TABLE push_digests DROP COLUMN IF EXISTS broadcast`,
		`ALTER TABLE push_queue DROP COLUMN IF EXISTS broadcast`)
}
