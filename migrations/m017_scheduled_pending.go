package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
)

// Migration 17 indexes the scheduled notifications the firer can still
// fire, (send_at, id) over rows not cancelled, in place of the index of
// every row: a cancelled event's rows now stay as long as its keys (so a
// repeated cancel and the delivery log can say what it stopped), and the
// firer must not step over them at every pass. A second partial index finds
// the cancelled rows whose time is up, for maintenance. Both builds and the
// drop are CONCURRENTLY, so ingest, which writes scheduled rows, never waits
// for them; every lock waits at most lockTimeout.
var m017 = goose.NewGoMigration(17, &goose.GoFunc{RunDB: m017Up}, &goose.GoFunc{RunDB: m017Down})

const (
	m017Pending   = "scheduled_notifications_pending"
	m017Cancelled = "scheduled_notifications_cancelled"
	m017Old       = "scheduled_notifications_due"
)

func m017Up(ctx context.Context, db *sql.DB) error {
	if err := replaceIndex(ctx, db, m017Pending, `ON scheduled_notifications (send_at, id) WHERE cancelled_at IS NULL`, m017Old); err != nil {
		return err
	}
	return withLockTimeout(ctx, db, func(conn *sql.Conn) error {
		return buildIndexConcurrently(ctx, conn, m017Cancelled, `ON scheduled_notifications (send_at) WHERE cancelled_at IS NOT NULL`)
	})
}

func m017Down(ctx context.Context, db *sql.DB) error {
	return withLockTimeout(ctx, db, func(conn *sql.Conn) error {
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+quote(m017Cancelled)); err != nil {
			return fmt.Errorf("drop %s: %w", m017Cancelled, err)
		}
		if err := buildIndexConcurrently(ctx, conn, m017Old, `ON scheduled_notifications (send_at, id)`); err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+quote(m017Pending)); err != nil {
			return fmt.Errorf("drop %s: %w", m017Pending, err)
		}
		return nil
	})
}
