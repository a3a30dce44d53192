package topics_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

// gauge reads a gauge of reg by name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// A fan-out no replica writes (--topic-fanout-workers 0 everywhere) shows
// as stalled on a replica that only watches, from when it became due; an
// event a relay held for hours is behind from when it reached central, not
// from when the relay received it.
func TestAFanoutNoReplicaWritesShowsStalled(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	addMembers(t, pool, "watched", users("w", 10))
	ev := topicEvent(t, "held-1", nil, []string{"watched"}, "")
	if _, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "news", Event: ev, ReceivedAt: time.Now().Add(-2 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	ingestOne(t, pool, topicEvent(t, "other-1", nil, []string{"watched"}, ""))
	clk := clock.NewFake(time.Now())
	reg := prometheus.NewRegistry()
	watcher := newFanout(t, pool, topics.FanoutConfig{Clock: clk, Metrics: topics.NewMetrics(reg), WatchOnly: true})
	if err := watcher.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if lag, stalled := gauge(t, reg, "spoolcast_topic_fanout_lag_seconds"), gauge(t, reg, "spoolcast_topic_fanout_stalled_seconds"); lag > 60 || stalled > 60 {
		t.Errorf("just ingested: lag %.0fs, stalled %.0fs; want both under a minute, though the relay received it 2 h ago", lag, stalled)
	}
	// The watcher runs its gauges alone: no worker.
	if n := topics.Loops(watcher); n != 1 {
		t.Errorf("a watch-only replica runs %d loops; want its gauges alone", n)
	}
	if n := topics.Loops(newFanout(t, pool, topics.FanoutConfig{Workers: 3})); n != 4 {
		t.Errorf("a replica with 3 workers runs %d loops; want the gauges and 3 workers", n)
	}
	clk.Advance(10 * time.Minute)
	if err := watcher.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if stalled := gauge(t, reg, "spoolcast_topic_fanout_stalled_seconds"); stalled < 590 {
		t.Errorf("10 minutes without a worker: stalled %.0fs; want about 600", stalled)
	}
	// A cancel writes no batch: the other fan-out is as stalled as before.
	if _, err := ingest.Cancel(ctx, pool, "news", "other-1", clk.Now()); err != nil {
		t.Fatal(err)
	}
	if err := watcher.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if stalled := gauge(t, reg, "spoolcast_topic_fanout_stalled_seconds"); stalled < 590 {
		t.Errorf("after a cancel of the other fan-out: stalled %.0fs; want still about 600", stalled)
	}
	if st := fanoutOf(t, pool, "held-1", "watched"); st.State != topics.StatePending {
		t.Errorf("the watch-only replica moved the fan-out: %+v", st)
	}
	// A worker writes it: nothing due, nothing stalled.
	if err := newFanout(t, pool, topics.FanoutConfig{}).Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := watcher.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if lag, stalled := gauge(t, reg, "spoolcast_topic_fanout_lag_seconds"), gauge(t, reg, "spoolcast_topic_fanout_stalled_seconds"); lag != 0 || stalled != 0 {
		t.Errorf("completed: lag %.0fs, stalled %.0fs; want 0", lag, stalled)
	}
}
