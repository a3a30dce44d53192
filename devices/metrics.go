package devices

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/metric"
)

// Metrics are the device store's metrics.
type Metrics struct {
	tokensDisabled *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		tokensDisabled: metric.CounterVec("spoolcast_tokens_disabled_total",
			"Push tokens disabled, by reason: device_not_registered (Expo), subscription_gone (a Web Push service answered 404 or 410), invalid_token (not a push token), user_request, replaced (the user registered one more than the cap of enabled devices), another_project (an Expo token of another Expo project than this app's).", "reason"),
	}
	for _, r := range []string{DisabledByUser, DisabledUnreachable, DisabledGone, DisabledInvalid, DisabledReplaced, DisabledForeign} {
		m.tokensDisabled.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.tokensDisabled)
	}
	return m
}
