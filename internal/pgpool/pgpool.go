// Package pgpool opens the Postgres pools of the relay and central. Their
// statements keep no session state, so a pool may point at PgBouncer in
// transaction mode, and every wait on Postgres is bounded; only a connection
// straight to Postgres prepares the few hot statements its caller names
// (Config.Prepare, or PrepareWhereAllowed as a query's first argument). A
// pool follows the primary: the URL may list several hosts with
// target_session_attrs=read-write, and a connection whose server has gone or
// turned read-only is never handed out again.
package pgpool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
	// Prepare lists statements to prepare on each new connection that may
	// hold named prepared statements (see PreparedStatements): there they
	// run prepared, parsed once per connection and, once Postgres settles
	// on a generic plan, planned once, where an unnamed statement is parsed
	// and planned at every run. Postgres re-plans a prepared statement
	// itself after DDL on a table it reads (a partition created, attached
	// or dropped). A statement that fails to prepare (its table does not
	// exist yet) runs unnamed on that connection. Every other statement
	// runs unnamed. Default none.
	Prepare []string
	// PreparedStatements tells which connections may hold named prepared
	// statements. Default PreparedAuto.
	PreparedStatements PreparedStatements
	// GenericPlans makes a connection straight to Postgres use generic
	// plans for its prepared statements from their first run
	// (plan_cache_mode = force_generic_plan): for statements whose best
	// plan does not depend on their arguments but which Postgres, misjudging
	// the generic plan's cost, would otherwise plan at every run. The
	// setting holds for every statement of the connection, unnamed ones
	// too: set it only on a pool whose statements with arguments are all in
	// Prepare. Default off.
	GenericPlans bool
	// PrepareOnFirstRun lets the pool's callers pass PrepareWhereAllowed:
	// each new connection is then checked as for Prepare, even when
	// Prepare is empty. Default off.
	PrepareOnFirstRun bool
}

// PreparedStatements tells which of a pool's connections may hold named
// prepared statements (Config.Prepare, PrepareWhereAllowed).
type PreparedStatements int

const (
	// PreparedAuto prepares on a connection straight to Postgres, not on
	// one through a pooler: PgBouncer's transaction mode before 1.21 (or
	// with max_prepared_statements = 0) hands a client's next transaction
	// to any server connection, where its named statements do not exist.
	// A pooler is known by the cancel key it answers the login with, its
	// own, which names no backend: on a direct connection it names the
	// backend that serves it (pg_backend_pid).
	PreparedAuto PreparedStatements = iota
	// PreparedOn prepares on every connection: for a pooler that carries
	// named statements (PgBouncer 1.21 or later with
	// max_prepared_statements > 0, or any pooler in session mode).
	PreparedOn
	// PreparedOff prepares on none: every statement runs unnamed.
	PreparedOff
)

var preparedNames = [...]string{PreparedAuto: "auto", PreparedOn: "on", PreparedOff: "off"}

// String is auto, on or off.
func (p PreparedStatements) String() string {
	if p < 0 || int(p) >= len(preparedNames) {
		return fmt.Sprintf("PreparedStatements(%d)", int(p))
	}
	return preparedNames[p]
}

// MarshalText is String, so that flag.TextVar shows the default.
func (p PreparedStatements) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads auto, on or off.
func (p *PreparedStatements) UnmarshalText(text []byte) error {
	for i, name := range preparedNames {
		if strings.EqualFold(string(text), name) {
			*p = PreparedStatements(i)
			return nil
		}
	}
	return fmt.Errorf("%q: want auto, on or off", text)
}

