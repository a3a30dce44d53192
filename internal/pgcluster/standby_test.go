package pgcluster_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestASynchronousStandbyHoldsEveryCommitAndTakesOverWhenPromoted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Now()
	r := pgtest.Primary(t, true)
	t.Logf("primary and standby up in %s", time.Since(start))
	primary, standby := connect(t, r.Primary.URL), connect(t, r.Standby.URL)
	if n := count(t, primary, `SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' AND sync_state = 'sync'`); n != 1 {
		t.Fatalf("the primary counts %d synchronous standbys, want 1", n)
	}
	exec(t, primary, `CREATE TABLE t (n int)`)
	exec(t, primary, `INSERT INTO t VALUES (1)`)
	testsignal.Eventually(t, "the standby to replay the table", 10*time.Second, func() bool {
		return count(t, standby, `SELECT count(*) FROM pg_class WHERE relname = 't'`) == 1
	})
	_, err := standby.Exec(ctx, `INSERT INTO t VALUES (2)`)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("a write on the standby: %v, want SQLSTATE 25006", err)
	}

	// A commit waits for the standby: with the standby frozen, it waits in
	// SyncRep until the standby is thawed.
	thaw, err := r.Standby.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, r.Primary.URL)
		if err == nil {
			_, err = conn.Exec(ctx, `INSERT INTO t VALUES (3)`)
			conn.Close(ctx)
		}
		committed <- err
	}()
	testsignal.Eventually(t, "a commit to wait for the frozen standby", 10*time.Second, func() bool {
		return count(t, primary, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`) == 1
	})
	select {
	case err := <-committed:
		t.Fatalf("a commit returned (%v) while its synchronous standby was frozen", err)
	default:
	}
	thaw()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}

	// The primary crashes; the standby, promoted, holds every commit and
	// takes writes, and the multi-host URL finds it.
	start = time.Now()
	if err := r.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed in %s", time.Since(start))
	if _, err := pgx.Connect(ctx, r.Primary.URL); err == nil {
		t.Fatal("the killed primary still accepts connections")
	}
	start = time.Now()
	if err := r.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("promoted in %s", time.Since(start))
	if n := count(t, standby, `SELECT count(*) FROM t`); n != 2 {
		t.Errorf("the promoted standby holds %d rows, want the 2 committed", n)
	}
	follower := connect(t, r.URL)
	exec(t, follower, `INSERT INTO t VALUES (4)`)
	if port := count(t, follower, `SELECT inet_server_port()`); port != r.Standby.Port() {
		t.Errorf("the multi-host URL reached port %d, want the promoted standby's %d", port, r.Standby.Port())
	}
	// A promoted standby waits for no standby of its own.
	if n := count(t, follower, `SELECT count(*) FROM pg_settings WHERE name = 'synchronous_standby_names' AND setting <> ''`); n != 0 {
		t.Error("the promoted standby inherited synchronous_standby_names: its writes would wait forever")
	}
}

func TestAnAsynchronousPrimaryCommitsWithoutItsStandbyAndAKillIsACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := pgtest.Primary(t, false)
	primary := connect(t, r.Primary.URL)
	if n := count(t, primary, `SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming' AND sync_state = 'async'`); n != 1 {
		t.Fatalf("the primary streams to %d asynchronous standbys, want 1", n)
	}
	thaw, err := r.Standby.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	defer thaw()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := primary.Exec(cctx, `CREATE TABLE t AS SELECT 1 AS n`); err != nil {
		t.Fatalf("a commit with the asynchronous standby frozen: %v", err)
	}
	thaw()
	testsignal.Eventually(t, "the standby to replay the commit", 10*time.Second, func() bool {
		conn, err := pgx.Connect(ctx, r.Standby.URL)
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var n int
		return conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n) == nil && n == 1
	})

	if err := r.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := primary.Ping(ctx); err == nil {
		t.Error("a connection to the killed primary still answers")
	}
	if err := r.Primary.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	again := connect(t, r.Primary.URL)
	if n := count(t, again, `SELECT count(*) FROM t`); n != 1 {
		t.Errorf("after the crash and restart the primary holds %d rows, want 1", n)
	}
	if log, _ := os.ReadFile(r.Primary.LogFile()); !strings.Contains(string(log), "not properly shut down") {
		t.Errorf("the restart after Kill did not recover from a crash; log:\n%s", log)
	}
}
