package lifecycle

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

// A pass that stopped between a partition's detach and its drop leaves a
// table of the partition's name, marked before the detach: the next pass
// drops it. A table of such a name that no pass detached is kept.
func TestATableAPassDetachedButDidNotDropIsDroppedByTheNextPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	old := time.Now().AddDate(0, 0, -140)
	name := weekly.Partition("notifications", old)
	if _, err := weekly.Ensure(ctx, pool, "notifications", old); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`COMMENT ON TABLE ` + name + ` IS '` + detachedComment + `'`,
		`ALTER TABLE notifications DETACH PARTITION ` + name + ` CONCURRENTLY`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exists := func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, name) == 1
	}
	cfg := Config{DB: pool, Retention: 90 * 24 * time.Hour}
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Dropped, name) || exists() {
		t.Errorf("the next pass dropped %v; want %s, detached, dropped", rep.Dropped, name)
	}

	if _, err := pool.Exec(ctx, `CREATE TABLE `+name+` (LIKE notifications)`); err != nil {
		t.Fatal(err)
	}
	if rep, err := Run(ctx, cfg); err != nil || len(rep.Dropped) != 0 || !exists() {
		t.Errorf("a pass dropped %v (%v); want the table no pass detached kept", rep.Dropped, err)
	}
}
