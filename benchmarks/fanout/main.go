// Command fanout measures a topic fan-out on this machine: one event to a
// topic of a million members written by topics.Fanout instances (replicas)
// sharing it, against the same rows written by one set-based statement, and
// what it does to direct events' latency meanwhile.
//
//	go run ./benchmarks/fanout                    # 1,000,000 members
//	go run ./benchmarks/fanout -members 50000     # a quick check
//
// It starts a durable Postgres cluster of its own, migrates it and fills
// the topic through the topics store, then runs, with a CHECKPOINT and a
// VACUUM ANALYZE between phases so that each starts alike:
//
//  1. the fill of the topic;
//  2. direct events alone (one recipient each, open loop at -direct-rate a
//     second for 10 s): the baseline of their latency and WAL;
//  3. one topic event fanned out by -workers Fanout instances (Workers: 1
//     each, as replicas would), the same direct load alongside;
//  4. the same rows for a second event in ONE statement, with nothing
//     alongside: the raw cost of the writes, without ranges, batches,
//     pacing or progress;
//  5. a maintenance pass (one that creates partitions, i.e. DDL) during a
//     second fan-out, which is then cancelled;
//  6. 10 million members on paper, from the figures measured.
//
// Direct latency is open loop: each event has a due time on a fixed
// schedule and its latency runs from that due time to Ingest's return (its
// commit), so a slow commit delays none of the due times behind it and the
// queueing it causes is counted.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/benchmarks/internal/benchfmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/topics"
)

const (
	topic    = "everyone"
	producer = "bench"
	// directSenders is how many goroutines send the direct events due: a
	// few, so that one slow commit does not hold the others' due times.
	directSenders = 8
	// baselineFor is how long direct events run alone.
	baselineFor = 10 * time.Second
	// stepPause is how long an instance that found no work (or failed)
	// waits before looking again, standing in for its interval.
	stepPause = 20 * time.Millisecond
	// maxFailures is how many Steps in a row may fail before the run
	// stops: a replica retries a failed batch, but not forever here.
	maxFailures = 50
)

