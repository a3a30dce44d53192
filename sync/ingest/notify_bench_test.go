package ingest_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/pgcluster"
)

// BenchmarkNotifyingCommits measures what a NOTIFY costs committing writers:
// 16 writers each commit one-row transactions that either notify, do not, or
// leave the wake-up to a separate transaction that commits asynchronously.
// A notifying commit holds a database-wide lock until its commit record is
// flushed, so notifying writers commit one at a time.
func BenchmarkNotifyingCommits(b *testing.B) {
	const writers = 16
	if _, err := pgcluster.FindBinaries(); err != nil {
		b.Skip(err)
	}
	ctx := context.Background()
	// A durable cluster of its own: the test cluster runs without fsync,
	// which hides what a commit waits for.
	dir, err := os.MkdirTemp("", "spoolcast-notify-bench-")
	if err != nil {
		b.Fatal(err)
	}
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: dir, Durable: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Stop(); _ = os.RemoveAll(dir) })
	cfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 2 * writers
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS notify_bench (id bigint GENERATED ALWAYS AS IDENTITY, v text)`); err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name  string
		write func(ctx context.Context, pool *pgxpool.Pool) error
	}{
		{"no_notify", func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, `INSERT INTO notify_bench (v) VALUES ('x')`)
			return err
		}},
		{"notify_in_transaction", func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, `WITH i AS (INSERT INTO notify_bench (v) VALUES ('x') RETURNING 1) SELECT pg_notify('notify_bench', '') FROM i`)
			return err
		}},
		{"notify_after_commit_async", func(ctx context.Context, pool *pgxpool.Pool) error {
			if _, err := pool.Exec(ctx, `INSERT INTO notify_bench (v) VALUES ('x')`); err != nil {
				return err
			}
			_, err := pool.Exec(ctx, `SELECT set_config('synchronous_commit', 'off', true), pg_notify('notify_bench', '')`)
			return err
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.SetParallelism((writers + 1) / 2)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := c.write(ctx, pool); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
		})
	}
}
