package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

// status sends a request and returns the answer's status and body.
func status(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(body)
}

// With --ops-listen, the public address serves only the public API and the
// ops address only the probes, the metrics and the internal ingress.
func TestOpsListenSeparatesThePublicAPIFromProbesMetricsAndInternal(t *testing.T) {
	t.Parallel()
	ops := proctest.FreeAddr(t)
	base, iss := startCentralProcess(t, pgtest.DB(t), "--ops-listen", ops)
	opsBase := "http://" + ops
	token := iss.Token("u1")
	// Live first, ready once the stream's reader has read Postgres.
	testsignal.Eventually(t, "central to be ready", 10*time.Second, func() bool {
		got, _ := status(t, http.MethodGet, opsBase+"/readyz", "")
		return got == http.StatusOK
	})
	for _, tc := range []struct {
		base, method, path string
		want               int
	}{
		{base, http.MethodGet, "/v1/notifications", http.StatusOK},
		{base, http.MethodGet, "/openapi.yaml", http.StatusOK},
		{base, http.MethodGet, "/metrics", http.StatusNotFound},
		{base, http.MethodGet, "/healthz", http.StatusNotFound},
		{base, http.MethodGet, "/readyz", http.StatusNotFound},
		{base, http.MethodPost, "/internal/v1/events", http.StatusNotFound},
		{opsBase, http.MethodGet, "/metrics", http.StatusOK},
		{opsBase, http.MethodGet, "/healthz", http.StatusOK},
		{opsBase, http.MethodGet, "/readyz", http.StatusOK},
		{opsBase, http.MethodPost, "/internal/v1/events", http.StatusUnauthorized},
		{opsBase, http.MethodGet, "/v1/notifications", http.StatusNotFound},
		{opsBase, http.MethodGet, "/debug/pprof/", http.StatusNotFound},
	} {
		if got, body := status(t, tc.method, tc.base+tc.path, token); got != tc.want {
			t.Errorf("%s %s%s = %d %s; want %d", tc.method, tc.base, tc.path, got, body, tc.want)
		}
	}
	// A newcomer at the public address's root is told where things are.
	if got, body := status(t, http.MethodGet, base+"/", ""); got != http.StatusNotFound || !strings.Contains(body, "/inbox") || !strings.Contains(body, "/v1/notifications") {
		t.Errorf("GET / on the public address = %d %s; want a 404 naming /v1/notifications and /inbox", got, body)
	}
}

// closedWithin reports whether the server closes conn within d.
func closedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	r := bufio.NewReader(conn)
	for {
		if _, err := r.ReadByte(); err != nil {
			ne, ok := err.(net.Error)
			return !ok || !ne.Timeout()
		}
	}
}

// Slow clients hold nothing: headers trickled in (slowloris), a body that
// does not arrive, and a kept-alive connection left idle are each closed
// after their timeout.
func TestCentralClosesSlowAndIdleConnections(t *testing.T) {
	t.Parallel()
	base, _ := startCentralProcess(t, pgtest.DB(t), "--read-header-timeout", "1s", "--read-timeout", "2s", "--idle-timeout", "1s")
	addr := strings.TrimPrefix(base, "http://")
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	slowloris := dial()
	fmt.Fprintf(slowloris, "GET /v1/notifications HTTP/1.1\r\nHost: central\r\n")
	done := make(chan bool, 1)
	go func() { done <- closedWithin(slowloris, 10*time.Second) }()
	for i := 0; ; i++ { // a header byte every 200 ms, never the blank line
		select {
		case closed := <-done:
			if !closed {
				t.Error("a client trickling its headers was not disconnected within 10 s (--read-header-timeout 1s)")
			}
			goto body
		case <-time.After(200 * time.Millisecond):
			_, _ = fmt.Fprintf(slowloris, "X-%d: y\r\n", i)
		}
	}
body:
	slowBody := dial()
	fmt.Fprintf(slowBody, "PUT /v1/devices HTTP/1.1\r\nHost: central\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	if !closedWithin(slowBody, 10*time.Second) {
		t.Error("a request whose body never arrives held its connection past 10 s (--read-timeout 2s)")
	}

	idle := dial()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: central\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	if !closedWithin(idle, 10*time.Second) {
		t.Error("an idle kept-alive connection was not closed within 10 s (--idle-timeout 1s)")
	}
}