func main() {
	members := flag.Int("members", 1_000_000, "members of the topic")
	workers := flag.Int("workers", 2, "topics.Fanout instances (Workers: 1 each), as replicas")
	batch := flag.Int("batch", topics.DefaultBatchSize, "members a fan-out batch writes")
	rate := flag.Int("direct-rate", 100, "direct events a second offered meanwhile")
	keep := flag.Bool("keep", false, "keep the cluster's directory")
	flag.Parse()
	if *members < 1 || *workers < 1 || *batch < 1 || *rate < 1 {
		fmt.Fprintln(os.Stderr, "fanout: want -members, -workers, -batch and -direct-rate ≥ 1")
		os.Exit(2)
	}
	b := &bench{members: *members, workers: *workers, batch: *batch, rate: *rate}
	if err := b.run(context.Background(), *keep); err != nil {
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

type bench struct {
	members, workers, batch, rate int
	cluster                       *pgcluster.Cluster
	pool                          *pgxpool.Pool
	store                         *topics.Store
}

func member(i int) string { return fmt.Sprintf("user-%08d", i) }

func (b *bench) run(ctx context.Context, keep bool) error {
	dir, err := os.MkdirTemp("", "spoolcast-fanout-")
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	if keep {
		fmt.Println("fanout: cluster kept in", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b.cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg"), Durable: true})
	if err != nil {
		return err
	}
	defer b.cluster.Stop()
	if _, err := migrations.Up(ctx, b.cluster.URL, nil); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(b.cluster.URL)
	if err != nil {
		return err
	}
	// Each instance holds two connections while it writes a batch (its
	// transaction, and the pace's statement beside it), the direct senders
	// one each, maintenance two; the rest is for the monitor's polls. None
	// of the figures should include waiting for the pool.
	cfg.MaxConns = int32(2*b.workers + directSenders + 4)
	b.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.pool.Close()
	b.store = topics.NewStore(b.pool)

	fmt.Printf("fanout: %s members, %d Fanout instances (Workers: 1 each), batches of %d, %d direct events/s offered; %s\n\n",
		commas(int64(b.members)), b.workers, b.batch, b.rate, b.version(ctx))

	if err := b.fill(ctx); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	base, err := b.baseline(ctx)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fo, err := b.fanout(ctx, base)
	if err != nil {
		return fmt.Errorf("fan-out: %w", err)
	}
	raw, err := b.raw(ctx, fo)
	if err != nil {
		return fmt.Errorf("raw baseline: %w", err)
	}
	if err := b.maintenance(ctx, base); err != nil {
		return fmt.Errorf("maintenance: %w", err)
	}
	b.onPaper(fo, raw)
	return nil
}

// settle makes the next phase start as this one did: no dirty pages of
// this phase left for a checkpoint in the next to write, fresh statistics
// and visibility, nothing for autovacuum to catch up on. (A phase's own
// WAL still triggers checkpoints past max_wal_size: see walNote.)
func (b *bench) settle(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE`)
	return err
}

// sizes prints the tables' size a row after the fan-out, for sizing disks.
func (b *bench) sizes(ctx context.Context) error {
	var parts []string
	for _, t := range []string{"notifications", "push_queue", "idempotency_keys"} {
		var size, rows int64
		// A partitioned table's own size is 0: sum its partitions. (A
		// plain table has no partition tree: its own size.)
		if err := b.pool.QueryRow(ctx, `SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass)),
				pg_total_relation_size($1::regclass))::int8`, t).Scan(&size); err != nil {
			return err
		}
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+t).Scan(&rows); err != nil {
			return err
		}
		parts = append(parts, fmt.Sprintf("%s %.0f B", t, float64(size)/float64(max(rows, 1))))
	}
	fmt.Printf("   on disk a row, with indexes: %s\n", strings.Join(parts, ", "))
	return nil
}

func (b *bench) lsn(ctx context.Context) (string, error) {
	var lsn string
	err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walSince is the WAL written since lsn, by everything (autovacuum and
// checkpoints' full-page images included).
func (b *bench) walSince(ctx context.Context, lsn string) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::int8`, lsn).Scan(&n)
	return n, err
}

// walCounters are the checkpoints so far and the full-page images written
// to the WAL: a checkpoint in a phase makes the next change of every page
// write the whole page. The images are counted as backends report them,
// which may lag by seconds.
func (b *bench) walCounters(ctx context.Context) (checkpoints, images int64, err error) {
	if err := b.pool.QueryRow(ctx, `SELECT wal_fpi FROM pg_stat_wal`).Scan(&images); err != nil {
		return 0, 0, err
	}
	err = b.pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&checkpoints)
	if err != nil { // Postgres 17 moved them
		err = b.pool.QueryRow(ctx, `SELECT num_timed + num_requested FROM pg_stat_checkpointer`).Scan(&checkpoints)
	}
	return checkpoints, images, err
}

// walNote says how many checkpoints and full-page images a phase's WAL
// holds, since the marks taken at its start.
func (b *bench) walNote(ctx context.Context, checkpoints, images, wal int64) (string, error) {
	c, i, err := b.walCounters(ctx)
	if err != nil {
		return "", err
	}
	c, i = c-checkpoints, i-images
	return fmt.Sprintf("%d checkpoints, ≈%s full-page images (at most %.0f%% of the WAL)", c, commas(i),
		100*float64(i*8192)/float64(max(wal, 1))), nil
}

func (b *bench) version(ctx context.Context) string {
	var v string
	if err := b.pool.QueryRow(ctx, `SHOW server_version`).Scan(&v); err != nil {
		return "Postgres"
	}
	return "Postgres " + v
}

func ok(good bool) string {
	if good {
		return "✓"
	}
	return "✗"
}

func mib(n int64) string { return fmt.Sprintf("%.0f", float64(n)/(1<<20)) }

// commas writes n with thousands separators.
func commas(n int64) string { return benchfmt.Commas(n) }
