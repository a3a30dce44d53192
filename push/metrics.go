package push

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/internal/metric"
	"github.com/spoolcast/spoolcast/push/policy"
)

// Metrics are push's metrics.
type Metrics struct {
	dispatches  *prometheus.GaugeVec
	sent        *prometheus.CounterVec
	receipts    *prometheus.CounterVec
	requestTook *prometheus.HistogramVec
	queueOldest prometheus.Gauge
	released    prometheus.Counter
	orphans     prometheus.Counter
	webBusy     prometheus.Counter
	policy      *prometheus.CounterVec
	webSent     *prometheus.CounterVec
	webTook     prometheus.Histogram
	clears      *prometheus.CounterVec
	channelSent *prometheus.CounterVec
	channelTook *prometheus.HistogramVec
	credentials *prometheus.CounterVec
	// refusalsHeld: device refusals not acted on, the provider refusing most devices.
	refusalsHeld *prometheus.CounterVec
}

// Results of a message sent, the values of spoolcast_push_sent_total's result label.
const (
	SentOK     = expo.ResultOK     // a ticket: Expo took it (its receipt says the rest)
	SentError  = expo.ResultError  // a ticket with an error (DeviceNotRegistered, …)
	SentFailed = expo.ResultFailed // Expo refused the request, or may have taken it without a usable answer
)

