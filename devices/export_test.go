package devices

import "github.com/prometheus/client_golang/prometheus"

// TokensDisabled is spoolcast_tokens_disabled_total for reason.
func (m *Metrics) TokensDisabled(reason string) prometheus.Counter {
	return m.tokensDisabled.WithLabelValues(reason)
}
