// Package pgtest gives tests a real Postgres: one throwaway cluster per test
// binary (or the server at DATABASE_URL), and a fresh, migrated database per
// test. Without Postgres the tests skip, unless SPOOLCAST_REQUIRE_PG=1 (as in
// CI), where they fail.
package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	dir, err := os.MkdirTemp("", "spoolcast-pgtest-own-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgcluster.Start(context.Background(), pgcluster.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
		os.RemoveAll(dir)
	})
	return c
}

// WithDatabase returns rawURL pointing at database name.
func WithDatabase(rawURL, name string) string { return withDatabase(rawURL, name) }

func withDatabase(rawURL, name string) string {
	u, err := url.Parse(rawURL)
	if err != nil || !strings.Contains(rawURL, "://") {
		// A keyword/value connection string.
		return rawURL + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}
