package lifecycle

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/metric"
)

// Metrics are maintenance's metrics.
type Metrics struct {
	passes      *prometheus.CounterVec
	keysExpired prometheus.Counter
	dropped     prometheus.Counter
	lockWaits   *prometheus.CounterVec
	lastPass    prometheus.Gauge
	lastTook    prometheus.Gauge

	mu         sync.Mutex
	partitions []Partition
	seenAt     time.Time
	clock      clock.Clock // the clock of the pass that saw them
	count      *prometheus.Desc
	oldestAge  *prometheus.Desc
	ahead      *prometheus.Desc
}

// NewMetrics creates maintenance's metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		passes: metric.CounterVec("spoolcast_maintenance_passes_total",
			"Maintenance passes by result: ran, skipped (another replica's pass held the lock), failed.", "result"),
		keysExpired: metric.Counter("spoolcast_maintenance_keys_expired_total",
			"Claimed keys deleted past the key window."),
		dropped: metric.Counter("spoolcast_maintenance_partitions_dropped_total",
			"Partitions dropped past retention."),
		lockWaits: metric.CounterVec("spoolcast_maintenance_ddl_lock_timeouts_total",
			"Maintenance DDL statements that gave up waiting for a lock another session held, by op: create (a partition ahead), detach, finalize (a detach left pending), drop. The next pass retries them.", "op"),
		lastPass: metric.Gauge("spoolcast_maintenance_last_pass_timestamp_seconds",
			"When this replica last ran a maintenance pass (unix seconds); 0 before the first."),
		lastTook: metric.Gauge("spoolcast_maintenance_last_pass_duration_seconds",
			"How long this replica's last maintenance pass took."),
		count:     prometheus.NewDesc("spoolcast_partitions", "Weekly partitions present, by table.", []string{"table"}, nil),
		oldestAge: prometheus.NewDesc("spoolcast_partition_oldest_age_seconds", "Age of the oldest partition's start, by table: about the retention kept.", []string{"table"}, nil),
		ahead:     prometheus.NewDesc("spoolcast_partition_ahead_seconds", "Time until the end of the newest partition, by table; below a week, partitions are not being created ahead.", []string{"table"}, nil),
	}
	for _, r := range []string{"ran", "skipped", "failed"} {
		m.passes.WithLabelValues(r)
	}
	for _, op := range []string{OpCreate, OpDetach, OpFinalize, OpDrop, OpAnalyze} {
		m.lockWaits.WithLabelValues(op)
	}
	if reg != nil {
		reg.MustRegister(m.passes, m.keysExpired, m.dropped, m.lockWaits, m.lastPass, m.lastTook, m)
	}
	return m
}

func (m *Metrics) observe(rep Report, err error, clk clock.Clock) {
	now := clk.Now()
	for _, t := range rep.LockTimeouts {
		m.lockWaits.WithLabelValues(t.Op).Inc()
	}
	switch {
	case err != nil:
		m.passes.WithLabelValues("failed").Inc()
	case !rep.Ran:
		m.passes.WithLabelValues("skipped").Inc()
	default:
		m.passes.WithLabelValues("ran").Inc()
		m.keysExpired.Add(float64(rep.KeysExpired))
		m.dropped.Add(float64(len(rep.Dropped)))
		m.lastPass.Set(float64(now.Unix()))
		m.lastTook.Set(rep.Took.Seconds())
	}
	if rep.Partitions != nil {
		m.observePartitions(rep.Partitions, clk)
	}
}

// observePartitions keeps the partitions present as of now on clk, for Collect.
func (m *Metrics) observePartitions(parts []Partition, clk clock.Clock) {
	m.mu.Lock()
	m.partitions, m.seenAt, m.clock = parts, clk.Now(), clk
	m.mu.Unlock()
}

// LockTimeouts is the counter of DDL lock timeouts of op, for tests.
func (m *Metrics) LockTimeouts(op string) prometheus.Counter { return m.lockWaits.WithLabelValues(op) }

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.count
	ch <- m.oldestAge
	ch <- m.ahead
}

// Collect implements prometheus.Collector: the partitions as the last pass
// (or skipped pass) saw them, aged to now. No query per scrape.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	parts, seen, clk := m.partitions, m.seenAt, m.clock
	m.mu.Unlock()
	if seen.IsZero() {
		return
	}
	now := clk.Now()
	for _, table := range Partitioned {
		var n int
		var oldest, newestEnd time.Time
		for _, p := range parts {
			if p.Table != table {
				continue
			}
			n++
			if oldest.IsZero() || p.Start.Before(oldest) {
				oldest = p.Start
			}
			if p.End.After(newestEnd) {
				newestEnd = p.End
			}
		}
		ch <- prometheus.MustNewConstMetric(m.count, prometheus.GaugeValue, float64(n), table)
		if n > 0 {
			ch <- prometheus.MustNewConstMetric(m.oldestAge, prometheus.GaugeValue, now.Sub(oldest).Seconds(), table)
			ch <- prometheus.MustNewConstMetric(m.ahead, prometheus.GaugeValue, newestEnd.Sub(now).Seconds(), table)
		}
	}
}
