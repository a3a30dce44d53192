package pgpool_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// port answers which server a pooled connection reaches.
func port(t *testing.T, conn *pgxpool.Conn) int {
	t.Helper()
	var p int
	if err := conn.QueryRow(context.Background(), `SELECT inet_server_port()`).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// ports acquires n connections at once and answers the servers they reach.
func ports(t *testing.T, pool *pgxpool.Pool, n int) []int {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	out := make([]int, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		out[i] = port(t, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return out
}

func TestAPoolDropsEveryConnectionToAServerThatTurnedReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := pgtest.Primary(t, false)
	pool, err := pgpool.New(ctx, pgpool.Config{URL: r.URL, MaxConns: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	for _, p := range ports(t, pool, 3) { // three idle connections to the primary
		if p != r.Primary.Port() {
			t.Fatalf("a connection reached port %d before the switch, want the primary's %d", p, r.Primary.Port())
		}
	}

	// A switchover: the old primary is fenced read-only (and keeps its
	// connections open), the standby promoted.
	fence := pgtest.Connect(t, r.Primary.URL)
	for _, q := range []string{`ALTER SYSTEM SET default_transaction_read_only = on`, `SELECT pg_reload_conf()`} {
		if _, err := fence.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	testsignal.Eventually(t, "the old primary to turn read-only", 10*time.Second, func() bool {
		var ro string
		return fence.QueryRow(ctx, `SHOW transaction_read_only`).Scan(&ro) == nil && ro == "on"
	})
	if err := r.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	// The first write meets the read-only server, once.
	_, err = pool.Exec(ctx, `INSERT INTO t VALUES (1)`)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("the first write after the switch: %v, want SQLSTATE 25006 from the old primary", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatalf("the second write after the switch: %v; want the pool on the new primary", err)
	}
	// Not one connection to the old primary is handed out again, not even
	// the idle ones that never wrote.
	for _, p := range ports(t, pool, 3) {
		if p != r.Standby.Port() {
			t.Errorf("a pooled connection still reaches port %d; want the new primary's %d", p, r.Standby.Port())
		}
	}
}

func TestAPoolFollowsThePrimaryThroughACrashAndAPromotion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := pgtest.Primary(t, true)
	const conns = 4
	pool, err := pgpool.New(ctx, pgpool.Config{URL: r.URL, MaxConns: conns, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	ports(t, pool, conns)
	r.FailOver(t)
	start := time.Now()
	failures := 0
	for n := 0; n < 10*conns; n++ {
		if _, err := pool.Exec(ctx, `INSERT INTO t VALUES ($1)`, n); err != nil {
			failures++
			t.Logf("write %d after the promotion: %v", n, err)
		}
	}
	t.Logf("%d writes after the promotion in %s, %d failed", 10*conns, time.Since(start).Round(time.Millisecond), failures)
	if failures > conns {
		t.Errorf("%d writes failed; want at most one per connection to the dead primary (%d)", failures, conns)
	}
	for _, p := range ports(t, pool, conns) {
		if p != r.Standby.Port() {
			t.Errorf("a pooled connection reaches port %d; want the new primary's %d", p, r.Standby.Port())
		}
	}
}
