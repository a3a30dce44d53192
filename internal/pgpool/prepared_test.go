package pgpool_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

// hot is the statement the pools prepare; cold one they do not.
const (
	hot  = `SELECT v FROM t WHERE id = $1`
	cold = `SELECT v FROM t WHERE id <> $1`
)

// withTable returns the URL of a database holding t (id 1, v 'one').
func withTable(t *testing.T) string {
	t.Helper()
	url := pgtest.EmptyDB(t)
	setup := pgtest.Connect(t, url)
	if _, err := setup.Exec(context.Background(), `CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'one')`); err != nil {
		t.Fatal(err)
	}
	return url
}

func open(t *testing.T, cfg pgpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgpool.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// run runs hot and returns what it answered.
func run(pool *pgxpool.Pool) (string, error) {
	var v string
	err := pool.QueryRow(context.Background(), hot, 1).Scan(&v)
	return v, err
}

// prepared answers, on the pool's one connection, the plans Postgres made
// for each statement the connection holds prepared.
func prepared(t *testing.T, pool *pgxpool.Pool) map[string][2]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]int{}
	for rows.Next() {
		var sql string
		var plans [2]int
		if err := rows.Scan(&sql, &plans[0], &plans[1]); err != nil {
			t.Fatal(err)
		}
		out[sql] = plans
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOnADirectConnectionOnlyTheNamedStatementsArePrepared(t *testing.T) {
	t.Parallel()
	url := withTable(t)
	for _, generic := range []bool{false, true} {
		pool := open(t, pgpool.Config{URL: url, MaxConns: 1, Prepare: []string{hot}, GenericPlans: generic})
		for range 3 {
			if v, err := run(pool); err != nil || v != "one" {
				t.Fatalf("hot: %q, %v", v, err)
			}
			if _, err := pool.Exec(context.Background(), cold, 1); err != nil {
				t.Fatalf("cold: %v", err)
			}
		}
		got := prepared(t, pool)
		plans, ok := got[hot]
		if !ok || len(got) != 1 {
			t.Fatalf("generic plans %v: prepared %v, want only %q", generic, got, hot)
		}
		// Postgres tries five custom plans before it settles on a generic
		// one, unless told to use generic plans.
		if want := map[bool][2]int{false: {0, 3}, true: {3, 0}}[generic]; plans != want {
			t.Errorf("generic plans %v: %d generic and %d custom plans, want %v", generic, plans[0], plans[1], want)
		}
	}
	off := open(t, pgpool.Config{URL: url, MaxConns: 1, Prepare: []string{hot}, PreparedStatements: pgpool.PreparedOff})
	if _, err := run(off); err != nil {
		t.Fatal(err)
	}
	if got := prepared(t, off); len(got) != 0 {
		t.Errorf("with prepared statements off: prepared %v, want none", got)
	}
}

// TestThroughPgBouncerInTransactionModeNothingIsPrepared pins what the
// installed PgBouncer (1.18) does with a named statement in transaction
// mode: it stays on the server connection of the transaction that prepared
// it, and the client's next transaction may run on another. Told nothing,
// a pool sees the pooler and prepares nothing; told on, it loses the
// statement as soon as its transaction moves, and drops the connection so
// that the next one prepares afresh. PgBouncer 1.21 and later can carry
// named statements (max_prepared_statements > 0): there on works.
func TestThroughPgBouncerInTransactionModeNothingIsPrepared(t *testing.T) {
	t.Parallel()
	url := withTable(t)
	for _, mode := range []pgpool.PreparedStatements{pgpool.PreparedAuto, pgpool.PreparedOn} {
		t.Run(mode.String(), func(t *testing.T) {
			// A PgBouncer of its own holds one idle server connection, which
			// the pool's first transactions (and a prepare) use.
			bounced := pgtest.PgBouncer(t, url)
			pool := open(t, pgpool.Config{URL: bounced, MaxConns: 1, Prepare: []string{hot}, PreparedStatements: mode, GenericPlans: true})
			if _, err := run(pool); err != nil {
				t.Fatalf("before the server moved: %v", err)
			}
			// PgBouncer's one idle server connection is held for the rest
			// of the test: a client's next transaction runs on a new one.
			pgtest.HoldOpen(t, bounced, `SELECT 1`)
			_, err := run(pool)
			var pgErr *pgconn.PgError
			switch {
			case mode == pgpool.PreparedAuto && err != nil:
				t.Fatalf("on another server connection: %v; want the statement unnamed, runnable anywhere", err)
			case mode == pgpool.PreparedOn && !(errors.As(err, &pgErr) && pgErr.Code == "26000"):
				t.Fatalf("on another server connection: %v; want invalid_sql_statement_name (26000) from PgBouncer 1.18, which does not carry named statements", err)
			}
			if v, err := run(pool); err != nil || v != "one" {
				t.Errorf("the next run: %q, %v; want one, on a new connection when the statement was lost", v, err)
			}
			var plans string
			if err := pool.QueryRow(context.Background(), `SHOW plan_cache_mode`, pgx.QueryExecModeSimpleProtocol).Scan(&plans); err != nil || plans != "auto" {
				t.Errorf("plan_cache_mode %q, %v: want auto, never a session setting through a pooler", plans, err)
			}
		})
	}
}

func TestAPreparedStatementWhoseResultChangedFailsOnceThenIsPreparedAfresh(t *testing.T) {
	t.Parallel()
	url := withTable(t)
	pool := open(t, pgpool.Config{URL: url, MaxConns: 1, Prepare: []string{hot}})
	if _, err := run(pool); err != nil {
		t.Fatal(err)
	}
	ddl := pgtest.Connect(t, url)
	if _, err := ddl.Exec(context.Background(), `ALTER TABLE t ALTER COLUMN v TYPE varchar(10)`); err != nil {
		t.Fatal(err)
	}
	_, err := run(pool)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Fatalf("after the column's type changed: %v; want cached plan must not change result type (0A000)", err)
	}
	if v, err := run(pool); err != nil || v != "one" {
		t.Fatalf("the next run: %q, %v; want one", v, err)
	}
	if got := prepared(t, pool); len(got) != 1 {
		t.Errorf("prepared %v, want %q again", got, hot)
	}
	// A statement deallocated under the pool (DEALLOCATE ALL, DISCARD ALL)
	// is lost once too.
	if _, err := pool.Exec(context.Background(), `DEALLOCATE ALL`); err != nil {
		t.Fatal(err)
	}
	if _, err := run(pool); err == nil {
		t.Fatal("after DEALLOCATE ALL the statement ran; want it lost once")
	}
	if v, err := run(pool); err != nil || v != "one" {
		t.Fatalf("the next run: %q, %v; want one", v, err)
	}
}

