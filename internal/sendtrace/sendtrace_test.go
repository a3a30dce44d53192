package sendtrace

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"
)

func TestEachAttemptsProgressDecides(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps func(*httptrace.ClientTrace)
		want  bool
	}{
		{"no connection", func(*httptrace.ClientTrace) {}, false},
		{"a connection, the write not reported", func(c *httptrace.ClientTrace) { c.GotConn(httptrace.GotConnInfo{}) }, true},
		{"written whole", func(c *httptrace.ClientTrace) {
			c.GotConn(httptrace.GotConnInfo{})
			c.WroteRequest(httptrace.WroteRequestInfo{})
		}, true},
		{"the write failed", func(c *httptrace.ClientTrace) {
			c.GotConn(httptrace.GotConnInfo{})
			c.WroteRequest(httptrace.WroteRequestInfo{Err: errors.New("broken pipe")})
		}, false},
		{"a failed write, then another attempt in flight", func(c *httptrace.ClientTrace) {
			c.GotConn(httptrace.GotConnInfo{})
			c.WroteRequest(httptrace.WroteRequestInfo{Err: errors.New("broken pipe")})
			c.GotConn(httptrace.GotConnInfo{})
		}, true},
	} {
		ctx, tr := With(context.Background())
		tc.steps(httptrace.ContextClientTrace(ctx))
		if got := tr.MaybeReceived(); got != tc.want {
			t.Errorf("%s: maybe received %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestThroughTheTransport(t *testing.T) {
	// A port nobody listens on: never received.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	ctx, tr := With(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, closed, strings.NewReader("{}"))
	if _, err := http.DefaultClient.Do(req); err == nil || tr.MaybeReceived() {
		t.Errorf("a refused connection: err %v, maybe received %v; want an error, not received", err, tr.MaybeReceived())
	}

	// A server that reads the request and never answers: maybe received.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read whole, so that the server sees the client go away
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ctx, tr = With(ctx)
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	if _, err := http.DefaultClient.Do(req); err == nil || !tr.MaybeReceived() {
		t.Errorf("no answer after the write: err %v, maybe received %v; want an error, maybe received", err, tr.MaybeReceived())
	}
}
