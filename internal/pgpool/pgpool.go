// Package pgpool opens the Postgres pools of the relay and central. Their
// statements keep no session state, so a pool may point at PgBouncer in
// transaction mode, and every wait on Postgres is bounded. A pool follows
// the primary: the URL may list several hosts with
// target_session_attrs=read-write, and a connection whose server has gone
// or turned read-only is never handed out again.
package pgpool

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
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
//
// The URL is passed to pgx as it is, so it may name several hosts
// (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write): a new
// connection goes to the first that accepts writes. An answer that says a
// connection's server can no longer serve it (see gone) drops that
// connection, and a read-only answer drops every idle one too: the server
// changed role, so each of them reaches a standby or a fenced primary, and
// the next connections find the new primary.
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
	// Only error answers pass here: following the primary costs the happy
	// path nothing (no ping, no check before each acquire).
	var self atomic.Pointer[pgxpool.Pool]
	onPgError := pc.ConnConfig.OnPgError // closes on FATAL
	pc.ConnConfig.OnPgError = func(conn *pgconn.PgConn, pgErr *pgconn.PgError) bool {
		if readOnly(pgErr) {
			if p := self.Load(); p != nil {
				p.Reset() // idle connections close now, those in use when released
			}
		}
		if gone(pgErr) {
			return false // close the connection: the pool destroys it on release
		}
		return onPgError == nil || onPgError(conn, pgErr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	self.Store(pool)
	return pool, nil
}

// gone reports an answer that says the connection's server cannot serve it
// any more, whatever the statement: it is read-only (a standby, or a
// primary fenced in a switchover), shutting down or starting up, or the
// connection is broken. Errors without an answer (refused, reset, EOF)
// close the connection already.
func gone(pgErr *pgconn.PgError) bool {
	switch {
	case readOnly(pgErr):
		return true
	case strings.HasPrefix(pgErr.Code, "08"): // connection exception (PgBouncer answers so for a lost server)
		return true
	}
	switch pgErr.Code {
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return true
	}
	return false
}

// readOnly reports SQLSTATE 25006, read_only_sql_transaction: a write
// reached a server that takes none.
func readOnly(pgErr *pgconn.PgError) bool { return pgErr.Code == "25006" }

// ReadOnlySQL answers whether the server no longer takes writes: a standby,
// or a primary fenced read-only during a failover.
const ReadOnlySQL = `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'`
