package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// httpService is one HTTP server on one listener, with the life every
// long-running subcommand shares: serve in the background, wait for a signal or
// a failure, shut down gracefully.
type httpService struct {
	server *http.Server
	served chan error
}

func serveHTTP(ln net.Listener, h http.Handler, logger *slog.Logger) *httpService {
	return serveHTTPWith(ln, h, logger, defaultHTTPTimeouts)
}

// httpTimeouts bound what a slow or idle client may hold: a connection
// that sends its headers too slowly (slowloris), a request whose body does
// not arrive, an answer the client does not read, a kept-alive connection
// left idle. The write timeout is above the longest request a handler
// serves (a webhook replay's 2 minutes); a WebSocket stream, once
// upgraded, has deadlines of its own.
type httpTimeouts struct {
	header, read, write, idle time.Duration
}

var defaultHTTPTimeouts = httpTimeouts{header: 10 * time.Second, read: 30 * time.Second, write: 3 * time.Minute, idle: 2 * time.Minute}

func (t *httpTimeouts) register(fs *flag.FlagSet) {
	fs.DurationVar(&t.header, "read-header-timeout", defaultHTTPTimeouts.header, "longest a client may take to send a request's headers; past it the connection is closed (a slowloris holds nothing longer)")
	fs.DurationVar(&t.read, "read-timeout", defaultHTTPTimeouts.read, "longest a client may take to send a whole request, body included")
	fs.DurationVar(&t.write, "write-timeout", defaultHTTPTimeouts.write, "longest the server takes to send an answer, from the end of the request's headers; a client that stops reading holds its connection no longer (WebSocket streams are not bound by it)")
	fs.DurationVar(&t.idle, "idle-timeout", defaultHTTPTimeouts.idle, "how long a kept-alive connection may wait for its next request; keep it above the load balancer's own")
}

func (t httpTimeouts) validate() error {
	if t.header < 0 || t.read < 0 || t.write < 0 || t.idle < 0 {
		return errors.New("--read-header-timeout, --read-timeout, --write-timeout and --idle-timeout must not be negative (0 is the default)")
	}
	return nil
}

func serveHTTPWith(ln net.Listener, h http.Handler, logger *slog.Logger, t httpTimeouts) *httpService {
	s := &httpService{
		server: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: cmp.Or(t.header, defaultHTTPTimeouts.header),
			ReadTimeout:       cmp.Or(t.read, defaultHTTPTimeouts.read),
			WriteTimeout:      cmp.Or(t.write, defaultHTTPTimeouts.write),
			IdleTimeout:       cmp.Or(t.idle, defaultHTTPTimeouts.idle),
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
		served: make(chan error, 1),
	}
	go func() { s.served <- s.server.Serve(ln) }()
	return s
}

// wait returns nil when ctx is cancelled, or the error of a server that
// stopped on its own.
func (s *httpService) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.served:
		s.served <- err
		return fmt.Errorf("serve: %w", err)
	}
}

// stop stops accepting and waits for the requests in flight until ctx ends.
func (s *httpService) stop(ctx context.Context) error {
	err := s.server.Shutdown(ctx)
	if serr := <-s.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
