package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/spoolcast/spoolcast/internal/metric"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
)

// The outcome label's values besides the three event outcomes (accepted,
// duplicate, conflict): why a request was not taken.
const (
	resultInvalid      = "invalid"
	resultUnauthorized = "unauthorized"
	resultOverloaded   = "overloaded" // spool at its limit, shutting down, or a claim that timed out
	resultDiskFull     = "disk_full"
	resultError        = "error" // the spool could not be written
)

// metrics are the relay's request metrics.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// newMetrics registers the relay's request metrics with reg.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: metric.CounterVec("spoolcast_relay_requests_total",
			"Ingest requests by outcome: accepted, duplicate, conflict, invalid, unauthorized, overloaded (503: spool at its limit, shutting down or slow), disk_full (503), error (spool write failed).", "outcome"),
		duration: metric.HistogramVec("spoolcast_relay_request_duration_seconds",
			"Time from reading an ingest request to answering it, by outcome.", []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, "outcome"),
	}
	for _, o := range []string{event.Accepted.String(), event.Duplicate.String(), event.Conflict.String(), resultInvalid, resultUnauthorized, resultOverloaded, resultDiskFull, resultError} {
		m.requests.WithLabelValues(o)
		m.duration.WithLabelValues(o)
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

func (m *metrics) observe(outcome string, took time.Duration) {
	m.requests.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(took.Seconds())
}

// SpoolStatser is what the spool collector reads on each scrape.
type SpoolStatser interface {
	Stats(ctx context.Context) (spool.Stats, error)
	DiskFull() bool
}

// SpoolMetrics exports the spool's depth, lag and size (read at scrape time,
// at the same cost whatever the spool holds) and its group-commit sizes and
// durations (observed by ObserveCommit).
type SpoolMetrics struct {
	spool        SpoolStatser
	maxBytes     int64
	log          *slog.Logger
	pending      *prometheus.Desc
	pendingBytes *prometheus.Desc
	maxBytesDesc *prometheus.Desc
	oldestAge    *prometheus.Desc
	keptKeys     *prometheus.Desc
	refeedBytes  *prometheus.Desc
	dead         *prometheus.Desc
	deadBytes    *prometheus.Desc
	fileBytes    *prometheus.Desc
	diskFull     *prometheus.Desc
	unmerged     *prometheus.Desc
	filterBytes  *prometheus.Desc
	batchSize    prometheus.Histogram
	commitTaken  prometheus.Histogram
}

// NewSpoolMetrics registers the spool metrics with reg. Call SetSpool once the
// spool is open; until then the gauges are absent.
func NewSpoolMetrics(reg prometheus.Registerer, log *slog.Logger) *SpoolMetrics {
	m := &SpoolMetrics{
		log:          log,
		pending:      prometheus.NewDesc("spoolcast_spool_pending", "Events in the spool not yet forwarded to Postgres.", nil, nil),
		pendingBytes: prometheus.NewDesc("spoolcast_spool_pending_bytes", "Payload bytes of the events not yet forwarded, the measure --spool-max-bytes limits.", nil, nil),
		maxBytesDesc: prometheus.NewDesc("spoolcast_spool_max_bytes", "The spool's limit on pending bytes (--spool-max-bytes).", nil, nil),
		oldestAge:    prometheus.NewDesc("spoolcast_spool_oldest_pending_age_seconds", "Age of the oldest event not yet forwarded; 0 when none is pending.", nil, nil),
		keptKeys:     prometheus.NewDesc("spoolcast_spool_kept_keys", "Forwarded keys kept to answer retries until --key-ttl.", nil, nil),
		refeedBytes:  prometheus.NewDesc("spoolcast_spool_refeed_bytes", "Payload bytes of forwarded events kept for --refeed-window, to be forwarded again after a failover of Postgres; at most --refeed-max-bytes.", nil, nil),
		dead:         prometheus.NewDesc("spoolcast_spool_dead", "Dead rows: events Postgres refused for good or found in conflict, kept for --dead-ttl.", nil, nil),
		deadBytes:    prometheus.NewDesc("spoolcast_spool_dead_bytes", "Payload bytes of dead rows.", nil, nil),
		fileBytes:    prometheus.NewDesc("spoolcast_spool_bytes", "Size of the spool's database file, its key index file and their WALs on disk.", nil, nil),
		diskFull:     prometheus.NewDesc("spoolcast_spool_disk_full", "1 while the spool's last write found its disk full (new events get 503), else 0.", nil, nil),
		unmerged:     prometheus.NewDesc("spoolcast_spool_unmerged_keys", "Claimed keys the spool's writer holds in memory, not yet merged into the key index file; new events get 503 past 8 merge batches of them.", nil, nil),
		filterBytes:  prometheus.NewDesc("spoolcast_spool_key_filter_bytes", "Memory of the Bloom filters before the spool's key index file, about 2 bytes per kept key.", nil, nil),
		batchSize: metric.Histogram("spoolcast_spool_commit_batch_size",
			"Writes carried by one spool transaction (group commit).", prometheus.ExponentialBuckets(1, 2, 11)),
		commitTaken: metric.Histogram("spoolcast_spool_commit_duration_seconds",
			"Time of one spool transaction, fsync included.", []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}),
	}
	reg.MustRegister(m, m.batchSize, m.commitTaken)
	return m
}

// SetSpool sets the spool whose stats are exported, and its byte limit.
func (m *SpoolMetrics) SetSpool(s SpoolStatser, maxBytes int64) { m.spool, m.maxBytes = s, maxBytes }

// ObserveCommit records one group commit; it fits spool.Config.OnCommit.
func (m *SpoolMetrics) ObserveCommit(writes int, took time.Duration) {
	m.batchSize.Observe(float64(writes))
	m.commitTaken.Observe(took.Seconds())
}

// Describe implements prometheus.Collector.
func (m *SpoolMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.pending, m.pendingBytes, m.maxBytesDesc, m.oldestAge, m.keptKeys, m.refeedBytes, m.dead, m.deadBytes, m.fileBytes, m.diskFull, m.unmerged, m.filterBytes} {
		ch <- d
	}
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
	diskFull := 0.0
	if m.spool.DiskFull() {
		diskFull = 1
	}
	for _, v := range []struct {
		d *prometheus.Desc
		v float64
	}{
		{m.pending, float64(st.Pending)},
		{m.unmerged, float64(st.UnmergedKeys)},
		{m.filterBytes, float64(st.KeyFilterBytes)},
		{m.pendingBytes, float64(st.PendingBytes)},
		{m.maxBytesDesc, float64(m.maxBytes)},
		{m.oldestAge, st.OldestPendingAge.Seconds()},
		{m.keptKeys, float64(st.KeptKeys)},
		{m.refeedBytes, float64(st.RefeedBytes)},
		{m.dead, float64(st.Dead)},
		{m.deadBytes, float64(st.DeadBytes)},
		{m.fileBytes, float64(st.FileBytes)},
		{m.diskFull, diskFull},
	} {
		ch <- prometheus.MustNewConstMetric(v.d, prometheus.GaugeValue, v.v)
	}
}
