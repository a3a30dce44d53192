package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// An open loop against a handler far faster than the offered rate keeps up,
// with latencies near the handler's own.
func TestOpenLoopKeepsUpWithAFastTarget(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	p := openLoop(srv.URL, 16, 1000, 500*time.Millisecond, 2*time.Second)
	t.Logf("%+v", p)
	if !p.keptUp || p.p99 > 50*time.Millisecond {
		t.Fatalf("want kept up with p99 under 50ms, got %+v", p)
	}
}

// The plot is drawn from made-up curves without error.
func TestPlotCurves(t *testing.T) {
	out := t.TempDir() + "/latency.png"
	cfg := config{conns: 64, prefill: 300_000, plotDuration: 5 * time.Second, plotOut: out, plotNote: "test"}
	curves := []curve{
		{target: &target{name: "a"}, points: []ratePoint{{offered: 1000, achieved: 1000, p50: time.Millisecond, p99: 5 * time.Millisecond, keptUp: true}, {offered: 2000, achieved: 1990, p50: 2 * time.Millisecond, p99: 40 * time.Millisecond, keptUp: true}}},
		{target: &target{name: "b"}, points: []ratePoint{{offered: 1000, achieved: 600, keptUp: false}}},
	}
	if err := plotCurves(cfg, curves); err != nil {
		t.Fatal(err)
	}
}
