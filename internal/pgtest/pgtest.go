// Package pgtest gives tests a real Postgres: one throwaway cluster per test
// binary (or the server at DATABASE_URL), and a fresh, migrated database per
// test; for tests that stop, kill or fail over Postgres, clusters of their
// own (Cluster; Primary, with a streaming standby). Without Postgres the
// tests skip, unless SPOOLCAST_REQUIRE_PG=1 (as in CI), where they fail.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
)

const templateDB = "spoolcast_template"

var (
	once     sync.Once
	adminURL string
	cluster  *pgcluster.Cluster
	tmpDir   string
	setupErr error
	dbSeq    atomic.Int64
)

// Main runs the package's tests, checks that they left no goroutine running,
// and stops the cluster. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines left running after the tests:", err)
			code = 1
		}
	}
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
		os.RemoveAll(tmpDir)
	}
	os.Exit(code)
}

// unavailable skips the test, or fails it when Postgres is required.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("SPOOLCAST_REQUIRE_PG") == "1" {
		t.Fatalf("Postgres is required (SPOOLCAST_REQUIRE_PG=1) but unavailable: %v", err)
	}
	t.Skipf("no Postgres: %v", err)
}

func setup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if u := os.Getenv("DATABASE_URL"); u != "" {
		adminURL = u
	} else {
		if _, setupErr = pgcluster.FindBinaries(); setupErr != nil {
			return
		}
		if tmpDir, setupErr = os.MkdirTemp("", "spoolcast-pgtest-"); setupErr != nil {
			return
		}
		if cluster, setupErr = pgcluster.Start(ctx, pgcluster.Config{Dir: tmpDir}); setupErr != nil {
			return
		}
		adminURL = cluster.URL
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		setupErr = err
		return
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("%s_%d", templateDB, os.Getpid())
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		setupErr = fmt.Errorf("create template database: %w", err)
		return
	}
	if _, err := migrations.Up(ctx, withDatabase(adminURL, name), nil); err != nil {
		setupErr = err
	}
}

// AdminURL returns the URL of the test server's maintenance database.
func AdminURL(t testing.TB) string {
	t.Helper()
	once.Do(setup)
	if setupErr != nil {
		unavailable(t, setupErr)
	}
	return adminURL
}

// DB returns the URL of a new database with every migration applied, dropped
// when the test ends.
func DB(t testing.TB) string {
	t.Helper()
	return newDB(t, fmt.Sprintf("%s_%d", templateDB, os.Getpid()))
}

// EmptyDB returns the URL of a new database without the schema, dropped when
// the test ends.
func EmptyDB(t testing.TB) string {
	t.Helper()
	return newDB(t, "template0")
}

func newDB(t testing.TB, template string) string {
	t.Helper()
	admin := AdminURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), dbSeq.Add(1))
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template)); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return withDatabase(admin, name)
}

// Cluster starts a cluster of the test's own, for tests that stop and restart
// Postgres. It is stopped when the test ends.
func Cluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	if _, err := pgcluster.FindBinaries(); err != nil {
		unavailable(t, err)
	}
	c, err := pgcluster.Start(context.Background(), pgcluster.Config{Dir: ownDir(t, "own")})
	if err != nil {
		t.Fatal(err)
	}
	stopWhenDone(t, c)
	return c
}

// Replicated is a primary with a streaming standby, each a cluster of the
// test's own, for failover tests.
type Replicated struct {
	Primary *pgcluster.Cluster
	Standby *pgcluster.Cluster
	// URL names both servers' postgres database, the primary first, with
	// target_session_attrs=read-write: a client connects to whichever
	// accepts writes, and so follows a promotion by itself.
	URL string
}

// StandbyName is the application_name of Primary's standby.
const StandbyName = "standby"