func TestAStatementThatCannotBePreparedYetRunsUnnamed(t *testing.T) {
	t.Parallel()
	url := pgtest.EmptyDB(t) // no table t: central started before its migrations
	pool := open(t, pgpool.Config{URL: url, MaxConns: 1, Prepare: []string{hot}})
	if _, err := run(pool); err == nil {
		t.Fatal("hot ran without its table")
	}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'one')`); err != nil {
		t.Fatal(err)
	}
	if v, err := run(pool); err != nil || v != "one" {
		t.Fatalf("once its table exists: %q, %v; want one", v, err)
	}
}

func TestPreparedStatementsReadsAutoOnAndOff(t *testing.T) {
	for name, want := range map[string]pgpool.PreparedStatements{"auto": pgpool.PreparedAuto, "on": pgpool.PreparedOn, "off": pgpool.PreparedOff, "OFF": pgpool.PreparedOff} {
		var p pgpool.PreparedStatements
		if err := p.UnmarshalText([]byte(name)); err != nil || p != want {
			t.Errorf("%s: %v, %v; want %v", name, p, err, want)
		}
	}
	var p pgpool.PreparedStatements
	if err := p.UnmarshalText([]byte("yes")); err == nil {
		t.Error("yes was taken; want auto, on or off")
	}
	if (pgpool.PreparedStatements(0)) != pgpool.PreparedAuto {
		t.Error("the zero value is not auto: a Config built in code would not get the default")
	}
}

// runWhereAllowed runs sql through PrepareWhereAllowed.
func runWhereAllowed(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string) {
	t.Helper()
	var v string
	if err := q.QueryRow(context.Background(), sql, pgpool.PrepareWhereAllowed, 1).Scan(&v); err != nil || v != "one" {
		t.Fatalf("%s: %q, %v", sql, v, err)
	}
}

// Statements whose texts are known only when they run are prepared on
// their connection's first run where the pool may hold them (inside a
// transaction too, as the read replica's reads run), and run unnamed with
// prepared statements off. A connection keeps the 32 it ran last; a text
// Postgres refuses fails with Postgres's error.
func TestPrepareWhereAllowedPreparesOnAConnectionThatMayHoldThem(t *testing.T) {
	t.Parallel()
	url := withTable(t)
	pool := open(t, pgpool.Config{URL: url, MaxConns: 1, PrepareOnFirstRun: true})
	for range 3 {
		runWhereAllowed(t, pool, hot)
	}
	if _, err := pool.Exec(context.Background(), cold, 1); err != nil {
		t.Fatal(err)
	}
	if got := prepared(t, pool); len(got) != 1 || got[hot] != [2]int{0, 3} {
		t.Fatalf("prepared %v; want %q alone, run three times", got, hot)
	}

	inTx := hot + ` AND true`
	tx, err := pool.BeginTx(context.Background(), pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	runWhereAllowed(t, tx, inTx)
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := prepared(t, pool)[inTx]; !ok {
		t.Errorf("a text first run in a read-only transaction is not held after it")
	}

	var texts []string
	for i := range 40 {
		texts = append(texts, fmt.Sprintf(`SELECT v FROM t WHERE id = $1 AND %d = %d`, i, i))
		runWhereAllowed(t, pool, texts[i])
		runWhereAllowed(t, pool, hot) // run between every other: never the least recent
	}
	got := prepared(t, pool)
	if len(got) != 32 {
		t.Errorf("after 42 texts the connection holds %d, want 32", len(got))
	}
	for _, sql := range append([]string{hot}, texts[len(texts)-31:]...) {
		if _, ok := got[sql]; !ok {
			t.Errorf("%q, one of the 32 run last, is not held", sql)
		}
	}

	var pgErr *pgconn.PgError
	if err := pool.QueryRow(context.Background(), `SELECT v FROM missing WHERE id = $1`, pgpool.PrepareWhereAllowed, 1).Scan(new(string)); !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Errorf("a text naming a missing table: %v; want undefined_table (42P01)", err)
	}
	runWhereAllowed(t, pool, hot)

	off := open(t, pgpool.Config{URL: url, MaxConns: 1, PreparedStatements: pgpool.PreparedOff, PrepareOnFirstRun: true})
	runWhereAllowed(t, off, hot)
	if got := prepared(t, off); len(got) != 0 {
		t.Errorf("with prepared statements off: prepared %v, want none", got)
	}
	unmarked := open(t, pgpool.Config{URL: url, MaxConns: 1})
	runWhereAllowed(t, unmarked, hot)
	if got := prepared(t, unmarked); len(got) != 0 {
		t.Errorf("a pool opened without PrepareOnFirstRun: prepared %v, want none", got)
	}
}

// Through PgBouncer in transaction mode (auto), PrepareWhereAllowed
// prepares nothing, so the statement runs on whichever server connection
// the next transaction gets.
func TestPrepareWhereAllowedPreparesNothingThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := withTable(t)
	bounced := pgtest.PgBouncer(t, url)
	pool := open(t, pgpool.Config{URL: bounced, MaxConns: 1, PrepareOnFirstRun: true})
	runWhereAllowed(t, pool, hot)
	pgtest.HoldOpen(t, bounced, `SELECT 1`)
	runWhereAllowed(t, pool, hot)
	if got := prepared(t, pool); len(got) != 0 {
		t.Errorf("through PgBouncer: prepared %v, want none", got)
	}
}
