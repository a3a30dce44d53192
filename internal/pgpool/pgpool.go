// Package pgpool opens the Postgres pools of the relay and central. Their
// statements keep no session state, so a pool may point at PgBouncer in
// transaction mode.
package pgpool

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// New opens a pool of at most maxConns connections to databaseURL. Unless the
// URL chooses its own default_query_exec_mode, statements run unnamed with
// their descriptions cached per connection: no named prepared statements,
// which PgBouncer before 1.21 (or with max_prepared_statements = 0) cannot
// carry between transactions.
func New(ctx context.Context, databaseURL string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if maxConns < 1 {
		return nil, fmt.Errorf("max connections %d: want at least 1", maxConns)
	}
	cfg.MaxConns = int32(maxConns)
	cfg.MinConns = 0
	if !strings.Contains(databaseURL, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	return pool, nil
}