// Primary starts a primary and a streaming standby of it, both stopped when
// the test ends. With sync, a commit returns only once the standby has
// flushed it (synchronous_standby_names, synchronous_commit=on), so a
// promoted standby holds every commit a client saw. Without, replication
// is asynchronous: the primary flushes its commits and streams them after,
// and what the standby has not received when the primary dies is lost.
// Neither has the schema; see Migrate.
func Primary(t testing.TB, sync bool) *Replicated {
	t.Helper()
	if _, err := pgcluster.FindBinaries(); err != nil {
		unavailable(t, err)
	}
	ctx := context.Background()
	cfg := pgcluster.Config{Dir: ownDir(t, "primary"), Settings: []string{
		"wal_level=replica", "max_wal_senders=10", // Postgres's defaults, which streaming needs
		// Commits are flushed on the primary (a test cluster's default is
		// synchronous_commit=off), or a kill would lose more than what the
		// standby has not received.
		"synchronous_commit=on",
	}}
	if sync {
		cfg.SynchronousStandby = StandbyName
	}
	primary, err := pgcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopWhenDone(t, primary)
	standby, err := primary.Standby(ctx, pgcluster.StandbyConfig{Dir: ownDir(t, "standby"), Name: StandbyName})
	if err != nil {
		t.Fatal(err)
	}
	stopWhenDone(t, standby)
	return &Replicated{Primary: primary, Standby: standby, URL: pgcluster.MultiHostURL(primary, standby)}
}

// FailOver kills the primary as a host's crash would and promotes the
// standby, as an orchestrator does; it returns once the standby takes writes.
func (r *Replicated) FailOver(t testing.TB) {
	t.Helper()
	if err := r.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Standby.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Migrate applies every migration to the primary's postgres database; the
// standby receives the schema by replication.
func (r *Replicated) Migrate(t testing.TB) {
	t.Helper()
	if _, err := migrations.Up(context.Background(), r.URL, nil); err != nil {
		t.Fatal(err)
	}
}

// ownDir is a new directory for a cluster of the test's own, removed when
// the test ends (after the cluster stops: cleanups run last first).
func ownDir(t testing.TB, what string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "spoolcast-pgtest-"+what+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// stopWhenDone stops c (fast mode) when the test ends; a killed one is
// already stopped.
func stopWhenDone(t testing.TB, c *pgcluster.Cluster) {
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
}

func withDatabase(rawURL, name string) string {
	u, err := url.Parse(rawURL)
	if err != nil || !strings.Contains(rawURL, "://") {
		// A keyword/value connection string.
		return rawURL + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

// PgBouncer starts PgBouncer in transaction pooling mode in front of the
// database at dbURL and returns the URL to reach it through PgBouncer; it is
// stopped when the test ends. Without a pgbouncer binary the test skips, or
// fails when SPOOLCAST_REQUIRE_PGBOUNCER=1.
func PgBouncer(t testing.TB, dbURL string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
			bin, err = "/usr/sbin/pgbouncer", nil
		}
	}
	if err != nil {
		if os.Getenv("SPOOLCAST_REQUIRE_PGBOUNCER") == "1" {
			t.Fatalf("PgBouncer is required (SPOOLCAST_REQUIRE_PGBOUNCER=1) but not installed: %v", err)
		}
		t.Skipf("no pgbouncer: %v", err)
	}
	target, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "spoolcast-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // PgBouncer may run as another user
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s user=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
server_round_robin = 1
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = %s/pgbouncer.log
pidfile = %s/pgbouncer.pid
`, target.Hostname(), target.Port(), target.User.Username(), port, dir, dir)
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, iniPath)
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		cmd.Args = []string{bin, "-u", "postgres", iniPath}
	}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	through := *target
	through.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), through.String())
		if err == nil {
			conn.Close(context.Background())
			return through.String()
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited: %s\n%s", out.String(), log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer not ready: %v\n%s", err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pool returns a pool on a new migrated database (see DB), closed when the
// test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Connect(t, DB(t))
}

// Connect returns a pool on url, closed when the test ends.
func Connect(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Count runs a query that answers one number, such as a count(*).
func Count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// HoldOpen runs sql in a transaction on a connection of its own, left open
// until the returned function or the end of the test ends it: a report,
// pg_dump, or a session idle in transaction, holding its locks and its
// snapshot's horizon.
func HoldOpen(t testing.TB, url, sql string) (end func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(end)
	return end
}