// NewMetrics creates push's metrics and registers them with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		dispatches: metric.GaugeVec("spoolcast_dispatches",
			"Dispatches by state: queued (written, not yet answered by Expo), sent (a ticket, awaiting its receipt, younger than 24 h), deferred (notifications whose push waits in the queue for quiet hours to end), and the delivery policies' digested, throttled, suppressed and cancelled of the last 24 h. Other final states are counted by spoolcast_push_sent_total and spoolcast_push_receipts_total.", "state"),
		sent: metric.CounterVec("spoolcast_push_sent_total",
			"Expo messages by result: ok (Expo gave a ticket), error (a ticket with an error), failed (Expo refused the request, or may have taken it without a usable answer). Clears are counted too. Requests Expo did not take are spoolcast_push_channel_sent_total{provider=\"expo\",outcome=\"retry_after\"}.", "result"),
		receipts: metric.CounterVec("spoolcast_push_receipts_total",
			"Receipts by status (ok, error, missing: none within 24 h) and Expo error code.", "status", "error"),
		requestTook: metric.HistogramVec("spoolcast_push_request_duration_seconds",
			"Expo API request time by endpoint (send, getReceipts), retries counted apart.", []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, "endpoint"),
		queueOldest: metric.Gauge("spoolcast_push_queue_oldest_seconds",
			"Age of the oldest notification waiting in the push queue; 0 when it is empty."),
		released: metric.Counter("spoolcast_push_released_total",
			"Notifications a stopping dispatcher gave back to the push queue unsent, for another replica to take at once."),
		orphans: metric.Counter("spoolcast_push_orphans_released_total",
			"Push queue rows given back because the pass that leased them had ended without its write surviving: Postgres lost writes it had acknowledged (a failover to an asynchronous standby, or a restore)."),
		webBusy: metric.Counter("spoolcast_webpush_busy_total",
			"Web Push dispatches given back to the push queue for a moment because their push service already had its share of this replica's sends in flight, or all of them were taken."),
		policy: metric.CounterVec("spoolcast_push_policy_total",
			"Notifications by delivery policy outcome: passed (no policy held the push), deferred (quiet hours), digested (joined a digest), digest (a digest's one push dispatched), throttled, suppressed (seen, or read or archived, before its push was due), critical (a critical push passed quiet hours or a throttle), cancelled (a scheduled notification cancelled), fail_open (quiet hours unreadable: pushed).", "outcome"),
		webSent: metric.CounterVec("spoolcast_webpush_sent_total",
			"Web Push messages, clears included, by outcome: delivered (the push service took it), gone (404/410: subscription disabled), rate_limited (429: sent again after Retry-After, once), too_large, rejected (4xx, VAPID refused), unavailable (500, 503: sent again), unknown (no answer, or a gateway's 502, 504 or another 5xx: not sent again), not_sent (given back to the queue), invalid.", "outcome"),
		clears: metric.CounterVec("spoolcast_push_clears_total",
			"Clears (a silent message naming notifications read or archived, so that the device takes their banners down), one per device and message, by provider (expo, webpush, apns, fcm) and result: sent (the provider took it), failed (refused, the device gone, or no answer: never sent again), retried (429, 5xx or not reached: sent again later), skipped (--push-clear-on-read off, past --push-max-age, the device disabled, its provider not set up on the replica, or a browser, which gets no clear).", "provider", "result"),
		channelSent: metric.CounterVec("spoolcast_push_channel_sent_total",
			"Pushes sent through the providers behind the channel shape (expo, webpush, apns, fcm), by provider and outcome: delivered (the provider took it), accepted (took it, a receipt to come), retry_after (not taken: sent again within the lease, or once later), token_gone (the device is gone: disabled), token_invalid (the provider refuses the token: disabled), token_foreign (another app's token, such as another Expo project's: disabled), unknown (no answer to a request that was written: not sent again), failed (refused for another reason), not_sent (the process was stopping: given back to the queue).", "provider", "outcome"),
		channelTook: metric.HistogramVec("spoolcast_push_channel_request_duration_seconds",
			"Time of one batch of pushes handed to a channel (expo, webpush, apns, fcm), to the last message's answer, by provider.", []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, "provider"),
		credentials: metric.CounterVec("spoolcast_push_credentials_refused_total",
			"Messages (pushes and clears) a provider refused because of this deployment's credentials or settings (an APNs 403 or a topic refused, an FCM 401 or 403 or SENDER_ID_MISMATCH, the OAuth token endpoint refusing the grant), by provider: the key, team, topic, project or service account is wrong or revoked. The device is never blamed.", "provider"),
		refusalsHeld: metric.CounterVec("spoolcast_push_refusals_held_total",
			"Messages (pushes and clears) whose device a provider refused (BadDeviceToken, DeviceTokenNotForTopic, SENDER_ID_MISMATCH, a browser's 401/403, Expo's MismatchSenderId) while it refused most of the last 16 distinct devices it answered within 10 minutes, and at least 4, by provider: a deployment setting is wrong (--apns-sandbox, --apns-topic, the Firebase project, the VAPID key), so no device is disabled and the push waits 10 minutes, once.", "provider"),
		webTook: metric.Histogram("spoolcast_webpush_request_duration_seconds",
			"Web Push request time, to the push service's answer or the failure.", []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}),
	}
	for _, p := range []string{ProviderExpo, ProviderWebPush} {
		for _, r := range []string{ClearSent, ClearFailed, ClearRetried, ClearSkipped} {
			m.clears.WithLabelValues(p, r)
		}
	}
	for _, o := range webOutcomes {
		m.webSent.WithLabelValues(o)
	}
	for _, o := range policy.Outcomes {
		m.policy.WithLabelValues(o)
	}
	for _, s := range []string{StateQueued, StateSent, StateDeferred, StateDigested, StateThrottled, StateSuppressed, StateCancelled} {
		m.dispatches.WithLabelValues(s)
	}
	for _, r := range []string{SentOK, SentError, SentFailed} {
		m.sent.WithLabelValues(r)
	}
	m.receipts.WithLabelValues("ok", "")
	for _, e := range []string{"send", "getReceipts"} {
		m.requestTook.WithLabelValues(e)
	}
	if reg != nil {
		reg.MustRegister(m.dispatches, m.sent, m.receipts, m.requestTook, m.queueOldest, m.released, m.orphans, m.webBusy, m.policy, m.webSent, m.webTook, m.clears, m.channelSent, m.channelTook, m.credentials, m.refusalsHeld)
	}
	return m
}

// initChannel exports the provider's series at zero.
func (m *Metrics) initChannel(provider string) {
	for _, k := range channel.Kinds() {
		m.channelSent.WithLabelValues(provider, k.String())
	}
	m.channelTook.WithLabelValues(provider)
	m.credentials.WithLabelValues(provider)
	m.refusalsHeld.WithLabelValues(provider)
	for _, r := range []string{ClearSent, ClearFailed, ClearRetried, ClearSkipped} {
		m.clears.WithLabelValues(provider, r)
	}
}

// ObserveRequest records one Expo request; it fits expo.Config.OnRequest.
func (m *Metrics) ObserveRequest(endpoint string, took float64) {
	m.requestTook.WithLabelValues(endpoint).Observe(took)
}

// CountPolicy counts n notifications with a policy outcome (such as
// policy.Cancelled, which ingress decides).
func (m *Metrics) CountPolicy(outcome string, n int) {
	m.policy.WithLabelValues(outcome).Add(float64(n))
}
