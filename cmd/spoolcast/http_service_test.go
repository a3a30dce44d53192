package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// A client that sends a request and never reads the answer holds its
// connection, and the handler writing to it, no longer than
// --write-timeout.
func TestAClientThatDoesNotReadIsCutOffAtTheWriteTimeout(t *testing.T) {
	t.Parallel()
	writing := make(chan struct{})
	failed := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(writing)
		buf := make([]byte, 64<<10)
		for range 1024 { // 64 MiB, more than any socket buffer holds
			if _, err := w.Write(buf); err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveHTTPWith(ln, h, slog.New(slog.DiscardHandler), httpTimeouts{write: time.Second})
	t.Cleanup(func() { srv.server.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: central\r\n\r\n")
	<-writing
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("64 MiB were written to a client that reads nothing")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the handler still writes to a client that reads nothing, 15 s after the request (--write-timeout 1s)")
	}
}
