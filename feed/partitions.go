package feed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

// directWeeks is how many weekly partitions a read asks by name, newest
// first, before it asks the partitioned table for the rest. Postgres plans a
// query on the partitioned table at a cost that grows with its partitions,
// several times a small page's own cost; a query on one partition plans like
// a plain table. Most reads are answered from the newest one or two, in one
// statement that reads them in turn.
const directWeeks = 2

// span is a piece of a read: one week, asked by its partition's name, or
// through the partitioned table ("notifications") with bounds on created_at:
// a week whose partition does not exist, or every partition before a week.
type span struct {
	table  string
	from   *time.Time // the partitioned table: only rows created at or after this
	before *time.Time // the partitioned table: only rows created before this
	week   time.Time  // the week's start; zero for every partition before a week
}

// bound adds the span's created_at bounds to a query on table n.
func (sp span) bound(sql string, args *queryArgs) string {
	if sp.before != nil {
		sql += ` AND n.created_at < ` + args.add(*sp.before)
	}
	if sp.from != nil {
		sql += ` AND n.created_at >= ` + args.add(*sp.from)
	}
	return sql
}

// source is the span's table in a FROM list, as n.
func (sp span) source() string { return pgx.Identifier{sp.table}.Sanitize() + ` n` }

// week returns the span of the week that starts at start: its partition by
// name, or, when it does not exist (weeks before the deployment, or a week
// maintenance has not created yet), the partitioned table bounded to the
// week, rather than a name Postgres would answer with an error.
func (s *Store) week(ctx context.Context, start time.Time) (span, error) {
	name := weekly.Partition("notifications", start)
	exists, err := s.partitions.exists(ctx, s.db, s.clock, name)
	if err != nil {
		return span{}, err
	}
	if exists {
		return span{table: name, week: start}, nil
	}
	from, before := start, start.AddDate(0, 0, 7)
	return span{table: "notifications", from: &from, before: &before, week: start}, nil
}

// weeks returns the spans of the weeks from newest's back to oldest's, newest first.
func (s *Store) weeks(ctx context.Context, newest, oldest time.Time) ([]span, error) {
	var out []span
	for w, last := weekly.Start(newest), weekly.Start(oldest); !w.Before(last); w = w.AddDate(0, 0, -7) {
		sp, err := s.week(ctx, w)
		if err != nil {
			return nil, err
		}
		out = append(out, sp)
	}
	return out, nil
}

// spans returns the pieces of a read of rows at or before upper, newest
// first: by name, the weeks from upper's back to directWeeks-1 weeks before
// at's (a read of the newest rows bounds them by now plus FutureSlack, so
// from Sunday it names next week's too), and the rest, every partition
// before them, through the partitioned table.
func (s *Store) spans(ctx context.Context, upper, at time.Time) (named []span, rest span, err error) {
	named, err = s.weeks(ctx, upper, at.AddDate(0, 0, -7*(directWeeks-1)))
	if err != nil {
		return nil, span{}, err
	}
	before := named[len(named)-1].week
	return named, span{table: "notifications", before: &before}, nil
}

// forget drops what is known of the spans' partitions: a statement naming
// them found one missing (retention dropped it since it was looked up).
func (s *Store) forget(spans ...[]span) {
	for _, sps := range spans {
		for _, sp := range sps {
			s.partitions.forget(sp.table)
		}
	}
}

// partitionRecheck is how long a partition found missing is read through the
// partitioned table before its name is looked up again.
const partitionRecheck = time.Minute

// partitionCache remembers which weekly partitions exist: one lookup per
// name, then again only for those found missing, after partitionRecheck.
type partitionCache struct {
	mu      sync.Mutex
	present map[string]bool
	missing map[string]time.Time // when it was found missing
}

func (c *partitionCache) exists(ctx context.Context, db DB, clk clock.Clock, name string) (bool, error) {
	c.mu.Lock()
	present, checked := c.present[name], c.missing[name]
	c.mu.Unlock()
	if present {
		return true, nil
	}
	if !checked.IsZero() && clock.Since(clk, checked) < partitionRecheck {
		return false, nil
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{name}.Sanitize()).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up partition %s: %w", name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.present == nil {
		c.present, c.missing = map[string]bool{}, map[string]time.Time{}
	}
	if exists {
		c.present[name] = true
		delete(c.missing, name)
	} else {
		c.missing[name] = clk.Now()
	}
	return exists, nil
}

// forget drops a partition that was dropped after it was looked up
// (retention): the next read looks it up again.
func (c *partitionCache) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.present, name)
}

// undefinedTable reports a missing relation: a week whose partition does not exist.
func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
