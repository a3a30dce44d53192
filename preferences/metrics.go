package preferences

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/metric"
)

// Metrics are the preference sources' metrics.
type Metrics struct {
	lookups *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lookups: metric.CounterVec("spoolcast_prefs_lookups_total",
			"Preference lookups per user by result: hit, miss (the external service answered), fail_open (it failed: pushed anyway), builtin.", "result"),
	}
	for _, r := range []string{Hit, Miss, FailOpen, BuiltinRead} {
		m.lookups.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.lookups)
	}
	return m
}
