package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestReplicasMigratingTogetherApplyEachMigrationOnce(t *testing.T) {
	url := pgtest.EmptyDB(t)
	ctx := context.Background()
	before, err := migrations.List(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) < 3 {
		t.Fatalf("%d migrations embedded, want at least 3", len(before))
	}
	for _, m := range before {
		if m.Applied {
			t.Fatalf("migration %d applied on an empty database", m.Version)
		}
	}
	var wg sync.WaitGroup
	applied := make([][]int64, 4)
	for i := range applied {
		wg.Go(func() {
			var err error
			if applied[i], err = migrations.Up(ctx, url, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	total := 0
	for _, a := range applied {
		total += len(a)
	}
	if total != len(before) {
		t.Errorf("four replicas applied %d migrations in all, want each of the %d once", total, len(before))
	}
	after, err := migrations.List(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range after {
		if !m.Applied || !m.AppliedAt.Valid {
			t.Errorf("migration %d (%s) not applied", m.Version, m.Name)
		}
	}
	if again, err := migrations.Up(ctx, url, nil); err != nil || len(again) != 0 {
		t.Errorf("a second up applied %v, %v; want nothing", again, err)
	}
}

// Migration 7 builds the resume index partition by partition; every
// partition present, with rows, ends with a valid index attached to the
// parent's, and partitions made later get it too.
func TestTheCommitOrderIndexCoversEveryPartitionAndIsValid(t *testing.T) {
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', now() + interval '70 days')`); err != nil {
		t.Fatal(err)
	}
	var valid bool
	var parts, indexed int
	err := pool.QueryRow(ctx, `SELECT i.indisvalid,
			(SELECT count(*) FROM pg_inherits WHERE inhparent = 'notifications'::regclass),
			(SELECT count(*) FROM pg_inherits WHERE inhparent = 'notifications_user_commit_order'::regclass)
		FROM pg_index i WHERE i.indexrelid = 'notifications_user_commit_order'::regclass`).Scan(&valid, &parts, &indexed)
	if err != nil {
		t.Fatal(err)
	}
	if !valid || parts == 0 || indexed != parts {
		t.Errorf("index valid %v, on %d of %d partitions; want valid on all", valid, indexed, parts)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'read_marks' AND column_name = 'snapshot'`); n != 1 {
		t.Errorf("read_marks.snapshot columns: %d, want 1", n)
	}
}
