package httpapi_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/httpapi"
)

func TestAHandlerThatWritesNothingIsA500NotAnEmpty200(t *testing.T) {
	t.Parallel()
	silent := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	w := httptest.NewRecorder()
	httpapi.Answered(silent, slog.New(slog.DiscardHandler)).ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/events", nil))
	if w.Code != http.StatusInternalServerError || w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(w.Body.String(), "internal-error") {
		t.Errorf("silent handler answered %d %q %q; want a 500 problem", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	w = httptest.NewRecorder()
	httpapi.Answered(ok, slog.New(slog.DiscardHandler)).ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", nil))
	if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Errorf("a handler's own 204 became %d %q", w.Code, w.Body)
	}
}

func TestReadyzSaysWhyNot(t *testing.T) {
	t.Parallel()
	h := httpapi.Readyz(time.Second, func(context.Context) error { return errors.New("the spool's disk is full") })
	w := httptest.NewRecorder()
	h(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "disk is full") || w.Header().Get("Retry-After") == "" {
		t.Errorf("readyz = %d %q; want 503 naming the reason", w.Code, w.Body)
	}
}
