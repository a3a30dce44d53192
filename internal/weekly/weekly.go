// Package weekly names and creates the weekly partitions of spoolcast's partitioned
// tables the way migration 004's spoolcast_ensure_week_partition makes them:
// weeks start Monday 00:00 UTC, and a partition is <table>_YYYYMMDD of its
// first day.
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

// Ensure creates table's weekly partition holding at (zero: Postgres's now())
// unless it exists, and reports whether it created it. It is the one place
// partitions are made: maintenance ahead of time, ingest and the dispatcher
// on demand when a write finds none (NoPartition). It keeps no session
// state, so it works through PgBouncer in transaction mode.
func Ensure(ctx context.Context, db DB, table string, at time.Time) (bool, error) {
	var when *time.Time
	if !at.IsZero() {
		when = &at
	}
	var created bool
	err := db.QueryRow(ctx, `SELECT spoolcast_ensure_week_partition($1::regclass, coalesce($2::timestamptz, now()))`,
		pgx.QueryExecModeCacheDescribe, table, when).Scan(&created)
	if err != nil {
		what := "this week"
		if when != nil {
			what = "the week of " + at.UTC().Format(time.DateOnly)
		}
		return false, fmt.Errorf("create the partition of %s for %s: %w", table, what, err)
	}
	return created, nil
}

// NoPartition reports Postgres's "no partition of relation found for row":
// a write into a week whose partition does not exist yet.
func NoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition")
}
