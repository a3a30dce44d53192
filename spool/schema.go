package spool

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
)

//go:embed schema.sql
var schemaSQL string

// schemaVersion is the spool file's layout (PRAGMA user_version): 2 keeps
// running totals and fan-outs, and payloads apart, for pending and dead rows;
// 3 keeps kept rows' payloads for the refeed window, counted in kept_bytes,
// and the history of the Postgres last forwarded to (meta); 4 drops the
// unique index on (producer, key), which the key index file replaces, and
// names the spool (meta spool_id) so that its key index is known as its own.
const schemaVersion = 4

// migrate creates the spool's tables, or brings an older file up to date in
// one transaction: its rows are copied into the current layout, kept rows
// without their payloads and pending rows with their fan-out, and the totals
// are counted once.
func migrate(ctx context.Context, conn *sql.Conn) error {
	var version int
	if err := conn.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return err
	}
	if version >= schemaVersion {
		return nil
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	err := func() error {
		var old int
		if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'events'`).Scan(&old); err != nil {
			return err
		}
		if old > 0 && version == 2 {
			if _, err := conn.ExecContext(ctx, `ALTER TABLE totals ADD COLUMN kept_bytes INTEGER NOT NULL DEFAULT 0`); err != nil {
				return err
			}
		}
		if old > 0 && version >= 2 {
			// The events table loses its unique index: SQLite drops a table
			// constraint only with the table, so its rows move to a new one.
			// Triggers and indexes go with the old table; payloads stay.
			for _, q := range []string{
				`DROP TRIGGER IF EXISTS events_totals_insert`, `DROP TRIGGER IF EXISTS events_totals_delete`,
				`DROP TRIGGER IF EXISTS events_totals_update`, `DROP TRIGGER IF EXISTS events_payload_delete`,
				`DROP INDEX IF EXISTS events_pending`, `DROP INDEX IF EXISTS events_forwarded`,
				`ALTER TABLE events RENAME TO events_v3`,
			} {
				if _, err := conn.ExecContext(ctx, q); err != nil {
					return err
				}
			}
			if _, err := conn.ExecContext(ctx, schemaSQL); err != nil {
				return err
			}
			for _, q := range []string{
				`INSERT INTO events (seq, producer, key, request_hash, size, fanout, received_at, forwarded_at, attempts, dead_reason)
				 SELECT seq, producer, key, request_hash, size, fanout, received_at, forwarded_at, attempts, dead_reason FROM events_v3`,
				`DROP TABLE events_v3`,
			} {
				if _, err := conn.ExecContext(ctx, q); err != nil {
					return err
				}
			}
			old = 0
		}
		if old > 0 {
			var hasDead int
			if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info('events') WHERE name = 'dead_reason'`).Scan(&hasDead); err != nil {
				return err
			}
			steps := []string{`ALTER TABLE events RENAME TO events_v1`, `DROP INDEX IF EXISTS events_pending`, `DROP INDEX IF EXISTS events_forwarded`}
			if hasDead == 0 {
				steps = append(steps, `ALTER TABLE events_v1 ADD COLUMN dead_reason TEXT`)
			}
			for _, q := range steps {
				if _, err := conn.ExecContext(ctx, q); err != nil {
					return err
				}
			}
		}
		if _, err := conn.ExecContext(ctx, schemaSQL); err != nil {
			return err
		}
		if old > 0 {
			for _, q := range []string{
				`INSERT INTO events (seq, producer, key, request_hash, size, fanout, received_at, forwarded_at, attempts, dead_reason)
				 SELECT seq, producer, key, request_hash,
				        iif(forwarded_at IS NOT NULL AND dead_reason IS NULL, 0, length(payload)),
				        iif(forwarded_at IS NULL AND json_valid(payload), coalesce(json_array_length(payload, '$.recipients'), 1), 1),
				        received_at, forwarded_at, attempts, dead_reason
				 FROM events_v1`,
				`INSERT INTO payloads (seq, payload)
				 SELECT seq, payload FROM events_v1 WHERE forwarded_at IS NULL OR dead_reason IS NOT NULL`,
				`DROP TABLE events_v1`,
			} {
				if _, err := conn.ExecContext(ctx, q); err != nil {
					return err
				}
			}
		}
		for _, q := range []string{
			`DELETE FROM totals`,
			`INSERT INTO totals (id, pending_rows, pending_bytes, kept_rows, dead_rows, dead_bytes, kept_bytes)
			 SELECT 1,
			        count(*) FILTER (WHERE forwarded_at IS NULL),
			        coalesce(sum(size) FILTER (WHERE forwarded_at IS NULL), 0),
			        count(*) FILTER (WHERE forwarded_at IS NOT NULL AND dead_reason IS NULL),
			        count(*) FILTER (WHERE forwarded_at IS NOT NULL AND dead_reason IS NOT NULL),
			        coalesce(sum(size) FILTER (WHERE forwarded_at IS NOT NULL AND dead_reason IS NOT NULL), 0),
			        -- a kept row's size outlives its payload: count the payloads held
			        coalesce(sum(size) FILTER (WHERE forwarded_at IS NOT NULL AND dead_reason IS NULL
			                                   AND EXISTS (SELECT 1 FROM payloads p WHERE p.seq = events.seq)), 0)
			 FROM events`,
			`INSERT OR IGNORE INTO meta (name, value) VALUES ('spool_id', lower(hex(randomblob(16))))`,
			fmt.Sprintf("PRAGMA user_version = %d", schemaVersion),
		} {
			if _, err := conn.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		_, _ = conn.ExecContext(ctx, "ROLLBACK")
		return err
	}
	_, err = conn.ExecContext(ctx, "COMMIT")
	return err
}
