package live

import (
	"sync/atomic"
	"time"

	"github.com/spoolcast/spoolcast/internal/metric"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// Metrics are the live stream's metrics.
type Metrics struct {
	connections prometheus.Gauge
	sse         prometheus.Gauge
	tickets     *prometheus.CounterVec
	frames      *prometheus.CounterVec
	slowClosed  prometheus.Counter
	catchUps    prometheus.Counter
	authFailed  prometheus.Counter
	lag         prometheus.Histogram
	reads       *prometheus.CounterVec
	refused     *prometheus.CounterVec
	heldGauge   prometheus.GaugeFunc
	heldSince   atomic.Int64                // unix nanos since committed rows wait for the horizon; 0 when none do
	clk         atomic.Pointer[clock.Clock] // the hub's, which sets heldSince; nil: the wall clock
}

// NewMetrics registers the live stream's metrics with reg; nil registers nowhere.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connections: metric.Gauge("spoolcast_ws_connections",
			"Open live streams on this replica: WebSockets and event streams (SSE) together."),
		sse: metric.Gauge("spoolcast_sse_connections",
			"Open live streams on this replica served as event streams (SSE); spoolcast_ws_connections counts them too."),
		tickets: metric.CounterVec("spoolcast_stream_tickets_total",
			"Stream tickets (for a browser's EventSource), by result: issued, redeemed, refused (used, expired or unknown).", "result"),
		frames: metric.CounterVec("spoolcast_ws_frames_sent_total",
			"Frames written to live streams (WebSockets and event streams), by type (notification; read, unread, archived, unarchived, seen; ready).", "type"),
		slowClosed: metric.Counter("spoolcast_ws_slow_closed_total",
			"Streams (WebSockets and event streams) closed because their peer stopped reading (a write timed out); their apps resume from their cursor."),
		catchUps: metric.Counter("spoolcast_ws_catchups_total",
			"Bursts larger than a stream's queue (WebSocket or event stream): the stream dropped live frames and caught up from Postgres at the pace it reads, without closing."),
		authFailed: metric.Counter("spoolcast_ws_auth_failures_total",
			"Stream handshakes (WebSocket or event stream) refused 401 for a missing, bad or expired token, or an event stream's used, expired or unknown ticket."),
		lag: metric.Histogram("spoolcast_live_notify_lag_seconds",
			"From a notification's ingest transaction (its created_at) to its frame written to a socket; live frames only, not resumed ones.", []float64{.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}),
		reads: metric.CounterVec("spoolcast_live_reads_total",
			"Reads of newly committed rows by this replica's live reader, by result (ok, error).", "result"),
		refused: metric.CounterVec("spoolcast_ws_refused_total",
			"Stream handshakes (WebSocket or event stream) refused for a limit, by which: user (--max-sockets-per-user, 429) or replica (--max-sockets, 503).", "limit"),
	}
	for _, r := range []string{"issued", "redeemed", "refused"} {
		m.tickets.WithLabelValues(r)
	}
	for _, l := range []string{"user", "replica"} {
		m.refused.WithLabelValues(l)
	}
	for _, k := range append(streamKinds, kindReady) {
		m.frames.WithLabelValues(k.label())
	}
	for _, r := range []string{"ok", "error"} {
		m.reads.WithLabelValues(r)
	}
	m.heldGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "spoolcast_live_held_seconds",
		Help: "How long committed notifications have waited behind an older transaction still running (0 when none wait). A long write transaction anywhere in the cluster delays every live frame.",
	}, func() float64 {
		since := m.heldSince.Load()
		if since == 0 {
			return 0
		}
		return clock.Since(m.clock(), time.Unix(0, since)).Seconds()
	})
	if reg != nil {
		reg.MustRegister(m.connections, m.sse, m.tickets, m.frames, m.slowClosed, m.catchUps, m.authFailed, m.lag, m.reads, m.refused, m.heldGauge)
	}
	return m
}

// setClock makes the held gauge tell time by the hub's clock.
func (m *Metrics) setClock(c clock.Clock) { m.clk.Store(&c) }

// clock is the hub's clock, or the wall clock before a hub has set it.
func (m *Metrics) clock() clock.Clock {
	if c := m.clk.Load(); c != nil {
		return *c
	}
	return clock.Real{}
}

// AuthFailed counts a handshake refused for its token.
func (m *Metrics) AuthFailed() { m.authFailed.Inc() }

func (m *Metrics) held(blocked bool, now time.Time) {
	if !blocked {
		m.heldSince.Store(0)
		return
	}
	m.heldSince.CompareAndSwap(0, now.UnixNano())
}

// Connections is spoolcast_ws_connections.
func (m *Metrics) Connections() prometheus.Gauge { return m.connections }

// SSEConnections is spoolcast_sse_connections.
func (m *Metrics) SSEConnections() prometheus.Gauge { return m.sse }

// Tickets is spoolcast_stream_tickets_total with result (issued, redeemed, refused).
func (m *Metrics) Tickets(result string) prometheus.Counter { return m.tickets.WithLabelValues(result) }

// CatchUps is spoolcast_ws_catchups_total.
func (m *Metrics) CatchUps() prometheus.Counter { return m.catchUps }

// SlowClosed is spoolcast_ws_slow_closed_total.
func (m *Metrics) SlowClosed() prometheus.Counter { return m.slowClosed }

// AuthFailures is spoolcast_ws_auth_failures_total.
func (m *Metrics) AuthFailures() prometheus.Counter { return m.authFailed }

// Held is spoolcast_live_held_seconds.
func (m *Metrics) Held() prometheus.GaugeFunc { return m.heldGauge }
