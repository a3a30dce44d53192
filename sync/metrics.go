package sync

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/spool"
)

// Metrics are the forwarder's metrics.
type Metrics struct {
	forwarded  prometheus.Counter
	duplicates prometheus.Counter
	conflicts  prometheus.Counter
	errors     prometheus.Counter
	dead       prometheus.Counter
	batch      prometheus.Histogram
	lag        prometheus.Histogram
}

// NewMetrics creates the forwarder's metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spoolcast_sync_forwarded_total",
			Help: "Spooled events committed to Postgres and acknowledged, whatever their outcome.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spoolcast_sync_duplicates_total",
			Help: "Forwarded events whose keys Postgres already had (a re-sent batch, or the same key through another relay).",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spoolcast_sync_conflicts_total",
			Help: "Forwarded events whose key Postgres had for a different request; nothing was written for them.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spoolcast_sync_errors_total",
			Help: "Failed forwarding attempts; the batch stays in the spool and is retried with backoff.",
		}),
		dead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spoolcast_sync_dead_total",
			Help: "Spooled events Postgres refused for good; they are kept in the spool as dead for an operator.",
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spoolcast_sync_batch_duration_seconds",
			Help:    "Time to write one batch to Postgres, from reading its payloads to the commit.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spoolcast_sync_lag_seconds",
			Help:    "Time from the relay receiving an event to its Postgres commit.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}),
	}
	if reg != nil {
		reg.MustRegister(m.forwarded, m.duplicates, m.conflicts, m.errors, m.dead, m.batch, m.lag)
	}
	return m
}

func (m *Metrics) observeBatch(batch []spool.Record, results []Result, committed time.Time, took time.Duration) {
	m.batch.Observe(took.Seconds())
	m.forwarded.Add(float64(len(batch)))
	for i, r := range results {
		switch r.Outcome {
		case Duplicate:
			m.duplicates.Inc()
		case Conflict:
			m.conflicts.Inc()
		case New:
			m.lag.Observe(max(0, committed.Sub(batch[i].ReceivedAt)).Seconds())
		}
	}
}
