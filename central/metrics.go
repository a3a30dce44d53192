package central

import (
	"cmp"
	"net/http"
	"strconv"

	"github.com/spoolcast/spoolcast/internal/metric"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/apiversion"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/httpapi"
)

type metrics struct {
	requests    *prometheus.CounterVec
	apiRequests *prometheus.CounterVec
	duration    *prometheus.HistogramVec
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
	}
	reg.MustRegister(m.requests, m.apiRequests, m.duration)
	return m
}

func (m *metrics) instrument(route string, h http.Handler) http.Handler {
	return m.instrumentVersioned(route, nil, h)
}

// instrumentVersioned counts the route's requests, and with versions, also
// by the API version served.
func (m *metrics) instrumentVersioned(route string, versions *apiversion.Registry, h http.Handler) http.Handler {
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
