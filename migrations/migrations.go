// Package migrations holds the Postgres schema as numbered plain .sql files,
// embedded in the binary and applied with goose under an advisory lock, so
// replicas that start together migrate once.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// goMigrations are the migrations written in Go, where plain SQL cannot do
// the work (an index built concurrently, which cannot run in a transaction).
var goMigrations = []*goose.Migration{m007, m015, m017, m019, m024}

// Status is one migration's state.
type Status struct {
	Version int64
	Name    string
	Applied bool
	// AppliedAt is zero while pending.
	AppliedAt sql.NullTime
}

func provider(db *sql.DB, logger *slog.Logger) (*goose.Provider, error) {
	// An advisory lock held for the session: the second replica waits for the
	// first to finish, then finds nothing to do. It needs a direct connection,
	// not PgBouncer in transaction mode.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 600))
	if err != nil {
		return nil, err
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true), goose.WithGoMigrations(goMigrations...)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger.With("component", "migrate")))
	}
	return goose.NewProvider(goose.DialectPostgres, db, files, opts...)
}

// Up applies every pending migration and returns the versions it applied.
func Up(ctx context.Context, databaseURL string, logger *slog.Logger) ([]int64, error) {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	p, err := provider(db, logger)
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate up: %w", err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// List returns every migration with whether it is applied.
func List(ctx context.Context, databaseURL string) ([]Status, error) {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	p, err := provider(db, nil)
	if err != nil {
		return nil, err
	}
	statuses, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]Status, 0, len(statuses))
	for _, s := range statuses {
		st := Status{Version: s.Source.Version, Name: s.Source.Path, Applied: s.State == goose.StateApplied}
		if st.Applied {
			st.AppliedAt = sql.NullTime{Time: s.AppliedAt, Valid: true}
		}
		out = append(out, st)
	}
	return out, nil
}

// Latest is the newest migration this binary carries: the schema version its
// code reads and writes.
func Latest() int64 {
	names, _ := fs.Glob(files, "*.sql")
	var latest int64
	for _, m := range goMigrations {
		latest = max(latest, m.Version)
	}
	for _, name := range names {
		digits, _, _ := strings.Cut(name, "_")
		if v, err := strconv.ParseInt(digits, 10, 64); err == nil {
			latest = max(latest, v)
		}
	}
	return latest
}

// Querier runs one query: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Applied is the newest migration applied to the database; 0 when none is.
func Applied(ctx context.Context, db Querier) (int64, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var v int64
	err := db.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&v)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return 0, nil // dropped in between
	}
	return v, err
}
