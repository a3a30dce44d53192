package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/lifecycle"
)

// Where passes run elsewhere (a CronJob), central still exports the
// partitions present, which the alert on partitions ahead reads, and runs
// no pass itself.
func TestAWatcherExportsThePartitionsAndRunsNoPass(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	pass(t, pool, time.Now()) // this week and four ahead, as a CronJob's pass would
	reg := prometheus.NewRegistry()
	w, err := lifecycle.NewWatcher(lifecycle.Config{DB: pool, Metrics: lifecycle.NewMetrics(reg)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	w.Start(context.Background())
	defer w.Stop(context.Background())
	testsignal.Eventually(t, "spoolcast_partition_ahead_seconds after the watcher's first look", 30*time.Second, func() bool {
		n, err := testutil.GatherAndCount(reg, "spoolcast_partition_ahead_seconds")
		return err == nil && n > 0
	})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "spoolcast_partition_ahead_seconds":
			// Four weeks ahead of this one: over four weeks to go.
			if v := f.GetMetric()[0].GetGauge().GetValue(); v < 4*7*86400 {
				t.Errorf("partition ahead = %.0f s; want over four weeks", v)
			}
		case "spoolcast_maintenance_passes_total":
			for _, m := range f.GetMetric() {
				if m.GetCounter().GetValue() != 0 {
					t.Errorf("the watcher counted a pass: %v", m)
				}
			}
		}
	}
}
