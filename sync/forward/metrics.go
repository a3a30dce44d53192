package forward

import (
	"time"

	"github.com/spoolcast/spoolcast/internal/metric"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// Metrics are the forwarder's metrics.
type Metrics struct {
	forwarded  prometheus.Counter
	duplicates prometheus.Counter
	errors     prometheus.Counter
	dead       *prometheus.CounterVec
	batch      prometheus.Histogram
	batchRows  prometheus.Histogram
	lag        prometheus.Histogram
	refeeds    prometheus.Counter
	refed      prometheus.Counter
	cancels    *prometheus.CounterVec
}

// NewMetrics creates the forwarder's metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		forwarded: metric.Counter("spoolcast_sync_forwarded_total",
			"Spooled events committed to Postgres: new, or duplicates of events already there."),
		duplicates: metric.Counter("spoolcast_sync_duplicates_total",
			"Forwarded events whose keys Postgres already had (a re-sent batch, or the same key through another relay)."),
		errors: metric.Counter("spoolcast_sync_errors_total",
			"Failed forwarding attempts; the batch stays in the spool and is retried with backoff."),
		dead: metric.CounterVec("spoolcast_sync_dead_total",
			"Spooled events set aside as dead, by reason: invalid (the payload breaks a rule), refused (Postgres refuses it for good), conflict (Postgres holds the key for a different request). They stay in the spool for --dead-ttl.", "reason"),
		batch: metric.Histogram("spoolcast_sync_batch_duration_seconds",
			"Time to write one batch to Postgres, from reading its payloads to the commit.", []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}),
		batchRows: metric.Histogram("spoolcast_sync_batch_rows",
			"Notifications (recipient rows) sent in one ingest statement.", prometheus.ExponentialBuckets(1, 4, 8)),
		lag: metric.Histogram("spoolcast_sync_lag_seconds",
			"Time from the relay receiving an event to its Postgres commit.", []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}),
		refeeds: metric.Counter("spoolcast_sync_refeeds_total",
			"Changes of Postgres's history (a failover to a standby, a restore) the forwarder found after a commit; each forwards again what was forwarded within the refeed window."),
		refed: metric.Counter("spoolcast_sync_refed_events_total",
			"Events put back in the queue by refeeds, to be forwarded again; those Postgres still had count as duplicates."),
		cancels: metric.CounterVec("spoolcast_relay_cancels_total",
			"Cancellations (DELETE /v1/events/{key}) applied in Postgres, by outcome: cancelled (the scheduled notifications will not be sent; also a repeat), already_sent (the event had no send_at, or it fired first), unknown (no event with the key was ingested for the producer, or its key expired).", "outcome"),
	}
	for _, reason := range []string{deadInvalid, deadRefused, deadConflict} {
		m.dead.WithLabelValues(reason)
	}
	for _, o := range []ingest.CancelOutcome{ingest.Cancelled, ingest.CancelTooLate, ingest.CancelUnknown} {
		m.cancels.WithLabelValues(o.String())
	}
	if reg != nil {
		reg.MustRegister(m.forwarded, m.duplicates, m.errors, m.dead, m.batch, m.batchRows, m.lag, m.refeeds, m.refed, m.cancels)
	}
	return m
}

func (m *Metrics) observeBatch(batch []spool.Record, items []ingest.Item, results []ingest.Result, committed time.Time, took time.Duration) {
	m.batch.Observe(took.Seconds())
	rows := 0
	for _, it := range items {
		rows += len(it.Event.Recipients)
	}
	m.batchRows.Observe(float64(rows))
	for i, r := range results {
		switch r.Outcome {
		case event.Duplicate:
			m.forwarded.Inc()
			m.duplicates.Inc()
		case event.Accepted:
			m.forwarded.Inc()
			m.lag.Observe(max(0, committed.Sub(batch[i].ReceivedAt)).Seconds())
		}
	}
}
