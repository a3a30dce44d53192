package client_test

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/client"
)

// These tests put something other than a healthy relay at RelayURL: a
// server that answers for another key, one that stalls mid-answer, one that
// says it will never take the request, one with a certificate the client
// cannot verify. Each counts the requests it gets.

func misbehaving(t *testing.T, h http.HandlerFunc) (url string, requests *atomic.Int64) {
	t.Helper()
	requests = new(atomic.Int64)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		// Read the body as the relay does: only then does the server notice
		// the client going away and end the request's context.
		io.Copy(io.Discard, r.Body)
		h(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, requests
}

func TestAnAnswerForAnotherKeyIsNotASuccess(t *testing.T) {
	t.Parallel()
	url, requests := misbehaving(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"status":"duplicate","idempotency_key":"someone-else","received_at":"2026-11-30T09:00:00Z"}`))
	})
	c := newClient(t, client.Config{RelayURL: url})
	res, err := c.Emit(context.Background(), meeting("answer:mine", "t"))
	var status *client.StatusError
	if !errors.As(err, &status) || errors.Is(err, client.ErrGaveUp) || client.Rejected(err) {
		t.Fatalf("Emit = %+v, %v; want a StatusError, not retried, the event not rejected", res, err)
	}
	if got := requests.Load(); got != 1 {
		t.Errorf("the server received %d requests, want 1", got)
	}
}

func TestAStalledAnswerIsTheAttemptsTimeoutNotTheCallers(t *testing.T) {
	t.Parallel()
	url, requests := misbehaving(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the status, then nothing
	})
	c := newClient(t, client.Config{RelayURL: url, AttemptTimeout: 100 * time.Millisecond, MaxAttempts: 2,
		BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	_, err := c.Emit(context.Background(), meeting("answer:stalled", "t"))
	var timeout *client.AttemptTimeoutError
	if !errors.Is(err, client.ErrGaveUp) || !errors.As(err, &timeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Emit = %v; want a GaveUpError from attempt timeouts, not context.DeadlineExceeded", err)
	}
	if timeout.After != 100*time.Millisecond || !timeout.Timeout() {
		t.Errorf("timeout = %+v; want 100ms", timeout)
	}
	if got := requests.Load(); got != 2 {
		t.Errorf("the server received %d requests, want 2", got)
	}
}

func TestNoAttemptStartsWithTooLittleOfTheBudgetLeft(t *testing.T) {
	t.Parallel()
	url, requests := misbehaving(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	// The first attempt times out after 100ms, leaving 50ms: too little.
	c := newClient(t, client.Config{RelayURL: url, AttemptTimeout: 100 * time.Millisecond, MaxElapsed: 150 * time.Millisecond,
		BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	_, err := c.Emit(context.Background(), meeting("answer:budget", "t"))
	var gaveUp *client.GaveUpError
	if !errors.As(err, &gaveUp) || gaveUp.Attempts != 1 {
		t.Fatalf("Emit = %v; want a GaveUpError after one attempt", err)
	}
	if got := requests.Load(); got != 1 {
		t.Errorf("the server received %d requests, want 1", got)
	}
}

func TestAnswersThatNoRetryCuresAreReturnedAtOnce(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusNotImplemented, http.StatusHTTPVersionNotSupported} {
		url, requests := misbehaving(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) })
		c := newClient(t, client.Config{RelayURL: url, BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
		_, err := c.Emit(context.Background(), meeting("answer:never", "t"))
		var status *client.StatusError
		if !errors.As(err, &status) || status.StatusCode != code || status.Temporary() || errors.Is(err, client.ErrGaveUp) {
			t.Errorf("%d: Emit = %v; want a StatusError, not retried", code, err)
		}
		if got := requests.Load(); got != 1 {
			t.Errorf("%d: the server received %d requests, want 1", code, got)
		}
	}
}

func TestACertificateTheClientCannotVerifyIsNotRetried(t *testing.T) {
	t.Parallel()
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a request passed an unverified handshake")
	}))
	var handshakes atomic.Int64
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			handshakes.Add(1)
		}
	}
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	ts.StartTLS()
	t.Cleanup(ts.Close)
	c := newClient(t, client.Config{RelayURL: ts.URL, BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	_, err := c.Emit(context.Background(), meeting("answer:tls", "t"))
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) || errors.Is(err, client.ErrGaveUp) || client.Rejected(err) {
		t.Fatalf("Emit = %v; want the certificate error at once, the event not rejected", err)
	}
	if got := handshakes.Load(); got != 1 {
		t.Errorf("the server saw %d connections, want 1", got)
	}
}

func TestTheKeyTravelsInTheIdempotencyKeyHeaderWhenItFits(t *testing.T) {
	t.Parallel()
	headers := make(chan []string, 3)
	url, _ := misbehaving(t, func(w http.ResponseWriter, r *http.Request) {
		headers <- r.Header.Values("Idempotency-Key")
		w.WriteHeader(http.StatusBadRequest)
	})
	c := newClient(t, client.Config{RelayURL: url})
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"billing:invoice:42 paid", []string{"billing:invoice:42 paid"}},
		{"facture:42:payée", nil}, // not ASCII: the body alone carries it
		{`"quoted"`, nil},         // would be read as a quoted string
	} {
		c.Emit(context.Background(), meeting(tc.key, "t"))
		got := <-headers
		if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
			t.Errorf("key %q: Idempotency-Key %q, want %q", tc.key, got, tc.want)
		}
	}
}

func TestRejectedIsTrueOnlyForTheEventsOwnFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&client.InvalidEventError{Field: "title"}, true},
		{&client.ConflictError{IdempotencyKey: "k"}, true},
		{&client.UnauthorizedError{StatusCode: 401}, false},
		{&client.StatusError{StatusCode: 404}, false},
		{&client.GaveUpError{Last: &client.StatusError{StatusCode: 503}}, false},
		{errors.New("anything else"), false},
	} {
		if got := client.Rejected(tc.err); got != tc.want {
			t.Errorf("Rejected(%T) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
