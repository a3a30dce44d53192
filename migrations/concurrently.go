package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// withLockTimeout runs fn on one connection whose lock waits end after
// lockTimeout, for statements that cannot run in a transaction (CREATE and
// DROP INDEX CONCURRENTLY). The setting is reset before the connection goes
// back to the pool.
func withLockTimeout(ctx context.Context, db *sql.DB, fn func(conn *sql.Conn) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SET lock_timeout = '`+lockTimeout+`'`); err != nil {
		return err
	}
	err = fn(conn)
	if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), `RESET lock_timeout`); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// buildIndexConcurrently builds index name with definition (what follows
// "CREATE INDEX name": ON table (columns) …) without blocking writes to the
// table. A build cut short (a lock_timeout behind a long transaction, a
// cancelled migration) leaves an invalid index, which the next run drops and
// builds again.
func buildIndexConcurrently(ctx context.Context, conn *sql.Conn, name, definition string) error {
	var valid sql.NullBool
	if err := conn.QueryRowContext(ctx, `SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = $1`, name).Scan(&valid); err != nil && err != sql.ErrNoRows {
		return err
	}
	if valid.Valid && !valid.Bool {
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+quote(name)); err != nil {
			return fmt.Errorf("drop the invalid index %s: %w", name, err)
		}
	}
	if _, err := conn.ExecContext(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+quote(name)+` `+definition); err != nil {
		return fmt.Errorf("build %s: %w (a lock_timeout means a transaction older than the build is still open: run migrate up again once it ends)", name, err)
	}
	return nil
}

// replaceIndex builds index name with definition, then drops index old,
// both concurrently, under lockTimeout.
func replaceIndex(ctx context.Context, db *sql.DB, name, definition, old string) error {
	return withLockTimeout(ctx, db, func(conn *sql.Conn) error {
		if err := buildIndexConcurrently(ctx, conn, name, definition); err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+quote(old)); err != nil {
			return fmt.Errorf("drop %s: %w", old, err)
		}
		return nil
	})
}
