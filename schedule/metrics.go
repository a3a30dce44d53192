package schedule

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/metric"
)

// Kinds of due work, the values of the metrics' kind label.
const (
	KindScheduled = "scheduled" // a notification with send_at
	KindDigest    = "digest"    // a digest's window
)

// Metrics are the firer's metrics.
type Metrics struct {
	queued   *prometheus.GaugeVec
	overdue  *prometheus.GaugeVec
	fired    *prometheus.CounterVec
	lateness *prometheus.HistogramVec
}

// NewMetrics creates the firer's metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		queued: metric.GaugeVec("spoolcast_due_work",
			"Due work waiting in Postgres by kind: scheduled (notifications before their send_at, cancelled ones until then) and digest (open digest windows).", "kind"),
		overdue: metric.GaugeVec("spoolcast_due_work_overdue_seconds",
			"How long the oldest due work past its time has waited, by kind; 0 when none is past its time.", "kind"),
		fired: metric.CounterVec("spoolcast_due_work_fired_total",
			"Due work fired, by kind: scheduled notifications created, digest pushes queued.", "kind"),
		lateness: metric.HistogramVec("spoolcast_due_work_lateness_seconds",
			"Per firing statement, how late its oldest row fired after its time, by kind.", []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}, "kind"),
	}
	for _, k := range []string{KindScheduled, KindDigest} {
		m.queued.WithLabelValues(k)
		m.overdue.WithLabelValues(k)
		m.fired.WithLabelValues(k)
		m.lateness.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.queued, m.overdue, m.fired, m.lateness)
	}
	return m
}