// New opens a pool. Unless the URL chooses its own default_query_exec_mode,
// statements run unnamed with their descriptions cached per connection: no
// named prepared statements, which PgBouncer before 1.21 (or with
// max_prepared_statements = 0) cannot carry between transactions; only
// those of cfg.Prepare, and those run through PrepareWhereAllowed, run
// prepared, on the connections that may hold them (cfg.PreparedStatements).
// When a caller's context ends mid-statement, Postgres is asked to cancel
// it at once, and the connection is dropped CancelGrace later if that does
// not help.
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
	if cfg.PreparedStatements < 0 || int(cfg.PreparedStatements) >= len(preparedNames) {
		return nil, fmt.Errorf("prepared statements %s: want auto, on or off", cfg.PreparedStatements)
	}
	pc.MaxConns = int32(cfg.MaxConns)
	pc.MinConns = 0
	if !strings.Contains(cfg.URL, "default_query_exec_mode") {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	if !strings.Contains(cfg.URL, "connect_timeout") {
		pc.ConnConfig.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, 5*time.Second)
	}
	if (len(cfg.Prepare) > 0 || cfg.PrepareOnFirstRun) && cfg.PreparedStatements != PreparedOff {
		pc.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error { return prepare(ctx, conn, cfg) }
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
		if gone(pgErr) || lostStatement(pgErr) {
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

// prepare finds whether a new connection may hold named statements, marks
// it for PrepareWhereAllowed, and prepares cfg.Prepare on it if it may.
func prepare(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	var backend uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&backend); err != nil {
		return fmt.Errorf("read the connection's backend: %w", err)
	}
	direct := backend == conn.PgConn().PID()
	if !direct && cfg.PreparedStatements == PreparedAuto {
		return nil
	}
	if cfg.PrepareOnFirstRun {
		conn.PgConn().CustomData()[preparedKey] = &lazyStatements{}
	}
	if direct && cfg.GenericPlans { // a session setting: never through a pooler
		if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
			return fmt.Errorf("use generic plans: %w", err)
		}
	}
	for _, sql := range cfg.Prepare {
		// Named after its text (a hash of it), and found by it: Query(sql)
		// runs the prepared statement.
		if _, err := conn.Prepare(ctx, sql, sql); err != nil {
			if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) {
				return fmt.Errorf("prepare a statement: %w", err)
			}
		}
	}
	return nil
}

// preparedKey marks, in a connection's custom data, one that may hold named
// statements; its value is the *lazyStatements PrepareWhereAllowed made.
const preparedKey = "spoolcast/pgpool.prepared"

// maxLazyStatements bounds the statements PrepareWhereAllowed keeps on one
// connection; past it the least recently run is deallocated. Texts that
// name a week's partitions change each week, and a connection lives an
// hour at most (pgxpool's MaxConnLifetime).
const maxLazyStatements = 32

// lazyStatements are the texts PrepareWhereAllowed prepared on a
// connection, least recently run first.
type lazyStatements struct{ texts []string }

// PrepareWhereAllowed, passed as a query's first argument, runs the query
// as a named prepared statement on a connection of a pool opened with
// Config.PrepareOnFirstRun whose Config.PreparedStatements lets it hold
// them (PreparedAuto: one straight to Postgres), preparing it on that
// connection's first run of it; elsewhere the query runs unnamed. For
// statements whose texts are not known when the pool opens
// (Config.Prepare). A text Postgres refuses to prepare fails the query
// with that error, as it would fail unnamed (its parse is the same), so a
// transaction the query runs in ends the same way.
var PrepareWhereAllowed pgx.QueryRewriter = prepareWhereAllowed{}

type prepareWhereAllowed struct{}

func (prepareWhereAllowed) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	held, _ := conn.PgConn().CustomData()[preparedKey].(*lazyStatements)
	if held == nil || conn.PgConn().TxStatus() == 'E' { // a failed transaction: the query reports it
		return sql, args, nil
	}
	if i := slices.Index(held.texts, sql); i >= 0 {
		held.texts = append(slices.Delete(held.texts, i, i+1), sql)
		return sql, args, nil
	}
	// Named after its text (a hash of it), and found by it: Query(sql) runs
	// the prepared statement.
	if _, err := conn.Prepare(ctx, sql, sql); err != nil {
		return sql, args, err
	}
	held.texts = append(held.texts, sql)
	if len(held.texts) > maxLazyStatements {
		if err := conn.Deallocate(ctx, held.texts[0]); err != nil {
			return sql, args, err
		}
		held.texts = slices.Delete(held.texts, 0, 1)
	}
	return sql, args, nil
}

// lostStatement reports an answer that says a prepared statement of the
// connection cannot run: it is gone (DISCARD ALL, or a pooler that handed
// the connection to another server: invalid_sql_statement_name), or a change
// of a table's columns changed its result (cached plan must not change
// result type). Closing the connection loses one statement: the next
// connection prepares afresh.
func lostStatement(pgErr *pgconn.PgError) bool {
	return pgErr.Code == "26000" || pgErr.Code == "0A000" && pgErr.Routine == "RevalidateCachedQuery"
}

// readOnly reports SQLSTATE 25006, read_only_sql_transaction: a write
// reached a server that takes none.
func readOnly(pgErr *pgconn.PgError) bool { return pgErr.Code == "25006" }

// ReadOnlySQL answers whether the server no longer takes writes: a standby,
// or a primary fenced read-only during a failover.
const ReadOnlySQL = `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'`
