package webhook

import "github.com/prometheus/client_golang/prometheus"

// Ended is spoolcast_webhook_deliveries_ended_total{state}.
func Ended(m *Metrics, state string) prometheus.Counter { return m.ended.WithLabelValues(state) }

// Pending is spoolcast_webhook_deliveries_pending{stage}.
func Pending(m *Metrics, stage string) prometheus.Gauge { return m.pending.WithLabelValues(stage) }
