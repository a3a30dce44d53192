package feed

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// Limits of a page.
const (
	DefaultLimit = 20
	MaxLimit     = 100
	// UnreadCap is the most unread rows counted; past it the count says "capped".
	UnreadCap = 100
)

// ErrNotFound: no such notification for this user (another user's is not found either).
var ErrNotFound = errors.New("notification not found")

// DB is what the feed needs of Postgres: a pgxpool.Pool or a pgx.Conn.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Store reads and updates feeds.
type Store struct {
	db         DB
	clock      clock.Clock
	partitions *partitionCache
	prepare    pgx.QueryRewriter // runs reads as named prepared statements where it may; nil: unnamed
}

// NewStore returns a store over db that tells time by clk: the newest
// created_at a read expects, and when a missing partition is looked up
// again; nil is the wall clock.
func NewStore(db DB, clk clock.Clock) *Store {
	return &Store{db: db, clock: clock.Or(clk), partitions: &partitionCache{}}
}

// On returns the store reading and writing through db instead (a read
// replica, a transaction), sharing what this one knows of the partitions:
// they are the same on a streaming standby, and a partition it does not
// have yet is only read through the partitioned table for a while.
func (s *Store) On(db DB) *Store {
	return &Store{db: db, clock: s.clock, partitions: s.partitions, prepare: s.prepare}
}

// WithPreparedReads returns the store running its reads (pages, unread
// counts) through prepare, passed as each read's first argument: a query
// rewriter that runs a read as a named prepared statement on the
// connections that may hold one (pgpool.PrepareWhereAllowed). Prepared, a
// read is parsed once per connection and, once Postgres settles on a
// generic plan, planned once, where an unnamed statement is parsed and
// planned at every run (most of what a page costs Postgres:
// benchmarks/README.md, "Feed reads under load"). Their texts name the
// weeks' partitions, so a connection prepares a few more each week.
func (s *Store) WithPreparedReads(prepare pgx.QueryRewriter) *Store {
	out := *s
	out.prepare = prepare
	return &out
}

// args are a read's arguments, after the rewriter that prepares it.
func (s *Store) args(args queryArgs) []any {
	if s.prepare != nil {
		return append([]any{s.prepare}, args...)
	}
	return args
}

// queryArgs are the arguments of a statement being built.
type queryArgs []any

// add appends an argument and returns its placeholder.
func (a *queryArgs) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}
