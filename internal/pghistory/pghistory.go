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

// WAL is the statement's place in its history's WAL, as a bigint: on a
// primary the position its next record goes to, on a standby the position it
// has replayed. Every commit the statement can see lies below it, and so
// does the end of every transaction older than its snapshot's horizon.
const WAL = `(CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_replay_lsn(), '0/0') ELSE pg_current_wal_insert_lsn() END - '0/0'::pg_lsn)::bigint`

// Synchronous tells whether the server is a primary whose commits wait for
// a synchronous standby (synchronous_standby_names, and synchronous_commit
// at least remote_write): then every commit a statement sees is on that
// standby too.
const Synchronous = `(NOT pg_is_in_recovery() AND current_setting('synchronous_standby_names') <> '' AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write'))`

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

// recordSwitch notes where the parent timeline ended, on a primary promoted
// from a standby of that timeline: the position its recovery stopped
// replaying (pg_last_wal_replay_lsn), which this server can tell only until
// its first checkpoint after the promotion (after a crash and restart the
// same function names where crash recovery ended instead). A promotion seen
// later, or one from a timeline other than the one just below, is not
// recorded: cursors from before it are then refused, never trusted.
const recordSwitch = `WITH recorded AS (INSERT INTO timeline_switches (system_identifier, timeline, parent_ended_at)
	SELECT s.sys, s.tl, s.ended FROM (
		SELECT ` + System + ` AS sys,
			CASE WHEN pg_is_in_recovery() THEN NULL ELSE ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::int END AS tl,
			(SELECT timeline_id FROM pg_control_checkpoint()) AS checkpointed,
			pg_last_wal_replay_lsn() AS ended) s
	WHERE s.tl IS NOT NULL AND s.ended IS NOT NULL AND s.checkpointed = s.tl - 1
	ON CONFLICT DO NOTHING RETURNING 1)
	SELECT count(*) > 0 FROM recorded`

// RecordSwitch records, on a primary promoted moments ago, where its
// timeline left its parent (see recordSwitch), and reports whether it did;
// elsewhere it does nothing. Whoever first sees a promotion calls it: the
// record outlives the server's ability to tell.
func RecordSwitch(ctx context.Context, db DB) (bool, error) {
	var recorded bool
	if err := db.QueryRow(ctx, recordSwitch).Scan(&recorded); err != nil {
		return false, fmt.Errorf("record where the timeline began: %w", err)
	}
	return recorded, nil
}

// parentEnded counts the recorded switches from timeline $2 (exclusive) to
// $3 (inclusive) of system $1, and reads where the first of them left
// timeline $2.
const parentEnded = `SELECT count(*), coalesce(max((parent_ended_at - '0/0'::pg_lsn)::bigint) FILTER (WHERE timeline = $2 + 1), 0)
	FROM timeline_switches WHERE system_identifier = $1 AND timeline > $2 AND timeline <= $3`

// Descends reports whether history to is a later timeline of from's system
// with every promotion in between recorded, and if so the WAL position at
// which it left from's timeline: what from had written below it is in to,
// the same transactions under the same ids, and every transaction to began
// afterwards has a larger id than any that had ended below it.
func Descends(ctx context.Context, db DB, from, to History) (leftAt uint64, ok bool, err error) {
	if from.System != to.System || from.Timeline >= to.Timeline {
		return 0, false, nil
	}
	var n, left int64
	if err := db.QueryRow(ctx, parentEnded, int64(from.System), int32(from.Timeline), int32(to.Timeline)).Scan(&n, &left); err != nil {
		return 0, false, fmt.Errorf("read the timeline switches: %w", err)
	}
	if n != int64(to.Timeline-from.Timeline) || left <= 0 {
		return 0, false, nil
	}
	return uint64(left), true, nil
}
