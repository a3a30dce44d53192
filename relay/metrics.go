package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/spool"
)

// Request outcomes, the values of the outcome label.
const (
	OutcomeAccepted     = "accepted"
	OutcomeDuplicate    = "duplicate"
	OutcomeConflict     = "conflict"
	OutcomeInvalid      = "invalid"
	OutcomeUnauthorized = "unauthorized"
	OutcomeOverloaded   = "overloaded"
	OutcomeError        = "error"    // the spool could not be written
	OutcomeCanceled     = "canceled" // the producer hung up before the answer
)

// Metrics are the relay's request metrics.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics registers the relay's request metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spoolcast_relay_requests_total",
			Help: "Ingest requests by outcome: accepted, duplicate, conflict, invalid, unauthorized, overloaded, error (spool write failed), canceled (producer hung up).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "spoolcast_relay_request_duration_seconds",
			Help:    "Time from reading an ingest request to answering it, by outcome.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"outcome"}),
	}
	for _, o := range []string{OutcomeAccepted, OutcomeDuplicate, OutcomeConflict, OutcomeInvalid, OutcomeUnauthorized, OutcomeOverloaded, OutcomeError, OutcomeCanceled} {
		m.requests.WithLabelValues(o)
		m.duration.WithLabelValues(o)
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

func (m *Metrics) observe(outcome string, took time.Duration) {
	m.requests.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(took.Seconds())
}

// SpoolStatser is what the spool collector reads on each scrape.
type SpoolStatser interface {
	Stats(ctx context.Context) (spool.Stats, error)
}

// SpoolMetrics exports the spool's depth, lag and size (read at scrape time) and
// its group-commit sizes and durations (observed by ObserveCommit).
type SpoolMetrics struct {
	spool       SpoolStatser
	log         *slog.Logger
	pending     *prometheus.Desc
	oldestAge   *prometheus.Desc
	bytes       *prometheus.Desc
	usedBytes   *prometheus.Desc
	batchSize   prometheus.Histogram
	commitTaken prometheus.Histogram
}

// NewSpoolMetrics registers the spool metrics with reg. Call SetSpool once the
// spool is open; until then the gauges are absent.
func NewSpoolMetrics(reg prometheus.Registerer, log *slog.Logger) *SpoolMetrics {
	m := &SpoolMetrics{
		log:       log,
		pending:   prometheus.NewDesc("spoolcast_spool_pending", "Rows in the spool not yet forwarded to Postgres.", nil, nil),
		oldestAge: prometheus.NewDesc("spoolcast_spool_oldest_pending_age_seconds", "Age of the oldest row not yet forwarded; 0 when none is pending.", nil, nil),
		bytes:     prometheus.NewDesc("spoolcast_spool_bytes", "Size of the spool's database file and WAL on disk.", nil, nil),
		usedBytes: prometheus.NewDesc("spoolcast_spool_used_bytes", "Live data in the spool, the measure --spool-max-bytes limits; pages freed by pruning are reused.", nil, nil),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spoolcast_spool_commit_batch_size",
			Help:    "Writes carried by one spool transaction (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		commitTaken: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spoolcast_spool_commit_duration_seconds",
			Help:    "Time of one spool transaction, fsync included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
	}
	reg.MustRegister(m, m.batchSize, m.commitTaken)
	return m
}

// SetSpool sets the spool whose stats are exported.
func (m *SpoolMetrics) SetSpool(s SpoolStatser) { m.spool = s }

// ObserveCommit records one group commit; it fits spool.Config.OnCommit.
func (m *SpoolMetrics) ObserveCommit(writes int, took time.Duration) {
	m.batchSize.Observe(float64(writes))
	m.commitTaken.Observe(took.Seconds())
}

// Describe implements prometheus.Collector.
func (m *SpoolMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.pending
	ch <- m.oldestAge
	ch <- m.bytes
	ch <- m.usedBytes
}

// Collect implements prometheus.Collector.
func (m *SpoolMetrics) Collect(ch chan<- prometheus.Metric) {
	if m.spool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := m.spool.Stats(ctx)
	if err != nil {
		m.log.Warn("read spool stats for metrics", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(m.pending, prometheus.GaugeValue, float64(st.Pending))
	ch <- prometheus.MustNewConstMetric(m.oldestAge, prometheus.GaugeValue, st.OldestPendingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(m.bytes, prometheus.GaugeValue, float64(st.FileBytes))
	ch <- prometheus.MustNewConstMetric(m.usedBytes, prometheus.GaugeValue, float64(st.UsedBytes))
}
