// Package pgpool opens the Postgres pools of the relay and central. Their
// statements keep no session state, so a pool may point at PgBouncer in
// transaction mode, and every wait on Postgres is bounded.
package pgpool

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config describes a pool.
type Config struct {
	// URL is the Postgres connection URL. Required.
	URL string
	// MaxConns caps the pool's connections. Required, at least 1.
	MaxConns int
	// ConnectTimeout bounds opening one connection, unless the URL sets
	// connect_timeout. Default 5s.
	ConnectTimeout time.Duration
	// CancelGrace is how long a statement whose context ended may take to
	// stop after Postgres is asked to cancel it, before its connection is
	// dropped (a hung server never answers the cancel). Default 1s.
	CancelGrace time.Duration
}

// New opens a pool. Unless the URL chooses its own default_query_exec_mode,
// statements run unnamed with their descriptions cached per connection: no
// named prepared statements, which PgBouncer before 1.21 (or with
// max_prepared_statements = 0) cannot carry between transactions. When a
// caller's context ends mid-statement, Postgres is asked to cancel it at once,
// and the connection is dropped CancelGrace later if that does not help.
func New(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if cfg.MaxConns < 1 {
		return nil, fmt.Errorf("max connections %d: want at least 1", cfg.MaxConns)
	}
	if cfg.ConnectTimeout < 0 || cfg.CancelGrace < 0 {
		return nil, fmt.Errorf("connect timeout and cancel grace must not be negative")
	}
	pc.MaxConns = int32(cfg.MaxConns)
	pc.MinConns = 0
	if !strings.Contains(cfg.URL, "default_query_exec_mode") {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	if !strings.Contains(cfg.URL, "connect_timeout") {
		pc.ConnConfig.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, 5*time.Second)
	}
	grace := cmp.Or(cfg.CancelGrace, time.Second)
	pc.ConnConfig.BuildContextWatcherHandler = func(conn *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: conn, DeadlineDelay: grace}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	return pool, nil
}
