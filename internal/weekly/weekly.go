// Package weekly names and creates the weekly partitions of spoolcast's partitioned
// tables the way spoolcast_ensure_week_partition (migrations 004 and 008)
// makes them: weeks start Monday 00:00 UTC, and a partition is
// <table>_YYYYMMDD of its first day.
//
// The rule it keeps: creating a partition never queues the table's readers
// and writers behind it, and never waits on a lock for longer than its
// caller's lock timeout.
package weekly

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Start returns the Monday 00:00 UTC that begins t's week, as Postgres's
// date_trunc('week') does.
func Start(t time.Time) time.Time {
	t = t.UTC()
	d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
}

// Partition returns the name of table's partition that holds t.
func Partition(table string, t time.Time) string {
	return table + "_" + Start(t).Format(layout)
}

// ParsePartition returns the first day of a partition of table named name,
// and false for a name that is not one.
func ParsePartition(table, name string) (time.Time, bool) {
	if len(name) != len(table)+1+len(layout) || name[:len(table)+1] != table+"_" {
		return time.Time{}, false
	}
	start, err := time.Parse(layout, name[len(table)+1:])
	return start, err == nil && Start(start).Equal(start)
}

const layout = "20060102"

// DB is what creating a partition needs of Postgres.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// OnDemandLockTimeout is how long Ensure waits for the lock that attaching a
// partition takes on its table, when a write finds no partition. It is short
// because the write waits meanwhile: behind DDL, an ANALYZE or a VACUUM of the
// table, the write fails instead (LockTimeout) and its caller retries it, as
// it retries any transient failure. Maintenance creates partitions weeks
// ahead, so a write rarely has to.
const OnDemandLockTimeout = 250 * time.Millisecond

// Ensure creates table's weekly partition holding at (zero: Postgres's now())
// unless it exists, and reports whether it created it, waiting at most
// OnDemandLockTimeout for a lock. It is the one place partitions are made:
// maintenance ahead of time (with EnsureWithin), ingest and the dispatcher on
// demand when a write finds none (NoPartition).
func Ensure(ctx context.Context, db DB, table string, at time.Time) (bool, error) {
	return EnsureWithin(ctx, db, table, at, OnDemandLockTimeout)
}

// EnsureWithin is Ensure waiting at most lockTimeout (zero:
// OnDemandLockTimeout) for each lock. The partition is made as a table of its
// own, then attached: that takes SHARE UPDATE EXCLUSIVE on table, which no
// read or write conflicts with, where CREATE TABLE ... PARTITION OF would take
// ACCESS EXCLUSIVE and queue every reader and writer behind the open
// transactions it waits for. A lock wait past lockTimeout fails with an error
// LockTimeout reports, and nothing is made. One statement: the lock timeout is
// set like SET LOCAL and restored before it returns, so it keeps no session
// state and works through PgBouncer in transaction mode.
func EnsureWithin(ctx context.Context, db DB, table string, at time.Time, lockTimeout time.Duration) (bool, error) {
	if lockTimeout <= 0 {
		lockTimeout = OnDemandLockTimeout
	}
	var when *time.Time
	if !at.IsZero() {
		when = &at
	}
	var created bool
	err := db.QueryRow(ctx, `SELECT spoolcast_ensure_week_partition($1::regclass, coalesce($2::timestamptz, now()), $3::integer)`,
		pgx.QueryExecModeCacheDescribe, table, when, Millis(lockTimeout)).Scan(&created)
	if err != nil {
		what := "this week"
		if when != nil {
			what = "the week of " + at.UTC().Format(time.DateOnly)
		}
		if LockTimeout(err) {
			return false, fmt.Errorf("create the partition of %s for %s: another session holds a lock on %s (DDL, ANALYZE or VACUUM): %w", table, what, table, err)
		}
		return false, fmt.Errorf("create the partition of %s for %s: %w", table, what, err)
	}
	return created, nil
}

// Millis is d as a lock_timeout in whole milliseconds, rounded up and at
// least 1: Postgres takes 0 as no timeout at all.
func Millis(d time.Duration) int64 {
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}

// NoPartition reports Postgres's "no partition of relation found for row":
// a write into a week whose partition does not exist yet.
func NoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition")
}

// LockTimeout reports a statement Postgres cancelled after lock_timeout
// (SQLSTATE 55P03, lock_not_available): it waited for a lock another session
// holds, did nothing, and may be retried once that session lets go.
func LockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
