package central

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"

	"github.com/spoolcast/spoolcast/internal/metric"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/apiversion"
	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/httpapi"
)

type metrics struct {
	requests    *prometheus.CounterVec
	apiRequests *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	feedReads   *prometheus.CounterVec
	replicaLag  prometheus.Gauge
	limited     *prometheus.CounterVec
	clock       clock.Clock
}

func newMetrics(reg prometheus.Registerer, clk clock.Clock) *metrics {
	m := &metrics{
		clock: clk,
		requests: metric.CounterVec("spoolcast_central_requests_total",
			"Central API requests by route and status code.", "route", "code"),
		apiRequests: metric.CounterVec("spoolcast_api_requests_total",
			"Requests to versioned API routes by the API version served, route and status code: an old version's traffic, to watch before its sunset.", "version", "route", "code"),
		duration: metric.HistogramVec("spoolcast_central_request_duration_seconds",
			"Central API request time by route.", []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, "route"),
		feedReads: metric.CounterVec("spoolcast_feed_reads_total",
			"Feed reads (pages, unread counts, the delivery log) by the server that answered them, replica or primary, and why.", "target", "reason"),
		replicaLag: metric.Gauge("spoolcast_feed_replica_lag_seconds",
			"Age of the oldest primary WAL position the read replica had not replayed at its last measurement; 0 when current or without --database-read-url."),
		limited: metric.CounterVec("spoolcast_rate_limited_total",
			"Requests answered 429 for a rate limit, by which: user (--rate-limit-user) or ip (--rate-limit-ip, requests with a missing or bad token).", "limit"),
	}
	for _, l := range []string{"user", "ip"} {
		m.limited.WithLabelValues(l)
	}
	reg.MustRegister(m.requests, m.apiRequests, m.duration, m.feedReads, m.replicaLag, m.limited)
	return m
}

// tokenCacheStats is what a UserAuthorizer with a cache of verified tokens
// (auth.UserVerifier) reports of it.
type tokenCacheStats interface {
	TokenCacheStats() auth.TokenCacheStats
}

// registerTokenCache exports the counts of the user token cache, read at
// each scrape.
func registerTokenCache(reg prometheus.Registerer, c tokenCacheStats) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "spoolcast_token_cache_hits_total",
			Help: "User tokens answered from the cache of verified tokens, without their signature checked again."},
			func() float64 { return float64(c.TokenCacheStats().Hits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "spoolcast_token_cache_misses_total",
			Help: "User tokens checked in full (signature and claims) because the cache did not hold them, valid or not."},
			func() float64 { return float64(c.TokenCacheStats().Misses) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "spoolcast_token_cache_entries",
			Help: "Verified user tokens the cache holds now, up to its bound (10,000 unless configured otherwise)."},
			func() float64 { return float64(c.TokenCacheStats().Entries) }),
	)
}

// initFeedReads creates at 0 the series of where feed reads may go: with a
// read replica, every target and reason; without, the primary's only.
func (m *metrics) initFeedReads(replica bool) {
	if !replica {
		m.feedReads.WithLabelValues("primary", reasonNoReplica)
		return
	}
	for _, reason := range []string{reasonCurrent, reasonReplayed, reasonPrimaryDown} {
		m.feedReads.WithLabelValues("replica", reason)
	}
	for _, reason := range []string{reasonReplicaDown, reasonReplicaLagging, reasonUnreplayed, reasonReplicaFailed} {
		m.feedReads.WithLabelValues("primary", reason)
	}
}

// initialCodes are the codes whose series every route has from the start, so
// that a fresh deployment's panels and alerts read 0 rather than "no data":
// success, and the 5xx that the error alert (deploy/prometheus/rules.yaml,
// code=~"5..") selects and central answers: 500 (a handler that did not
// answer, or panicked) and 503 (Postgres unavailable, not ready).
var initialCodes = []string{"200", "500", "503"}

// successCodes are the codes other than 200 that routes succeed with.
var successCodes = map[string][]string{
	"DELETE /v1/devices/:token":       {"204"},
	"POST /v1/notifications/:id/read": {"204"},
	"POST /internal/v1/events":        {"202"},
	"GET /v1/stream":                  {"101"}, // a WebSocket; an event stream is 200
	"POST /v1/stream/tickets":         {"201"},
	"POST /v1/stream/seen":            {"204"},
}

// initSeries creates the route's series at 0: its duration, and its request
// counts for the initial codes, by every version when the route is versioned.
func (m *metrics) initSeries(route string, versions *apiversion.Registry) {
	m.duration.WithLabelValues(route)
	for _, code := range slices.Concat(initialCodes, successCodes[route]) {
		m.requests.WithLabelValues(route, code)
		if versions != nil {
			for _, v := range versions.Versions() {
				m.apiRequests.WithLabelValues(v.Date, route, code)
			}
		}
	}
}

func (m *metrics) instrument(route string, h http.Handler) http.Handler {
	return m.instrumentVersioned(route, nil, h)
}

// instrumentVersioned counts the route's requests, and with versions, also
// by the API version served. The route's series exist from its registration.
func (m *metrics) instrumentVersioned(route string, versions *apiversion.Registry, h http.Handler) http.Handler {
	m.initSeries(route, versions)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := m.clock.Now()
		rec := &httpapi.Recorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		code := strconv.Itoa(cmp.Or(rec.Status, http.StatusInternalServerError)) // unanswered: httpapi.Answered sends 500
		m.requests.WithLabelValues(route, code).Inc()
		if versions != nil {
			m.apiRequests.WithLabelValues(versions.Served(r), route, code).Inc()
		}
		m.duration.WithLabelValues(route).Observe(clock.Since(m.clock, start).Seconds())
	})
}
