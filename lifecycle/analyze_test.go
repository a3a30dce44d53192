package lifecycle_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

// A partition that filled since its statistics were taken is analyzed by
// the next pass, and the partitioned tables, which Postgres never analyzes
// by itself, once a day; a pass with nothing stale analyzes nothing.
func TestAPassAnalyzesPartitionsWhoseStatisticsLagAndThePartitionedTablesDaily(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	now := time.Now()
	part := weekly.Partition("notifications", now)
	pass(t, pool, now) // makes the week's partition
	if _, err := pool.Exec(ctx, `ALTER TABLE `+part+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err) // so that only the pass analyzes it
	}
	ingestEvents(t, pool, "stats", 1500) // 3,000 rows
	testsignal.Eventually(t, "the statistics to count the new rows", 10*time.Second, func() bool {
		return pgtest.Count(t, pool, `SELECT coalesce(max(n_live_tup), 0) FROM pg_stat_user_tables WHERE relname = '`+part+`'`) >= 3000
	})

	first := pass(t, pool, now)
	if !slices.Contains(first.Analyzed, part) {
		t.Errorf("the pass analyzed %v; want %s, filled since", first.Analyzed, part)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_user_tables WHERE relname = '`+part+`' AND last_analyze IS NOT NULL`); n != 1 {
		t.Errorf("%s has no manual analyze recorded", part)
	}
	if reltuples := pgtest.Count(t, pool, `SELECT reltuples::int FROM pg_class WHERE relname = '`+part+`'`); reltuples != 3000 {
		t.Errorf("the planner counts %d rows in %s; want 3000", reltuples, part)
	}
	second := pass(t, pool, now)
	if len(second.Analyzed) != 0 {
		t.Errorf("a second pass analyzed %v; want nothing (no change since, the partitioned tables analyzed today)", second.Analyzed)
	}
}
