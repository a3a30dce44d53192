package webhook

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/metric"
)

// Outcomes of an attempt, the values of the attempts metric's outcome label.
const (
	OutcomeDelivered = "delivered" // a 2xx within the timeout
	OutcomeRedirect  = "3xx"       // never followed
	OutcomeClient    = "4xx"
	OutcomeServer    = "5xx"
	OutcomeTimeout   = "timeout" // no answer in time: it may have arrived, so it is sent again
	OutcomeNetwork   = "network" // no connection, reset, TLS failure
	OutcomeRefused   = "refused" // the host resolved to a non-public address
)

var outcomes = []string{OutcomeDelivered, OutcomeRedirect, OutcomeClient, OutcomeServer, OutcomeTimeout, OutcomeNetwork, OutcomeRefused}

// Metrics are the deliverer's metrics.
type Metrics struct {
	attempts  *prometheus.CounterVec
	duration  prometheus.Histogram
	ended     *prometheus.CounterVec
	disabled  prometheus.Counter
	age       prometheus.Gauge
	pending   *prometheus.GaugeVec
	endpoints *prometheus.GaugeVec
}

// NewMetrics creates the deliverer's metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		attempts: metric.CounterVec("spoolcast_webhook_attempts_total",
			"Webhook delivery attempts by outcome: delivered (2xx), 3xx (never followed), 4xx, 5xx, timeout, network, refused (a non-public address).", "outcome"),
		duration: metric.Histogram("spoolcast_webhook_attempt_duration_seconds",
			"How long each webhook attempt took, to the answer's headers or the failure.", []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10}),
		ended: metric.CounterVec("spoolcast_webhook_deliveries_ended_total",
			"Webhook deliveries this replica ended, each once, by state: delivered, or failed (retries ran out, or the endpoint was disabled).", "state"),
		disabled: metric.Counter("spoolcast_webhook_endpoints_disabled_total",
			"Webhook endpoints disabled for failing every attempt for --webhook-disable-after, or for answering 410 Gone."),
		age: metric.Gauge("spoolcast_webhook_outbox_age_seconds",
			"How long the oldest webhook delivery not yet attempted has waited (0: none): whether the deliverers keep up."),
		pending: metric.GaugeVec("spoolcast_webhook_deliveries_pending",
			"Webhook deliveries not ended, by stage: new (no attempt ended yet) or retrying (an attempt failed).", "stage"),
		endpoints: metric.GaugeVec("spoolcast_webhook_endpoints",
			"Webhook endpoints by state: healthy, failing (no success since an attempt failed), disabled.", "state"),
	}
	for _, o := range outcomes {
		m.attempts.WithLabelValues(o)
	}
	for _, s := range []string{"delivered", "failed"} {
		m.ended.WithLabelValues(s)
	}
	for _, s := range []string{"new", "retrying"} {
		m.pending.WithLabelValues(s)
	}
	for _, s := range []string{"healthy", "failing", "disabled"} {
		m.endpoints.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(m.attempts, m.duration, m.ended, m.disabled, m.age, m.pending, m.endpoints)
	}
	return m
}
