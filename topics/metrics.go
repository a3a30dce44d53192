package topics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/metric"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Metrics are the topic fan-out's metrics.
type Metrics struct {
	started   prometheus.Counter
	written   prometheus.Counter
	skipped   prometheus.Counter
	completed prometheus.Histogram
	open      *prometheus.GaugeVec
	left      prometheus.Gauge
	lag       prometheus.Gauge
	stalled   prometheus.Gauge
}

// NewMetrics creates the fan-out's metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		started: metric.Counter("spoolcast_topic_fanouts_started_total",
			"Topic fan-outs this replica started (split into ranges of members)."),
		written: metric.Counter("spoolcast_topic_fanout_members_written_total",
			"Topic members this replica wrote a notification for."),
		skipped: metric.Counter("spoolcast_topic_fanout_members_skipped_total",
			"Topic members this replica found had the event already (a recipient, a member of another of its topics, a batch written before a crash)."),
		completed: metric.Histogram("spoolcast_topic_fanout_duration_seconds",
			"Per fan-out this replica completed, seconds from when it was due (or ingested, if later) to its last member written.",
			[]float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600}),
		open: metric.GaugeVec("spoolcast_topic_fanouts",
			"Topic fan-outs not ended, by state: pending (before their send_at, or not yet started) and running.", "state"),
		left: metric.Gauge("spoolcast_topic_fanout_members_left",
			"Members the running fan-outs have still to write, estimated from their ranges (a range's members are counted when it starts)."),
		lag: metric.Gauge("spoolcast_topic_fanout_lag_seconds",
			"The longest any due fan-out not yet ended has waited (since it reached central, for an event a relay held); 0 when none is."),
		stalled: metric.Gauge("spoolcast_topic_fanout_stalled_seconds",
			"How long fan-out work has been due with no batch written by any replica: since the last batch, or since the oldest due fan-out not ended became due if later; 0 when none is due."),
	}
	for _, s := range []string{StatePending, StateRunning} {
		m.open.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(m.started, m.written, m.skipped, m.completed, m.open, m.left, m.lag, m.stalled)
	}
	return m
}

// gaugesInterval is how often the fan-out gauges are refreshed.
const gaugesInterval = 15 * time.Second

func (f *Fanout) gauges(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: gaugesInterval, Clock: f.cfg.Clock}, func(ctx context.Context) bool {
		_ = f.RefreshGauges(ctx)
		return false
	})
}

// RefreshGauges reads the fan-out gauges now.
func (f *Fanout) RefreshGauges(ctx context.Context) error {
	var pending, running int64
	var left, lag, stalled float64
	// due: since when the longest-waiting due fan-out not ended has been
	// due (an event a relay held, from its arrival at central); the lag is
	// the time since, and the stall the time since then or since the last
	// batch anywhere, whichever is later: fan-outs are written one after
	// another, so one waiting behind a large one that progresses is not
	// stalled, and one that no replica starts is. A cancel is no batch.
	err := f.cfg.DB.QueryRow(ctx, `WITH due AS (
			SELECT min(greatest(due_at, created_at)) AS since FROM topic_fanouts
			WHERE state IN ('pending', 'running') AND due_at <= greatest(now(), $1)
		)
		SELECT
			(SELECT count(*) FROM topic_fanouts WHERE state = 'pending'),
			(SELECT count(*) FROM topic_fanouts WHERE state = 'running'),
			coalesce((SELECT sum(greatest(0, r.members - r.written - r.skipped)) FROM topic_fanout_ranges r
			          JOIN topic_fanouts fo ON fo.id = r.fanout_id WHERE fo.state = 'running' AND NOT r.done), 0),
			coalesce(extract(epoch FROM greatest(now(), $1) - due.since), 0),
			-- greatest() skips NULLs: nothing due is no stall.
			CASE WHEN due.since IS NULL THEN 0 ELSE extract(epoch FROM greatest(now(), $1) - greatest(due.since,
			    (SELECT max(r.updated_at) FROM topic_fanouts fo JOIN topic_fanout_ranges r ON r.fanout_id = fo.id WHERE fo.state = 'running'),
			    (SELECT max(started_at) FROM topic_fanouts WHERE state = 'running'),
			    (SELECT max(ended_at) FROM topic_fanouts WHERE ended_at IS NOT NULL AND state = 'completed'))) END
		FROM due`,
		f.cfg.Clock.Now()).Scan(&pending, &running, &left, &lag, &stalled)
	if err != nil {
		return err
	}
	f.cfg.Metrics.open.WithLabelValues(StatePending).Set(float64(pending))
	f.cfg.Metrics.open.WithLabelValues(StateRunning).Set(float64(running))
	f.cfg.Metrics.left.Set(left)
	f.cfg.Metrics.lag.Set(max(0, lag))
	f.cfg.Metrics.stalled.Set(max(0, stalled))
	return nil
}
