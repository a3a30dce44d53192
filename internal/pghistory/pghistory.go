// Package pghistory names the history of a Postgres database: the cluster's
// system identifier and the timeline of the WAL it writes. A restore into a
// new cluster changes the first, the promotion of a standby the second; what
// was said of one history (a transaction id, a commit) says nothing of
// another. The live stream's cursors and the relay's refeed window both
// follow it.
package pghistory

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// System is the cluster's system identifier as a scalar subquery.
const System = `(SELECT system_identifier FROM pg_control_system())`

// Columns are the two history columns for a statement's select list. A
// primary names its timeline by the WAL file it writes; a standby, which
// cannot, by the stream it receives (by its last restartpoint while it
// receives none).
const Columns = System + `,
	CASE WHEN pg_is_in_recovery()
		THEN coalesce((SELECT nullif(received_tli, 0) FROM pg_stat_wal_receiver), (SELECT timeline_id FROM pg_control_checkpoint()))
		ELSE ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::int END`

// History is one history of a database.
type History struct {
	System   uint64
	Timeline uint32
}

// String is the history as "system/timeline".
func (h History) String() string {
	return strconv.FormatUint(h.System, 10) + "/" + strconv.FormatUint(uint64(h.Timeline), 10)
}

// Scan returns the targets Columns scan into, and the history they fill.
func Scan() (targets []any, history func() History) {
	var sys int64
	var tl int32
	return []any{&sys, &tl}, func() History { return History{System: uint64(sys), Timeline: uint32(tl)} }
}

// DB is what Read needs: a pool, a connection or a transaction.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Read reads the database's history in a statement of its own.
func Read(ctx context.Context, db DB) (History, error) {
	targets, history := Scan()
	if err := db.QueryRow(ctx, `SELECT `+Columns, pgx.QueryExecModeCacheDescribe).Scan(targets...); err != nil {
		return History{}, fmt.Errorf("read the database's history: %w", err)
	}
	return history(), nil
}
