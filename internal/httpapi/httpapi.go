// Package httpapi is the HTTP plumbing the relay and central share: a router
// whose every error is a problem document, JSON answers, health and readiness
// handlers, and a guard that no request is ever answered by omission.
//
// The rule it keeps: every request gets an answer its handler chose. A
// handler that returns without writing would make net/http send an empty
// 200, a promise nobody made; the guard turns that into a 500 and logs it.
package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/julienschmidt/httprouter"

	"github.com/spoolcast/spoolcast/internal/problem"
)

// NewRouter returns a router that answers unknown paths, wrong methods and
// handler panics with problem documents.
func NewRouter(log *slog.Logger) *httprouter.Router {
	router := httprouter.New()
	router.NotFound = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no route for "+r.URL.Path))
	})
	router.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, r, problem.New(http.StatusMethodNotAllowed, problem.MethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
	})
	router.PanicHandler = func(w http.ResponseWriter, r *http.Request, v any) {
		log.Error("handler panic", "path", r.URL.Path, "panic", v)
		problem.Write(w, r, problem.New(http.StatusInternalServerError, problem.InternalError, "the server failed to answer this request"))
	}
	return router
}

// WriteJSON answers status with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Healthz answers 200 while the process serves.
func Healthz(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readyz answers 200 while check returns nil within timeout, else 503 with
// check's error as the problem's detail and Retry-After.
func Readyz(timeout time.Duration, check func(ctx context.Context) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		if err := check(ctx); err != nil {
			w.Header().Set("Retry-After", "1")
			problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.NotReady, err.Error()))
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

// Recorder is a ResponseWriter that remembers the status sent, for metrics
// and for the Answered guard.
type Recorder struct {
	http.ResponseWriter
	Status int // 0 until a header or body is written
}

// WriteHeader records the first status.
func (w *Recorder) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200 for a body without a header.
func (w *Recorder) Write(p []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Hijack hands the connection over (a WebSocket upgrade) and records 101:
// the new owner answers on the connection itself.
func (w *Recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.Status == 0 {
		w.Status = http.StatusSwitchingProtocols
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the connection.
func (w *Recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Answered wraps h so that a request h returns from without writing gets a
// 500 problem, never net/http's implicit empty 200, and is logged.
func Answered(h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec, ok := w.(*Recorder)
		if !ok {
			rec = &Recorder{ResponseWriter: w}
		}
		h.ServeHTTP(rec, r)
		if rec.Status == 0 {
			log.Error("handler returned without an answer", "method", r.Method, "path", r.URL.Path)
			problem.Write(rec, r, problem.New(http.StatusInternalServerError, problem.InternalError, "the server failed to answer this request"))
		}
	})
}

// NewRegistry returns a metrics registry with the Go and process collectors:
// what /metrics serves by default.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
